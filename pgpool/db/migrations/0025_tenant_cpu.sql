-- description: fairness by CPU time (pgpool run --fair-by cpu): the CPU seconds each
--   tenant's attempts used, fleet-wide, in buckets of 5 seconds (pgpool_tenant_cpu)

-- Written only by hosts that run with --fair-by cpu: one upsert per ack flush, of the
-- sums per tenant of the attempts it acks (pgpool.sql.jobs.RECORD_CPU), into the bucket
-- of now. Their fair claim (CLAIM_CPU) reads each waiting tenant's last 30 seconds of it;
-- the maintenance leader deletes buckets older than a minute (PRUNE_CPU). So the table
-- holds about a dozen rows per tenant that ran lately, and none without --fair-by cpu.
CREATE TABLE pgpool_tenant_cpu (
    tenant   text COLLATE "C" NOT NULL,
    bucket   timestamptz      NOT NULL,
    cpu      float8           NOT NULL CHECK (cpu >= 0),
    attempts bigint           NOT NULL CHECK (attempts >= 0),
    PRIMARY KEY (tenant, bucket)
);
COMMENT ON TABLE pgpool_tenant_cpu IS
    'pgpool fairness by CPU time: the CPU seconds (cpu) the attempts of each tenant '
    '('''' = no tenant) used, as their workers measured them, and how many attempts, per '
    'bucket of 5 seconds (bucket: its start); written by hosts run with --fair-by cpu';
