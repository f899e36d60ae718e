-- Signed checkpoints (app/audit/checkpoints.py): the chain head row becomes the latest
-- checkpoint. The sealer writes, in the transaction that moves the head, when it was written
-- (`updated_at`, now set by the sealer and covered by the signature), the id of the key that
-- signed it and the Ed25519 signature; both stay NULL when no signing key is configured, as
-- for a head written before this migration.
ALTER TABLE audit_chain
    ADD COLUMN key_id    text,
    ADD COLUMN signature text,
    ADD CONSTRAINT audit_chain_signed_by_a_key CHECK ((key_id IS NULL) = (signature IS NULL));
