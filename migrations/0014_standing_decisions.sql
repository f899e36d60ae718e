-- The approvals inbox's decided lists (status approved, rejected, expired) read each call's
-- standing decision: its rejection, which is final, or else its latest approval. Finding it
-- among all of a tenant's approvals grew with history; `latest` marks it instead. /approve
-- clears it on the call's earlier decisions, under the call's lock, as it stores a new one.
-- Nothing is stored after a rejection, so the latest decision is always the standing one.
ALTER TABLE approvals ADD COLUMN latest boolean NOT NULL DEFAULT false;
UPDATE approvals SET latest = true
WHERE id IN (
    SELECT DISTINCT ON (call_id) id FROM approvals
    ORDER BY call_id, decision = 'reject' DESC, created_at DESC, id DESC
);

-- One index per kind of standing decision, in the inbox's order (newest first, then call):
-- each status reads a page of one, or for `approved` merges two. Unused approvals are live
-- or expired by the clock; the live ones are few (an approval lives for its tool's ttl_s),
-- so `expired` skips only those.
CREATE INDEX approvals_rejected ON approvals (tenant, created_at, call_id)
    WHERE latest AND decision = 'reject';
CREATE INDEX approvals_used ON approvals (tenant, created_at, call_id)
    WHERE latest AND decision = 'approve' AND consumed_by IS NOT NULL;
CREATE INDEX approvals_unused ON approvals (tenant, created_at, call_id)
    WHERE latest AND decision = 'approve' AND consumed_by IS NULL;
