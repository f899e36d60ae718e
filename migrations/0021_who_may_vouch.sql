-- Who may vouch, and for whom (known values).
--
-- An approval keeps the x-endorsed arguments its approver asked to remember: a value is
-- remembered only when every approver of the call's quorum asked for it.
ALTER TABLE approvals ADD COLUMN remember text[];

-- A known value's scope: the whole tenant (user_sub NULL), or only the later calls of
-- user_sub (a value an approver vouched for on their own call). call_id: the call whose
-- approvals vouched for it (NULL: an admin's). until: NULL, it endorses for good; else only
-- before then, when its call's approvals lapse. A call's approvals either run it, and the
-- trigger below settles the values they vouched for as the call starts (and gives them
-- their deadline back if its execution is released, nothing having run: the call is then
-- approved again, or proposed if it ran without its approvals), or they lapse unused, and
-- so do the values; a rejection deletes them (the use case audits it).
-- Digests are keyed from now on (`hmac-sha256:`); the older plain ones (`sha256:`) match
-- nothing, and `toolgate migrate` digests them again under the key, or removes them when
-- the value itself was never kept.
ALTER TABLE known_values
    ADD COLUMN user_sub text,
    ADD COLUMN call_id  text,
    ADD COLUMN until    timestamptz;
ALTER TABLE known_values DROP CONSTRAINT known_values_pkey;
CREATE UNIQUE INDEX known_values_once
    ON known_values (tenant, kind, digest, (coalesce(user_sub, '')));
CREATE INDEX known_values_by_call ON known_values (call_id) WHERE call_id IS NOT NULL;

CREATE FUNCTION settle_known_values() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'executing' THEN
        UPDATE known_values SET until = NULL WHERE call_id = NEW.id AND until IS NOT NULL;
    ELSE
        UPDATE known_values SET until = coalesce((
            SELECT min(expires_at) FROM approvals
            WHERE call_id = NEW.id AND decision = 'approve' AND consumed_by IS NULL
        ), now())
        WHERE call_id = NEW.id AND until IS NULL;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER calls_settle_known_values
    AFTER UPDATE OF state ON calls
    FOR EACH ROW WHEN (
        (OLD.state = 'approved' AND NEW.state = 'executing')
        OR (OLD.state = 'executing' AND NEW.state IN ('approved', 'proposed'))
    )
    EXECUTE FUNCTION settle_known_values();

-- A value withdrawn (its call rejected, or its digest's key retired) is audited.
ALTER TABLE audit_events DROP CONSTRAINT audit_events_event_check;
ALTER TABLE audit_events ADD CONSTRAINT audit_events_event_check CHECK (event IN (
    'proposed', 'denied', 'dry_run', 'approved', 'rejected', 'executed', 'replayed', 'failed',
    'reconciled', 'expired', 'remembered', 'forgotten', 'withdrawn'));
