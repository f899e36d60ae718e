-- The audit trail split by time: audit_events and audit_seals are partitioned by calendar
-- month (UTC) of `at`, with the same bounds, so that retention removes a month by dropping
-- its two partitions instead of deleting its rows one by one (app/audit/archive.py), after
-- writing its stretch of the chain to an archive file when one is configured. A seal
-- carries its row's `at`, so a row and its seal are always in the same month.
--
-- Month partitions are made ahead, by this migration and by the purger's pass (the current
-- month and the next two), with audit_partitions(month). A row whose month has no partition
-- lands in the DEFAULT one, a safety net that retention never drops as a month.

CREATE FUNCTION audit_partitions(month date) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    first date := date_trunc('month', month)::date;
    suffix text := to_char(first, 'YYYY_MM');
    bounds text := format('FOR VALUES FROM (%L) TO (%L)', first || ' 00:00:00+00',
                          (first + interval '1 month')::date || ' 00:00:00+00');
    created boolean := false;
BEGIN
    -- Checked first: CREATE TABLE ... PARTITION OF locks the parent even when the
    -- partition exists, and this runs on every purger pass.
    IF to_regclass('audit_events_' || suffix) IS NULL THEN
        EXECUTE format('CREATE TABLE audit_events_%s PARTITION OF audit_events %s',
                       suffix, bounds);
        created := true;
    END IF;
    IF to_regclass('audit_seals_' || suffix) IS NULL THEN
        EXECUTE format('CREATE TABLE audit_seals_%s PARTITION OF audit_seals %s',
                       suffix, bounds);
        created := true;
    END IF;
    RETURN created;
END;
$$;

ALTER TABLE audit_events RENAME TO audit_events_unpartitioned;
ALTER TABLE audit_seals RENAME TO audit_seals_unpartitioned;

-- Same columns, defaults and checks; the primary keys hold the partition key too.
CREATE TABLE audit_events (LIKE audit_events_unpartitioned INCLUDING DEFAULTS
    INCLUDING CONSTRAINTS, CONSTRAINT audit_events_seq_at PRIMARY KEY (seq, at))
    PARTITION BY RANGE (at);
ALTER SEQUENCE audit_events_seq_seq OWNED BY audit_events.seq;
CREATE TABLE audit_seals (LIKE audit_seals_unpartitioned INCLUDING DEFAULTS
    INCLUDING CONSTRAINTS, CONSTRAINT audit_seals_seq_at PRIMARY KEY (seq, at))
    PARTITION BY RANGE (at);
CREATE TABLE audit_events_default PARTITION OF audit_events DEFAULT;
CREATE TABLE audit_seals_default PARTITION OF audit_seals DEFAULT;

SELECT audit_partitions(month::date) FROM generate_series(
    date_trunc('month', least(
        (SELECT min(at) FROM audit_events_unpartitioned), now()) AT TIME ZONE 'UTC'),
    date_trunc('month', now() AT TIME ZONE 'UTC') + interval '2 months',
    interval '1 month') AS month;

INSERT INTO audit_events SELECT * FROM audit_events_unpartitioned;
INSERT INTO audit_seals SELECT * FROM audit_seals_unpartitioned;
DROP TABLE audit_events_unpartitioned, audit_seals_unpartitioned;

-- The indexes of 0001, 0003 and 0011, and the seals' chain order: not unique, as a unique
-- index of a partitioned table must hold the partition key (verify finds a repeated
-- position as a break in the chain).
CREATE INDEX audit_by_tenant ON audit_events (tenant, seq);
CREATE INDEX audit_by_call ON audit_events (call_id) WHERE call_id IS NOT NULL;
CREATE INDEX audit_by_run ON audit_events (run_id) WHERE run_id IS NOT NULL;
CREATE INDEX audit_by_event ON audit_events (event, tenant, seq);
CREATE INDEX audit_by_actor ON audit_events (tenant, actor, seq);
CREATE INDEX audit_by_time ON audit_events (at, seq);
CREATE INDEX audit_seals_by_pos ON audit_seals (chain_pos);

-- The insert-only rules of 0015, on every partition.
CREATE TRIGGER audit_events_insert_only
    BEFORE UPDATE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_update();
CREATE TRIGGER audit_events_removed_from_start
    BEFORE DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_removed_from_start();
CREATE TRIGGER audit_seals_insert_only
    BEFORE UPDATE ON audit_seals
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_update();
CREATE TRIGGER audit_seals_removed_from_start
    BEFORE DELETE ON audit_seals
    FOR EACH ROW EXECUTE FUNCTION audit_seals_removed_from_start();

-- Months removed after their stretch of the chain was written to an archive file
-- (TOOLGATE_AUDIT_ARCHIVE_DIR), recorded in the transaction that drops them: the file,
-- the chain positions it holds, the hash before its first row and its last row's hash, how
-- many rows and the file's SHA-256. `toolgate audit verify --archive DIR` checks the files
-- against these rows and the chain's anchor. Kept for good: no update, no delete.
CREATE TABLE audit_archives (
    file        text PRIMARY KEY,
    month       date NOT NULL,
    first_pos   bigint NOT NULL,
    last_pos    bigint NOT NULL CHECK (last_pos >= first_pos),
    prev_hash   text NOT NULL,
    last_hash   text NOT NULL,
    rows        bigint NOT NULL,
    sha256      text NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION audit_archives_kept() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_archives is insert-only: % of % refused', TG_OP, OLD.file
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER audit_archives_kept
    BEFORE UPDATE OR DELETE ON audit_archives
    FOR EACH ROW EXECUTE FUNCTION audit_archives_kept();
