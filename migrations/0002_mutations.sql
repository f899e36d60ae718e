-- Dry-runs: the provider's preview of a call, as a human will see it.
CREATE TABLE dry_runs (
    id             text PRIMARY KEY,
    call_id        text NOT NULL REFERENCES calls (id),
    tenant         text NOT NULL,
    actor          text NOT NULL,
    tool           text NOT NULL,
    fingerprint    text NOT NULL,
    policy_version text NOT NULL,
    snapshot       jsonb,
    snapshot_hash  text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL
);
CREATE INDEX dry_runs_by_call ON dry_runs (call_id, created_at DESC);
CREATE INDEX dry_runs_by_fingerprint ON dry_runs (tenant, actor, fingerprint, created_at DESC);

-- Approvals: a human's decision, bound to exactly what was previewed; single-use.
CREATE TABLE approvals (
    id             text PRIMARY KEY,
    call_id        text NOT NULL REFERENCES calls (id),
    decision       text NOT NULL CHECK (decision IN ('approve', 'reject')),
    approver       text NOT NULL,
    comment        text,
    actor          text NOT NULL,
    tenant         text NOT NULL,
    tool           text NOT NULL,
    target_type    text,
    target_id      text,
    policy_version text NOT NULL,
    fingerprint    text NOT NULL,
    snapshot_hash  text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    consumed_by    text,
    consumed_at    timestamptz
);
CREATE INDEX approvals_by_call ON approvals (call_id, created_at DESC);

-- Executions: one record per (tenant, actor, Idempotency-Key); the unique claim is what
-- makes a mutation run at most once, and the stored response is what replays return.
CREATE TABLE executions (
    operation_id    text PRIMARY KEY,
    tenant          text NOT NULL,
    actor           text NOT NULL,
    idempotency_key text NOT NULL,
    call_id         text NOT NULL REFERENCES calls (id),
    tool            text NOT NULL,
    target_type     text,
    target_id       text,
    fingerprint     text NOT NULL,
    approval_id     text,
    state           text NOT NULL CHECK (state IN ('in_flight', 'succeeded', 'failed', 'unknown')),
    provider_status integer,
    response        jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    UNIQUE (tenant, actor, idempotency_key)
);
CREATE INDEX executions_by_call ON executions (call_id);
CREATE INDEX executions_expiry ON executions (expires_at) WHERE state IN ('succeeded', 'failed');
