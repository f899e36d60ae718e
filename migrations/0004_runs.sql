-- Runs: an agent loop's budget. Counters move only through conditional updates, so parallel
-- calls can never overspend a limit.
CREATE TABLE runs (
    id           text PRIMARY KEY,
    tenant       text NOT NULL,
    actor        text NOT NULL,
    task         text,
    status       text NOT NULL CHECK (status IN ('active', 'completed', 'needs_clarification',
                     'handed_off', 'failed')),
    recoverable  boolean,
    reason       text,
    limit_name   text,
    max_calls    integer NOT NULL,
    max_seconds  integer NOT NULL,
    max_cost     double precision NOT NULL,
    max_repeats  integer NOT NULL,
    max_failures integer NOT NULL,
    calls        integer NOT NULL DEFAULT 0,
    cost         double precision NOT NULL DEFAULT 0,
    failures     integer NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);
CREATE INDEX runs_by_actor ON runs (tenant, actor, created_at);

-- How often one fingerprint failed or came back empty within a run.
CREATE TABLE run_repeats (
    run_id      text NOT NULL REFERENCES runs (id),
    fingerprint text NOT NULL,
    count       integer NOT NULL,
    PRIMARY KEY (run_id, fingerprint)
);
