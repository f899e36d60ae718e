-- Waiters on a call (GET /calls/{id}?wait=S) hear of each change of its state on any instance
-- through NOTIFY, sent when the changing transaction commits; one listening connection per
-- process, so no waiter polls the database.
CREATE FUNCTION notify_call_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('toolgate_calls', NEW.id);
    RETURN NULL;
END
$$;

CREATE TRIGGER calls_state_notify
    AFTER UPDATE OF state ON calls
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION notify_call_state();
