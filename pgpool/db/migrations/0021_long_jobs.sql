-- description: long jobs: a job's checkpoint (its handler's state, kept across attempts)
--   and its progress, with when each was written

-- Columns without a default: adding them changes the catalog only, and a job that never
-- checkpoints nor reports progress keeps them NULL (no bytes in its row). None is
-- indexed, so the updates that write them stay HOT, as heartbeats do. A checkpoint is
-- written only by the attempt that holds the job (sql.long.CHECKPOINT), and stays with
-- the row across attempts: a later one reads it back (current_job().checkpoint_state).
ALTER TABLE pgpool_jobs ADD COLUMN IF NOT EXISTS checkpoint jsonb;
ALTER TABLE pgpool_jobs ADD COLUMN IF NOT EXISTS checkpoint_at timestamptz;
ALTER TABLE pgpool_jobs ADD COLUMN IF NOT EXISTS progress jsonb;
ALTER TABLE pgpool_jobs ADD COLUMN IF NOT EXISTS progress_at timestamptz;
COMMENT ON COLUMN pgpool_jobs.checkpoint IS
    'the last state its handler stored with current_job().checkpoint(), or NULL';
COMMENT ON COLUMN pgpool_jobs.checkpoint_at IS 'when that checkpoint was stored';
COMMENT ON COLUMN pgpool_jobs.progress IS
    'the last progress its running attempt reported: {"done", "total", "note"}';
COMMENT ON COLUMN pgpool_jobs.progress_at IS 'when that progress was written';
