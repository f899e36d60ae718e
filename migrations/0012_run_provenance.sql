-- Provenance (app/runs/provenance.py): what a run was told by untrusted results, so that an
-- argument copied from one can be recognised later, by any instance.
--
-- A run remembers each string of a result as the 8-character windows of its normalized form,
-- one row per distinct window, with the call whose result held it first. Looking up a call's
-- arguments is one index probe per window of the arguments, however much the run read. The
-- rows of a run go once the run has ended or outlived its max_seconds (the purge task).
-- No foreign key to runs: the rows are written in bulk, and a row without its run is inert.
CREATE TABLE run_windows (
    run_id         text NOT NULL,
    window_id      bigint NOT NULL,
    source_call_id text NOT NULL,
    PRIMARY KEY (run_id, window_id)
);

-- One row per run that has remembered anything: how many windows it holds (bounded), and,
-- once a result did not fit, the call whose result was not remembered. From then on every
-- judged argument of the run counts as tainted (fail closed, never silently forgetting).
CREATE TABLE run_memory (
    run_id          text PRIMARY KEY,
    windows         integer NOT NULL DEFAULT 0,
    forgotten_after text
);

-- What the proposal found: [{argument, source_call_id}], shown to approvers with the call.
ALTER TABLE calls ADD COLUMN taint jsonb;
