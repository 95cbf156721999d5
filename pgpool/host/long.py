"""Long jobs, the dispatcher's side: the checkpoints its workers' handlers store and read,
and the progress they report (`pgpool.worker.long` is the workers' side).

  pool._on_long(worker, message) ─▶ LongJobs.received(job, message, answer)
     Checkpoint      ─▶ a task: sql.CHECKPOINT (guarded by owner and attempt, and the
                        lease) ─▶ answer(Stored(id, None | why not))
     LoadCheckpoint  ─▶ a task: sql.LOAD_CHECKPOINT ─▶ answer(Loaded(id, state))
     Progress        ─▶ progress[job], kept until the heartbeat's next beat writes it:
                        write_progress(conn), one sql.PROGRESS for every job that reported

A job whose lease this host has lost (`Job.lost`), or whose attempt has ended, stores
nothing: its answer says why, and the handler raises `pgpool.Interrupted`. A statement that
fails for a passing reason (a lost connection, a restarting server, a lock held past
``lock_timeout``) is tried again with backoff for as long as the job is held; the handler
waits meanwhile, and its worker's fence ends it if the lease runs out first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson
import psycopg
from psycopg_pool import AsyncConnectionPool

from ..db.outage import backoff
from ..logs import event
from ..sql import long as sql
from ..sql.common import int_array
from ..worker import ipc
from .attempt import Job
from .tasks import stop_tasks

log = logging.getLogger("pgpool.long")

#: How the dispatcher answers the worker that asked (nothing once that worker is gone).
Answer = Callable[[ipc.LongToWorker], None]


class LongJobs:
    """Checkpoints and progress of the jobs held by dispatcher ``owner``."""

    def __init__(self, pool: AsyncConnectionPool, owner: str) -> None:
        self._pool = pool
        self._owner = owner
        #: The latest progress of each job that reported since the last beat wrote it.
        self.progress: dict[Job, tuple[float, float | None, str | None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def received(self, job: Job | None, message: ipc.LongFromWorker, answer: Answer) -> None:
        """A worker's ``message`` about ``job``, its running attempt (None: the attempt it
        names has ended)."""
        if isinstance(message, ipc.Progress):
            if job is not None and not job.lost:
                self.progress[job] = (message.done, message.total, message.note)
            return
        task = asyncio.get_running_loop().create_task(self._answer(job, message, answer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, job: Job | None,
                      message: ipc.Checkpoint | ipc.LoadCheckpoint, answer: Answer) -> None:
        if isinstance(message, ipc.Checkpoint):
            answer(ipc.Stored(message.id, await self._store(job, message.state)))
        else:
            answer(ipc.Loaded(message.id, await self._load(job)))

    async def _store(self, job: Job | None, state: bytes) -> str | None:
        if job is None or job.lost:
            return self._refused(job)
        params = {"id": job.id, "attempt": job.attempt, "owner": self._owner,
                  "state": state.decode()}
        try:
            rows = await self._retrying(job, sql.CHECKPOINT, params, "rowcount")
        except psycopg.Error as exc:  # refused for its content: no retry changes it
            return f"the database refused it ({type(exc).__name__})"
        if rows != 1:
            return self._refused(job)
        return None

    def _refused(self, job: Job | None) -> str:
        if job is not None:  # None: an attempt already over, whose outcome was logged
            event(log, logging.WARNING, "checkpoint_refused",
                  "%s: a checkpoint of an attempt that no longer holds the job was not "
                  "stored", job, job_id=job.id, kind=job.kind)
        return ipc.NOT_HELD

    async def _load(self, job: Job | None) -> bytes | None:
        if job is None or job.lost:
            return None
        params = {"id": job.id, "attempt": job.attempt, "owner": self._owner}
        text = await self._retrying(job, sql.LOAD_CHECKPOINT, params, "value")
        return None if text is None else text.encode()

    async def _retrying(self, job: Job, statement: str, params: dict[str, Any],
                        want: str) -> Any:
        """Run ``statement``; its rowcount or its one value (``want``). Tried again after
        a passing failure while ``job`` is held; an error of the statement itself raises."""
        failures = 0
        while True:
            try:
                async with self._pool.connection() as conn:
                    cur = await conn.execute(statement, params)
                    if want == "rowcount":
                        return cur.rowcount
                    row = await cur.fetchone()
                    return None if row is None else row[0]
            except (psycopg.OperationalError, OSError) as exc:
                if job.lost:
                    return 0 if want == "rowcount" else None
                failures += 1
                delay = backoff(failures, 0.1, 2.0)
                log.warning("%s: its checkpoint's statement failed (%s); retrying in %.1fs",
                            job, type(exc).__name__, delay)
                await asyncio.sleep(delay)

    async def write_progress(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Write the progress reported since the last call (the heartbeat calls it after
        each beat, on its connection): one statement, or none when none was reported."""
        if not self.progress:
            return
        reported, self.progress = self.progress, {}
        jobs = [job for job in reported if not job.lost]
        if not jobs:
            return
        await conn.execute(sql.PROGRESS, {
            "ids": int_array(job.id for job in jobs),
            "attempts": int_array(job.attempt for job in jobs),
            "progress": [orjson.dumps(dict(zip(("done", "total", "note"), reported[job],
                                               strict=True))).decode() for job in jobs],
            "owner": self._owner,
        })

    async def close(self) -> None:
        """Stop writing: the host is shutting down, its workers are gone (none waits for an
        answer any more)."""
        await stop_tasks(*self._tasks)
