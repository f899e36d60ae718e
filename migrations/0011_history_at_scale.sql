-- History at scale: every read an operator makes finds its rows through an index that
-- matches it, the sealer never walks what it already sealed, and old history can be
-- removed in small batches (app/retention.py) without breaking the audit chain.

-- GET /audit filters (docs/api.md): each documented filter, alone or beside the tenant an
-- auditor is confined to, walks an index in seq order and stops after a page, or reads the
-- few rows of a rare value through one. Time windows (since/until) become a seq range
-- through audit_by_time (app/audit/store.py). A tool is one of a catalog's few: a tenant's
-- rows in seq order (audit_by_tenant) meet a page of any tool soon enough. Every index here
-- is written twice per row (insert, then seal), so there are no more than these.
CREATE INDEX audit_by_event ON audit_events (event, tenant, seq);
CREATE INDEX audit_by_actor ON audit_events (tenant, actor, seq);
CREATE INDEX audit_by_time ON audit_events (at, seq);

-- The sealer finds new rows above the chain head's sealed_through through the primary
-- key, and late rows inside recorded gaps; a partial index of unsealed rows kept one dead
-- entry per sealed row until the next VACUUM, and every pass walked them all.
DROP INDEX audit_unsealed;
CREATE INDEX audit_gaps_recent ON audit_gaps (skipped_at);

-- Retention of the audit trail: rows are removed from the start of the chain only, and the
-- chain's new start is recorded here, in the transaction that removes them, so verify walks
-- from it instead of from the genesis hash. One row, or none before the first removal.
-- `chain_pos`/`hash`: the last removed row; `at`: its time; `outside_gaps`: how many removed
-- rows held seqs outside any recorded gap (verify's accounting of seqs needs it).
CREATE TABLE audit_anchor (
    id           boolean PRIMARY KEY DEFAULT true CHECK (id),
    chain_pos    bigint NOT NULL,
    hash         text NOT NULL,
    at           timestamptz NOT NULL,
    outside_gaps bigint NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- Append-only as before, except that a sealed row the anchor already covers may be
-- deleted: retention moves the anchor first, then deletes up to it, in one transaction.
-- Updates stay with the function of 0005; deletes get their own.
CREATE FUNCTION audit_events_removed_from_start() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.chain_pos IS NOT NULL AND OLD.chain_pos <= (SELECT chain_pos FROM audit_anchor) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit_events is append-only: DELETE of seq % refused', OLD.seq
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

DROP TRIGGER audit_events_append_only ON audit_events;
CREATE TRIGGER audit_events_append_only
    BEFORE UPDATE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_append_only();
CREATE TRIGGER audit_events_removed_from_start
    BEFORE DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_removed_from_start();

-- The approvals inbox: a call is pending until `pending_until` (its latest preview's
-- expiry, or for a tool without a preview its proposal plus the approval's ttl_s), so a call
-- nobody decided leaves the inbox when its approval window passes, and the inbox reads only
-- the calls still inside their window.
ALTER TABLE calls ADD COLUMN pending_until timestamptz;
UPDATE calls c SET pending_until = coalesce(
    (SELECT max(d.expires_at) FROM dry_runs d WHERE d.call_id = c.id),
    c.created_at + interval '300 seconds')
WHERE c.state = 'awaiting_approval';
CREATE INDEX calls_pending ON calls (tenant, pending_until) WHERE state = 'awaiting_approval';

-- Retention walks each table from its oldest rows (dry-runs and approvals go with their call).
CREATE INDEX calls_by_time ON calls (created_at);
CREATE INDEX runs_by_time ON runs (created_at);
CREATE INDEX webhook_outbox_delivered ON webhook_outbox (delivered_at)
    WHERE delivered_at IS NOT NULL;
