-- description: operator steering: paused queues, cancelled jobs, dead-letter retention
-- drain: builds two indexes on pgpool_dead holding it locked against writes: every ack and
--   reaper pass (their statements write dead letters) waits for as long as that takes,
--   which grows with pgpool_dead

CREATE TABLE pgpool_paused (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pgpool_paused IS
    'pgpool queues paused by an operator (pgpool pause): no host claims from them '
    'until pgpool resume deletes the row; running jobs finish.';
ALTER TABLE pgpool_dead ADD COLUMN reason text NOT NULL DEFAULT 'failed';
COMMENT ON COLUMN pgpool_dead.reason IS
    'why the job is here: failed (its last attempt failed or its lease expired) or '
    'cancelled (pgpool cancel; last_error says when and what it was doing)';
-- Retention and purges delete the oldest first, in bounded batches.
CREATE INDEX pgpool_dead_died ON pgpool_dead (died_at);
-- Every host polls the latest cancellation: a few rows, however big the table.
CREATE INDEX pgpool_dead_cancelled ON pgpool_dead (died_at) WHERE reason = 'cancelled';
