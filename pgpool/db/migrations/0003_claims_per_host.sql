-- description: claims per host against the fleet budget

ALTER TABLE pgpool_hosts
    ADD COLUMN jobs_claimed       bigint NOT NULL DEFAULT 0,
    ADD COLUMN claims_per_sec     float8,
    ADD COLUMN max_claims_per_sec float8 CHECK (max_claims_per_sec > 0);
COMMENT ON COLUMN pgpool_hosts.jobs_claimed IS
    'jobs this dispatcher claimed (moved to running) since it started';
COMMENT ON COLUMN pgpool_hosts.claims_per_sec IS
    'jobs claimed per second between its last two beats; NULL before a second beat';
COMMENT ON COLUMN pgpool_hosts.max_claims_per_sec IS
    'the fleet budget it runs with (--max-claims-per-sec), shared by the live hosts; '
    'NULL if written by a pgpool older than schema version 3';
