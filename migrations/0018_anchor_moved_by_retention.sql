-- The start of the audit chain (audit_anchor) is moved by audit retention only.
--
-- Retention states, in the transaction that moves the anchor, the horizon it removes rows
-- under (SET LOCAL toolgate.audit_retention_days), records it with the anchor, and signs the
-- anchor with the audit signing key when it has one (key_id, signature over chain_pos,
-- hash, at, outside_gaps and retention_days). The database refuses any other move: without
-- that setting, over rows younger than the horizon, or backwards; and it never deletes the
-- anchor. A writer who can change triggers can still get past this; what catches them is
-- verify: an anchor that the signing key does not vouch for, or a published checkpoint of a
-- removed position that no retention allowed, is a broken chain.
ALTER TABLE audit_anchor
    ADD COLUMN retention_days integer,
    ADD COLUMN key_id text,
    ADD COLUMN signature text;

CREATE FUNCTION audit_anchor_moved_by_retention() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    days integer;
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'audit_anchor: the start of the audit chain is never reset'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    BEGIN
        days := nullif(current_setting('toolgate.audit_retention_days', true), '')::integer;
    EXCEPTION WHEN invalid_text_representation OR numeric_value_out_of_range THEN
        days := NULL;
    END;
    IF days IS NULL OR days < 1 OR NEW.retention_days IS DISTINCT FROM days
            OR NEW.at >= now() - make_interval(days => days) THEN
        RAISE EXCEPTION 'audit_anchor: only audit retention moves the start of the chain, '
            'and only over rows older than its horizon'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.chain_pos < OLD.chain_pos THEN
        RAISE EXCEPTION 'audit_anchor: the start of the audit chain never moves back'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER audit_anchor_moved_by_retention
    BEFORE INSERT OR UPDATE OR DELETE ON audit_anchor
    FOR EACH ROW EXECUTE FUNCTION audit_anchor_moved_by_retention();
