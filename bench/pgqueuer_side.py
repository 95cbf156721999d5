"""PgQueuer as a side of the bench scripts: its tables, its jobs and its consumer processes
(bench/peers.py, bench/vs_loop.py ``--pgqueuer``, bench/pickups.py ``--pgqueuer``).

    python bench/pgqueuer_side.py BATCH [continuous]   one consumer (the scripts start it)

PgQueuer (``pip install pgqueuer==1.6.0``; asyncpg too for bench/pickups.py) is not a
pgpool dependency: it is imported only where one of these runs, and `version` says, in
one line, how to install it where it is missing. Its jobs run as a pgpool worker runs
them: decoded by orjson, then the bench handler (`pgpool.bench.jobs`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import IO, Any, Final

import drains  # bench/ is on the path: this script's directory
import orjson
import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgpool import registry
from pgpool.bench.jobs import KIND
from pgpool.bench.options import BenchError

#: The PgQueuer release the issue compares with.
PGQUEUER: Final = "pgqueuer==1.6.0"
#: PgQueuer's jobs per enqueue statement while loading.
PGQUEUER_LOAD_CHUNK: Final = 10_000
#: PgQueuer's table: a job is 'queued' until claimed ('picked'), deleted once done.
PGQUEUER_JOBS: Final = drains.Queue(
    remaining="SELECT count(*) FROM pgqueuer",
    markers="""
SELECT m.id, j.status::text
FROM unnest(%(ids)s::bigint[]) AS m(id) LEFT JOIN pgqueuer AS j USING (id)
""",
    ready="queued",
)
#: PgQueuer logs each job's every status; 'successful' once it ran without error.
PGQUEUER_SUCCESSES: Final = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
VACUUM_PGQUEUER: Final = "VACUUM pgqueuer"


def installed() -> str | None:
    """PgQueuer's installed version; None where it is not installed."""
    try:
        return importlib.metadata.version("pgqueuer")
    except importlib.metadata.PackageNotFoundError:
        return None


def version(option: str) -> str:
    """PgQueuer's installed version; `BenchError` naming ``option`` if it is missing."""
    found = installed()
    if found is None:
        raise BenchError(f"{option}: PgQueuer is not installed (pip install {PGQUEUER})")
    return found


def enqueue(conn: psycopg.Connection, payloads: list[dict[str, Any]]) -> int:
    """``payloads`` as PgQueuer jobs of the bench kind, `PGQUEUER_LOAD_CHUNK` a statement
    by its producer's batch enqueue, with consecutive ids; the first one's."""
    # Imported here: PgQueuer is not a pgpool dependency.
    from pgqueuer.db import SyncPsycopgDriver
    from pgqueuer.queries import SyncQueries

    enqueue = SyncQueries(SyncPsycopgDriver(conn)).enqueue
    ids: list[int] = []
    for start in range(0, len(payloads), PGQUEUER_LOAD_CHUNK):
        chunk = [orjson.dumps(p) for p in payloads[start:start + PGQUEUER_LOAD_CHUNK]]
        ids += enqueue([KIND] * len(chunk), chunk, [0] * len(chunk))
    # The drives find their markers by id: the jobs must be numbered in their claim order.
    if ids != list(range(ids[0], ids[0] + len(payloads))):
        raise BenchError("PgQueuer gave the jobs loaded ids that are not consecutive")
    return ids[0]


class PgQueuer:
    """PgQueuer's consumer processes (`consumer`), a `drains.Side`."""

    title = "PgQueuer"
    #: How the errors name one of its processes.
    process = "a PgQueuer consumer"

    def __init__(self, conn: psycopg.Connection, dsn: str, procs: int, batch: int,
                 log: IO[bytes]) -> None:
        self.conn, self.dsn, self.count, self.batch, self.log = conn, dsn, procs, batch, log
        self.procs: list[subprocess.Popen[bytes]] = []
        self.successes = _successes(conn)  # before this drain

    def start(self, env: dict[str, str]) -> None:
        env = {**os.environ, "PGPOOL_DSN": self.dsn, **env}
        for _ in range(self.count):
            self.procs.append(subprocess.Popen(
                [sys.executable, __file__, str(self.batch)],
                stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=env))

    def check(self, conn: psycopg.Connection, claimed: bool) -> None:
        """`BenchError` if a consumer has failed, or if all of them have exited (in drain
        mode, once none is queued) with jobs left."""
        for proc in self.procs:
            if proc.poll() not in (None, 0):
                drains.check_running(proc, self.log, drains.how_far(conn, claimed, PGQUEUER_JOBS),
                                     self.process)
        if (all(proc.poll() is not None for proc in self.procs)
                and (left := drains.remaining(conn, PGQUEUER_JOBS))):
            raise BenchError(f"PgQueuer's consumers exited with {left:,} jobs left")

    def finish(self, n: int) -> None:
        for proc in self.procs:
            drains.expect_exit(proc, self.log, self.process)
        # A job that raised is deleted too, logged as an exception.
        if (done := _successes(self.conn) - self.successes) != n:
            raise BenchError(f"PgQueuer ran {done:,} jobs successfully, not {n:,}")


def _successes(conn: psycopg.Connection) -> int:
    return conn.execute(PGQUEUER_SUCCESSES).fetchone()[0]


async def install(dsn: str) -> None:
    """PgQueuer's tables, types and trigger in the schema ``dsn``'s search_path names."""
    from pgqueuer.queries import Queries  # imported here: not a pgpool dependency

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await Queries.from_psycopg_connection(conn).install()


def consumer(batch: int, continuous: bool = False) -> int:
    """One PgQueuer consumer process on the DSN in ``PGPOOL_DSN``: PgQueuer's runner of
    `_queue_manager` in drain mode, claims of ``batch``; it exits once no job is queued and
    its own are done. ``continuous``: it waits for jobs until SIGTERM instead, on asyncpg
    (as bench/pickups.py runs it, `_queue_manager`)."""
    import pgqueuer  # imported here: not a pgpool dependency
    import uvloop  # a PgQueuer dependency
    from pgqueuer.types import QueueExecutionMode

    mode = QueueExecutionMode.continuous if continuous else QueueExecutionMode.drain
    # `pgq run` would do the same, but its command line fails to parse its own options
    # with current typer releases.
    uvloop.run(pgqueuer.run(functools.partial(_queue_manager, asyncpg=continuous),
                            batch_size=batch, mode=mode))
    return 0


@contextlib.asynccontextmanager
async def _queue_manager(asyncpg: bool) -> AsyncIterator[Any]:
    """PgQueuer's factory: a QueueManager on one psycopg 3 async connection (``asyncpg``:
    an asyncpg one), whose one entrypoint runs a job as a pgpool worker does (orjson, then
    the bench handler).

    Why asyncpg for an idle queue's pickup: PgQueuer's psycopg driver waits for
    notifications on the connection its queries use, one second at a time, and a query
    waits for that wait to end: every pickup took a second (1,002 ms at the median)."""
    from pgqueuer import QueueManager
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries

    run_job = registry.registered()[KIND].run
    async with contextlib.AsyncExitStack() as stack:
        if asyncpg:
            conn = await _asyncpg_connect(os.environ["PGPOOL_DSN"])
            stack.push_async_callback(conn.close)
            queries = Queries.from_asyncpg_connection(conn)
        else:
            conn = await stack.enter_async_context(await psycopg.AsyncConnection.connect(
                os.environ["PGPOOL_DSN"], autocommit=True))
            queries = Queries.from_psycopg_connection(conn)
        manager = QueueManager(queries)

        @manager.entrypoint(KIND)
        async def bench(job: Job) -> None:
            run_job(orjson.loads(job.payload))

        yield manager


async def _asyncpg_connect(dsn: str) -> Any:
    """An asyncpg connection to libpq's ``dsn`` (asyncpg reads URLs only): its host, port,
    user, password and database, and its ``-c name=value`` options as server settings
    (the scratch schema's ``search_path``)."""
    import asyncpg  # PgQueuer's own driver: not a pgpool dependency

    params = conninfo_to_dict(dsn)
    settings = dict(option.split("=", 1) for option in
                    str(params.get("options", "")).replace("-c ", "").split())
    if "application_name" in params:
        settings["application_name"] = str(params["application_name"])
    return await asyncpg.connect(host=params.get("host"), port=params.get("port"),
                                 user=params.get("user"), password=params.get("password"),
                                 database=params.get("dbname"), server_settings=settings)


if __name__ == "__main__":
    sys.exit(consumer(int(sys.argv[1]), sys.argv[2:] == ["continuous"]))
