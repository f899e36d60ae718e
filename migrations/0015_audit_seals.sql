-- Audit rows become insert-only: the chain moves to a table of its own.
-- Sealing used to UPDATE every audit row once. As chain_pos was indexed, that update was
-- never HOT: it rewrote the row and every index entry of audit_events and left a dead
-- version behind, work the database did again for every request. Now the sealer INSERTs
-- one audit_seals row per sealed audit row (app/audit/sealer.py), and readers join the two
-- on (seq, at) (app/audit/store.py). A seal carries its row's `at` so that both tables can
-- be split by time alike (a later migration) and a join finds a row's seal there.
CREATE TABLE audit_seals (
    seq       bigint PRIMARY KEY,
    at        timestamptz NOT NULL,
    chain_pos bigint NOT NULL UNIQUE,
    prev_hash text NOT NULL,
    hash      text NOT NULL,
    sealed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Sealed rows keep their chain, as it was hashed.
INSERT INTO audit_seals (seq, at, chain_pos, prev_hash, hash, sealed_at)
SELECT seq, at, chain_pos, prev_hash, hash, sealed_at FROM audit_events
WHERE chain_pos IS NOT NULL;

DROP TRIGGER audit_events_refuse_sealed_inserts ON audit_events;
DROP TRIGGER audit_events_append_only ON audit_events;
DROP TRIGGER audit_events_removed_from_start ON audit_events;
DROP FUNCTION audit_events_append_only();
DROP FUNCTION audit_events_removed_from_start();
ALTER TABLE audit_events
    DROP COLUMN chain_pos,
    DROP COLUMN prev_hash,
    DROP COLUMN hash,
    DROP COLUMN sealed_at;

-- Both tables insert-only, enforced here rather than trusted to the application: no UPDATE
-- at all, and DELETE only of what retention removes from the start of the chain (the
-- anchor moves first, in the same transaction; an audit row goes before its seal). Row
-- level, so TRUNCATE (owner-only; tests use it between cases) is not affected.
CREATE FUNCTION audit_refuse_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is insert-only: UPDATE of seq % refused', TG_TABLE_NAME, OLD.seq
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE FUNCTION audit_events_removed_from_start() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM audit_seals s WHERE s.seq = OLD.seq AND s.at = OLD.at
               AND s.chain_pos <= (SELECT chain_pos FROM audit_anchor)) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is insert-only: DELETE of seq % refused', TG_TABLE_NAME, OLD.seq
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE FUNCTION audit_seals_removed_from_start() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.chain_pos <= (SELECT chain_pos FROM audit_anchor) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is insert-only: DELETE of seq % refused', TG_TABLE_NAME, OLD.seq
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

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
