-- The reconciler's queue: open records (in flight or unknown), least recently changed first.
CREATE INDEX executions_open ON executions (updated_at) WHERE state IN ('in_flight', 'unknown');
