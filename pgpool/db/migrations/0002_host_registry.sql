-- description: host registry

CREATE TABLE pgpool_hosts (
    owner       text        PRIMARY KEY,
    hostname    text        NOT NULL,
    pid         integer     NOT NULL,
    procs       integer     NOT NULL,
    queues      text[]      NOT NULL,
    kinds       text[]      NOT NULL,
    lease       float8      NOT NULL CHECK (lease > 0),
    started_at  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    jobs_done   bigint      NOT NULL DEFAULT 0,
    jobs_failed bigint      NOT NULL DEFAULT 0
);
COMMENT ON TABLE pgpool_hosts IS
    'pgpool dispatchers: one row per running dispatcher (owner = locked_by of its '
    'jobs), beaten every lease/3, deleted on clean exit, pruned once stale.';
