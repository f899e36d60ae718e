-- Audit chain: every audit row is sealed, after it commits, into one hash chain in sealing
-- order. Request paths only INSERT; the sealer (app/audit/sealer.py) sets the chain columns
-- once. The database refuses every other change to an audit row.
ALTER TABLE audit_events
    ADD COLUMN chain_pos bigint UNIQUE,
    ADD COLUMN prev_hash text,
    ADD COLUMN hash      text,
    ADD COLUMN sealed_at timestamptz;
CREATE INDEX audit_unsealed ON audit_events (seq) WHERE hash IS NULL;
CREATE INDEX audit_by_run ON audit_events (run_id) WHERE run_id IS NOT NULL;

-- The chain head, written by the sealer in the transaction that extends the chain: the last
-- position and hash (so verify notices sealed rows cut off the end) and `sealed_through`,
-- the seq up to which every row is sealed or recorded as skipped. One row, or none before
-- the first seal.
CREATE TABLE audit_chain (
    id             boolean PRIMARY KEY DEFAULT true CHECK (id),
    chain_pos      bigint NOT NULL,
    hash           text NOT NULL,
    sealed_through bigint NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Seqs the sealer passed over: taken by a transaction that rolled back (or had not committed
-- within the grace period). A skipped seq whose row commits later is sealed at the end of the
-- chain then; verify reports how many seqs were skipped.
CREATE TABLE audit_gaps (
    first_seq  bigint PRIMARY KEY,
    last_seq   bigint NOT NULL CHECK (last_seq >= first_seq),
    after_pos  bigint NOT NULL,
    skipped_at timestamptz NOT NULL DEFAULT now()
);

-- Append-only, enforced here rather than trusted to the application: no DELETE, no INSERT of
-- a pre-sealed row, and the only UPDATE is sealing (the chain columns, set once from NULL,
-- nothing else touched). Row-level, so TRUNCATE (owner-only; tests use it between cases) is
-- not affected; the service's database role should not be granted TRUNCATE in production.
CREATE FUNCTION audit_events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    chain text[] := ARRAY['chain_pos', 'prev_hash', 'hash', 'sealed_at'];
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'audit_events is append-only: DELETE of seq % refused', OLD.seq
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF NEW.chain_pos IS NOT NULL OR NEW.prev_hash IS NOT NULL OR NEW.hash IS NOT NULL
           OR NEW.sealed_at IS NOT NULL THEN
            RAISE EXCEPTION 'audit_events: a row is inserted unsealed'
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        RETURN NEW;
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
    IF (to_jsonb(NEW) - chain) IS DISTINCT FROM (to_jsonb(OLD) - chain) THEN
        RAISE EXCEPTION 'audit_events is append-only: UPDATE of seq % refused', OLD.seq
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER audit_events_append_only
    BEFORE INSERT OR UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_append_only();
