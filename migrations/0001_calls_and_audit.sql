-- Calls: one row per proposed or executed tool call, allowed or denied.
CREATE TABLE calls (
    id             text PRIMARY KEY,
    tenant         text NOT NULL,
    actor          text NOT NULL,
    tool           text NOT NULL,
    run_id         text,
    tool_call_id   text,
    arguments      jsonb,
    fingerprint    text,
    target_type    text,
    target_id      text,
    mutation       boolean,
    impact         text CHECK (impact IN ('read', 'low', 'high')),
    decision       text NOT NULL CHECK (decision IN ('allow', 'deny')),
    code           text,
    reason         text,
    next           text CHECK (next IN ('execute', 'dry_run', 'approval')),
    state          text NOT NULL,
    policy_version text NOT NULL,
    proposed_by    text NOT NULL,
    authorized_by  jsonb,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX calls_by_actor ON calls (tenant, actor, created_at);
CREATE INDEX calls_by_run ON calls (run_id) WHERE run_id IS NOT NULL;

-- Audit trail: append-only, one row per decision or outcome, written in the same
-- transaction as the state change it describes.
CREATE TABLE audit_events (
    seq            bigserial PRIMARY KEY,
    at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    event          text NOT NULL CHECK (event IN ('proposed', 'denied', 'dry_run', 'approved',
                       'rejected', 'executed', 'replayed', 'failed', 'reconciled', 'expired')),
    call_id        text,
    run_id         text,
    tenant         text NOT NULL,
    actor          text NOT NULL,
    tool           text,
    target         jsonb,
    fingerprint    text,
    arguments      jsonb,
    decision       text,
    code           text,
    reason         text,
    policy_version text,
    approval_id    text,
    proposed_by    text,
    authorized_by  jsonb,
    outcome        jsonb,
    total_ms       double precision,
    provider_ms    double precision
);
CREATE INDEX audit_by_tenant ON audit_events (tenant, seq);
CREATE INDEX audit_by_call ON audit_events (call_id) WHERE call_id IS NOT NULL;
