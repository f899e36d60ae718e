-- The inbox's decided lists keep only what the approver may decide: others' calls of some
-- tools, their own calls of others (`policy.Decidable`). Walking one index of a kind for the
-- whole tenant read until it held a page of those, which was the whole index for an approver
-- whose tools are rare among the tenant's decisions. These indexes let the list read a page
-- per tool instead: others' calls through the index by tool (skipping only the approver's own
-- calls of that tool), their own through the index by actor. Same kinds as 0014.
CREATE INDEX approvals_rejected_by_tool ON approvals (tenant, tool, created_at, call_id)
    WHERE latest AND decision = 'reject';
CREATE INDEX approvals_rejected_by_actor ON approvals (tenant, actor, tool, created_at, call_id)
    WHERE latest AND decision = 'reject';
CREATE INDEX approvals_used_by_tool ON approvals (tenant, tool, created_at, call_id)
    WHERE latest AND decision = 'approve' AND consumed_by IS NOT NULL;
CREATE INDEX approvals_used_by_actor ON approvals (tenant, actor, tool, created_at, call_id)
    WHERE latest AND decision = 'approve' AND consumed_by IS NOT NULL;
CREATE INDEX approvals_unused_by_tool ON approvals (tenant, tool, created_at, call_id)
    WHERE latest AND decision = 'approve' AND consumed_by IS NULL;
CREATE INDEX approvals_unused_by_actor ON approvals (tenant, actor, tool, created_at, call_id)
    WHERE latest AND decision = 'approve' AND consumed_by IS NULL;

-- Unused approvals still live: read by expiry, like pending calls, so the approved list reads
-- only those inside their window. Walking unused approvals newest first for them, as before,
-- read every expired one when fewer than a page were live.
CREATE INDEX approvals_live ON approvals (tenant, expires_at)
    WHERE latest AND decision = 'approve' AND consumed_by IS NULL;

-- 0014's indexes served only the decided lists, which no longer read them.
DROP INDEX approvals_rejected, approvals_used, approvals_unused;
