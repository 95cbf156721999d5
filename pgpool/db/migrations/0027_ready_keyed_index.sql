-- description: an index of the ready jobs with a concurrency key, which the fair claim
--   looks at to tell whether it may read tenants from their cursors
-- drain: holds pgpool_jobs against writes while it reads the table once to build an index:
--   claims, heartbeats and acks wait for as long as that takes

-- Holds the ready jobs with a concurrency key, and only those (pgpool.sql.jobs.
-- _KEYED_WAITING): while one waits, the fair claim reads every tenant from the start. A
-- queue that never uses concurrency keys never writes to it.
CREATE INDEX pgpool_jobs_ready_keyed ON pgpool_jobs (queue, kind)
    WHERE state = 'ready' AND concurrency_key IS NOT NULL;
