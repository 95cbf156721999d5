-- description: parked jobs, and succeeded jobs kept because they could not be deleted

-- NOT VALID: the new check only widens the old one, which every row satisfies, so
-- scanning the table under this ACCESS EXCLUSIVE lock would prove nothing.
ALTER TABLE pgpool_jobs
    DROP CONSTRAINT pgpool_jobs_state_check,
    ADD CONSTRAINT pgpool_jobs_state_check
        CHECK (state IN ('ready', 'running', 'done', 'parked')) NOT VALID;
COMMENT ON TABLE pgpool_jobs IS
    'pgpool jobs: state ready or running; succeeded jobs are deleted, except those '
    'the database refused to delete (kept as done), and jobs whose ack or reap the '
    'database refused are parked; last_error says why. Neither is claimed again.';
COMMENT ON COLUMN pgpool_jobs.state IS
    'ready, running, done (succeeded, could not be deleted), parked (its ack or '
    'reap was refused; set it to ready to run it again)';
