-- What endorses a call is looked up by the digests of its values (each digest already
-- names its kind), for the caller's tenant: without this index the lookup read every known
-- value of the tenant (the primary key leads with the kind), and a tenant with 10,000 of
-- them made every endorsed call wait on a scan.
CREATE INDEX known_values_by_digest ON known_values (tenant, digest);
