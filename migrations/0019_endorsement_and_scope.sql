-- Endorsement (x-endorsed arguments) and run scopes.
--
-- Known values: per tenant and kind, the values an approver or an admin vouched for. Each is
-- kept as the digest of its kind and normalized form, which is what a call's value is
-- looked up by; `value` is the value as given, for listings, or NULL for a sensitive
-- argument's (a password is endorsed without being kept).
CREATE TABLE known_values (
    tenant   text NOT NULL,
    kind     text NOT NULL,
    digest   text NOT NULL,
    value    text,
    added_by text NOT NULL,
    added_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, kind, digest)
);

-- A run's task as words (judged against without normalizing it again on every call), its
-- scope (the tools it may call, and what a call of another does), and the trusted results
-- it was given, as words (one text per result, bounded per run; purged with the run's
-- memory).
ALTER TABLE runs
    ADD COLUMN task_words    text,
    ADD COLUMN scope_tools   text[],
    ADD COLUMN scope_outside text;
ALTER TABLE run_memory
    ADD COLUMN trusted       text[] NOT NULL DEFAULT '{}',
    ADD COLUMN trusted_chars integer NOT NULL DEFAULT 0;

-- What the proposal found of each x-endorsed argument: [{argument, source, endorsed,
-- reason?}], shown to approvers with the call.
ALTER TABLE calls ADD COLUMN endorsement jsonb;

-- Known values are audited as they are added and removed.
ALTER TABLE audit_events DROP CONSTRAINT audit_events_event_check;
ALTER TABLE audit_events ADD CONSTRAINT audit_events_event_check CHECK (event IN (
    'proposed', 'denied', 'dry_run', 'approved', 'rejected', 'executed', 'replayed', 'failed',
    'reconciled', 'expired', 'remembered', 'forgotten'));
