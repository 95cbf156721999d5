-- description: claim round trips per host, for pgpool status

ALTER TABLE pgpool_hosts ADD COLUMN claim_p99_ms float8;
COMMENT ON COLUMN pgpool_hosts.claim_p99_ms IS
    '99th percentile of its recent claim round trips, ms, at its last beat '
    '(NULL before its first claim)';
