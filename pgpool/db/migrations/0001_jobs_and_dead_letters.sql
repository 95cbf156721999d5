-- description: jobs, dead letters

CREATE TABLE pgpool_jobs (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text        NOT NULL DEFAULT 'default',
    kind         text        NOT NULL,
    payload      jsonb       NOT NULL,
    priority     integer     NOT NULL DEFAULT 0,
    run_at       timestamptz NOT NULL DEFAULT now(),
    state        text        NOT NULL DEFAULT 'ready'
                             CHECK (state IN ('ready', 'running')),
    attempts     integer     NOT NULL DEFAULT 0,
    max_attempts integer     CHECK (max_attempts > 0),
    unique_key   text,
    locked_by    text,
    lease_until  timestamptz,
    claimed_at   timestamptz,
    last_error   text,
    created_at   timestamptz NOT NULL DEFAULT now()
) WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
COMMENT ON TABLE pgpool_jobs IS
    'pgpool live jobs: state ready or running. Succeeded jobs are deleted.';
CREATE INDEX pgpool_jobs_ready ON pgpool_jobs (queue, priority DESC, run_at, id)
    WHERE state = 'ready';
CREATE INDEX pgpool_jobs_running ON pgpool_jobs (locked_by)
    WHERE state = 'running';
CREATE UNIQUE INDEX pgpool_jobs_unique ON pgpool_jobs (kind, unique_key)
    WHERE unique_key IS NOT NULL;

CREATE TABLE pgpool_dead (
    id           bigint      PRIMARY KEY,
    queue        text        NOT NULL,
    kind         text        NOT NULL,
    payload      jsonb       NOT NULL,
    priority     integer     NOT NULL,
    attempts     integer     NOT NULL,
    max_attempts integer,
    unique_key   text,
    last_error   text,
    created_at   timestamptz NOT NULL,
    died_at      timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pgpool_dead IS
    'pgpool dead letters: jobs that failed max_attempts times, with the last error.';
CREATE INDEX pgpool_dead_kind ON pgpool_dead (kind, died_at);
