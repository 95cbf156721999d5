-- description: the claim batch each host uses

ALTER TABLE pgpool_hosts ADD COLUMN batch integer;
COMMENT ON COLUMN pgpool_hosts.batch IS
    'jobs per claim at its last beat (with --batch auto, what the sizer worked out '
    'then); NULL from a pgpool older than this column';
