-- The append-only rules of 0003, enforced for less: every audit row is inserted once and
-- sealed once, so both paths are hot.
-- * INSERT: the function runs only when the trigger's WHEN clause finds a chain column set
--   (the refusal); an ordinary insert no longer enters PL/pgSQL at all.
-- * UPDATE: "nothing but the chain columns changed" compares the new row, with the old chain
--   columns put back, to the old row as composite values, instead of turning both rows into
--   jsonb. Same rule, for any column added later too.
CREATE OR REPLACE FUNCTION audit_events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    unchained audit_events;
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'audit_events is append-only: DELETE of seq % refused', OLD.seq
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_OP = 'INSERT' THEN
        RAISE EXCEPTION 'audit_events: a row is inserted unsealed'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF OLD.chain_pos IS NOT NULL OR OLD.prev_hash IS NOT NULL OR OLD.hash IS NOT NULL
       OR OLD.sealed_at IS NOT NULL THEN
        RAISE EXCEPTION 'audit_events is append-only: seq % is already sealed', OLD.seq
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.chain_pos IS NULL OR NEW.prev_hash IS NULL OR NEW.hash IS NULL
       OR NEW.sealed_at IS NULL THEN
        RAISE EXCEPTION 'audit_events: sealing sets every chain column'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    unchained := NEW;
    unchained.chain_pos := OLD.chain_pos;
    unchained.prev_hash := OLD.prev_hash;
    unchained.hash := OLD.hash;
    unchained.sealed_at := OLD.sealed_at;
    IF unchained IS DISTINCT FROM OLD THEN
        RAISE EXCEPTION 'audit_events is append-only: UPDATE of seq % refused', OLD.seq
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;

DROP TRIGGER audit_events_append_only ON audit_events;

CREATE TRIGGER audit_events_refuse_sealed_inserts
    BEFORE INSERT ON audit_events
    FOR EACH ROW
    WHEN (NEW.chain_pos IS NOT NULL OR NEW.prev_hash IS NOT NULL OR NEW.hash IS NOT NULL
          OR NEW.sealed_at IS NOT NULL)
    EXECUTE FUNCTION audit_events_append_only();

CREATE TRIGGER audit_events_append_only
    BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_append_only();
