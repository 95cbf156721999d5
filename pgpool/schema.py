"""Versioned, idempotent schema migrations.

`migrate` applies the migrations the database lacks, in order, inside one transaction that
holds an advisory lock, so several hosts may run it at once: the first applies, the others
wait and then find nothing to do. The applied version is recorded in ``pgpool_schema_version``;
`check_version` is what ``pgpool run``, ``enqueue`` and ``status`` use to refuse a missing,
older or newer schema.

Physical choices come from the field reports in ``shared/seeds``: the ready-job index is
partial (it stays as small as the backlog, not the table); nothing that a heartbeat touches
(``lease_until``) is indexed, so lease extensions stay HOT updates; fillfactor 80 leaves room
on each page for those updates; autovacuum is made aggressive on the one high-churn table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, NamedTuple

from . import sql
from .errors import SchemaError

if TYPE_CHECKING:  # imported by `pgpool` itself, so workers too: see pgpool.enqueue
    import psycopg


class Migration(NamedTuple):
    version: int
    description: str
    ddl: str


MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        1,
        "jobs, dead letters",
        """
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
        """,
    ),
    Migration(
        2,
        "host registry",
        """
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
        """,
    ),
    Migration(
        3,
        "claims per host against the fleet budget",
        """
        ALTER TABLE pgpool_hosts
            ADD COLUMN jobs_claimed       bigint NOT NULL DEFAULT 0,
            ADD COLUMN claims_per_sec     float8,
            ADD COLUMN max_claims_per_sec float8 CHECK (max_claims_per_sec > 0);
        COMMENT ON COLUMN pgpool_hosts.jobs_claimed IS
            'jobs this dispatcher claimed (moved to running) since it started';
        COMMENT ON COLUMN pgpool_hosts.claims_per_sec IS
            'jobs claimed per second between its last two beats; NULL before a second beat';
        COMMENT ON COLUMN pgpool_hosts.max_claims_per_sec IS
            'the fleet budget it runs with (--max-claims-per-sec), shared by the live hosts; '
            'NULL if written by a pgpool older than schema version 3';
        """,
    ),
    Migration(
        4,
        "attempts that do not count: interrupted by shutdown, or never started",
        """
        ALTER TABLE pgpool_jobs
            ADD COLUMN interruptions integer NOT NULL DEFAULT 0,
            ADD COLUMN started       boolean NOT NULL DEFAULT false;
        ALTER TABLE pgpool_dead
            ADD COLUMN interruptions integer NOT NULL DEFAULT 0;
        COMMENT ON COLUMN pgpool_jobs.attempts IS
            'claims so far (the ownership token with locked_by); the job has used '
            'attempts - interruptions of its max_attempts';
        COMMENT ON COLUMN pgpool_jobs.interruptions IS
            'claims not counted against max_attempts: cut off by a dispatcher''s shutdown, '
            'or reaped before they started; at most pgpool.retry.FREE_INTERRUPTIONS';
        COMMENT ON COLUMN pgpool_jobs.started IS
            'the current attempt started in a worker, as last recorded by a heartbeat';
        """,
    ),
)

#: The schema version this code expects.
SCHEMA_VERSION: Final = MIGRATIONS[-1].version

BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS pgpool_schema_version (
    version     integer     PRIMARY KEY,
    description text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""

# One key per schema, so pgpool installations in different schemas never wait on each other.
_LOCK = "SELECT pg_advisory_xact_lock(hashtext('pgpool.migrate:' || current_schema()))"


def migrate(conn: psycopg.Connection) -> list[int]:
    """Bring the schema on ``conn`` up to `SCHEMA_VERSION`; return the versions applied.

    Safe to call concurrently from many processes and to call again (it then applies
    nothing). Runs in a transaction of its own, or in a savepoint if ``conn`` is already
    inside one. Raises `SchemaError` when the database is newer than this code.
    """
    if conn.execute("SELECT current_schema()").fetchone()[0] is None:
        raise SchemaError(
            "the connection's search_path names no existing schema to create pgpool's tables "
            "in: create the schema first, or fix search_path in the DSN"
        )
    if schema_version(conn) == SCHEMA_VERSION:
        return []  # nothing to do, and no DDL privilege needed to find that out
    applied: list[int] = []
    with conn.transaction():
        conn.execute(_LOCK)
        conn.execute(BOOKKEEPING)
        current = conn.execute(sql.SCHEMA_VERSION).fetchone()[0]
        if current > SCHEMA_VERSION:
            raise SchemaError(_too_new(current))
        for m in MIGRATIONS:
            if m.version > current:
                conn.execute(m.ddl)
                conn.execute(
                    "INSERT INTO pgpool_schema_version (version, description) VALUES (%s, %s)",
                    (m.version, m.description),
                )
                applied.append(m.version)
    return applied


def schema_version(conn: psycopg.Connection) -> int | None:
    """The recorded schema version, or None when pgpool's schema is absent."""
    if not conn.execute(sql.HAS_SCHEMA).fetchone()[0]:
        return None
    return conn.execute(sql.SCHEMA_VERSION).fetchone()[0]


async def schema_version_async(conn: psycopg.AsyncConnection) -> int | None:
    """Async twin of `schema_version`."""
    if not (await (await conn.execute(sql.HAS_SCHEMA)).fetchone())[0]:
        return None
    return (await (await conn.execute(sql.SCHEMA_VERSION)).fetchone())[0]


def check_version(found: int | None) -> None:
    """Raise `SchemaError` unless ``found`` is exactly the version this code needs."""
    if found is None:
        raise SchemaError(
            "pgpool's tables are missing from this database: run `pgpool migrate` "
            "against the same database first"
        )
    if found > SCHEMA_VERSION:
        raise SchemaError(_too_new(found))
    if found < SCHEMA_VERSION:
        raise SchemaError(
            f"the pgpool schema is at version {found} but this pgpool needs {SCHEMA_VERSION}: "
            "run `pgpool migrate` to upgrade it"
        )


def _too_new(found: int) -> str:
    return (
        f"the pgpool schema is at version {found}, newer than this pgpool understands "
        f"({SCHEMA_VERSION}): upgrade pgpool on this host to use this database"
    )
