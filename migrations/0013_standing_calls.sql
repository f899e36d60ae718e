-- Calls that wait for an approval or hold one, by actor and fingerprint: a later identical
-- request (an MCP client calling the same tool with the same arguments again) finds the
-- call it continues instead of asking for another approval.
CREATE INDEX calls_standing ON calls (tenant, actor, fingerprint)
    WHERE state IN ('awaiting_approval', 'approved');
