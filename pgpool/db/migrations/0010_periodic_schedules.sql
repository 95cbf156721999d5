-- description: periodic jobs: one row per schedule, the fleet's memory of its ticks

CREATE TABLE pgpool_schedules (
    name           text        PRIMARY KEY,
    cron           text        NOT NULL,
    timezone       text        NOT NULL,
    kind           text        NOT NULL,
    queue          text        NOT NULL,
    catch_up       integer     NOT NULL CHECK (catch_up > 0),
    last_tick      timestamptz NOT NULL,
    last_run       timestamptz,
    last_run_at    timestamptz,
    declared_by    text,
    declared_until timestamptz NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pgpool_schedules IS
    'pgpool periodic jobs (pgpool.schedules), one row per schedule name, kept while '
    'no host declares it (not declared: nothing enqueues it; delete the row to '
    'forget it). Each tick is enqueued in the transaction that moves last_tick.';
COMMENT ON COLUMN pgpool_schedules.last_tick IS
    'every tick up to this time is handled (enqueued, or skipped by the catch-up '
    'rule); moved only forward, by a compare-and-set';
COMMENT ON COLUMN pgpool_schedules.last_run IS
    'the latest tick enqueued (NULL: none yet); last_run_at: when';
COMMENT ON COLUMN pgpool_schedules.declared_until IS
    'a host declared it (declared_by, its owner) in its code until this time; '
    'hosts declaring it refresh it every beat interval';
