-- A call is decided once: a rejection is final, and a call holds at most one live approval
-- (approved, unexpired, unconsumed). "Live" depends on the clock, which no index can
-- express, so /approve decides under a row lock on the call; a rejection is one row per
-- call, and the database holds that here.
--
-- Before this migration a call could collect several rejections. The first one decided
-- the call; later ones are removed so the index can hold. Each of them stays in the audit
-- trail as its `rejected` event (approver, comment, approval id).
DELETE FROM approvals later
WHERE later.decision = 'reject'
  AND EXISTS (
      SELECT 1 FROM approvals earlier
      WHERE earlier.call_id = later.call_id AND earlier.decision = 'reject'
        AND (earlier.created_at, earlier.id) < (later.created_at, later.id)
  );

CREATE UNIQUE INDEX approvals_one_rejection ON approvals (call_id) WHERE decision = 'reject';
