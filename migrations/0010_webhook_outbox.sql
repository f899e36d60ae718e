-- Webhook deliveries waiting to be sent: written in the transaction of the event they
-- announce, so an event is announced exactly when it is stored, and kept until the endpoint
-- accepts it, across restarts of every instance.
CREATE TABLE webhook_outbox (
    id           text PRIMARY KEY,
    url          text NOT NULL,
    event        text NOT NULL,
    payload      jsonb NOT NULL,
    attempts     integer NOT NULL DEFAULT 0,
    next_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX webhook_outbox_due ON webhook_outbox (next_at) WHERE delivered_at IS NULL;
