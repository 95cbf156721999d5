"""A snapshot's ``taken_at`` is when it began reading: every commit made before then is in
it. Stamped once read, a snapshot that began before a commit looked newer than the commit,
and a client that waits for a snapshot "taken after" its change (the tests' kept dashboard
does) could get one without it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import psycopg

import pgpool
from pgpool.web.snapshots import Hub


def test_a_snapshot_is_stamped_before_it_reads(dsn: str, db: psycopg.Connection) -> None:
    committed: list[float] = []

    class CommitWhileReading(Hub):
        def _collect(self) -> dict[str, Any]:
            report = super()._collect()
            # A commit once the snapshot has read, before it is published: not in it.
            pgpool.enqueue(db, "late", {})
            db.commit()
            committed.append(time.time())
            return report

    async def first_snapshot() -> dict[str, Any]:
        hub = CommitWhileReading(dsn)
        task = asyncio.create_task(hub.run())
        try:
            latest = await hub.first(timeout=20)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await hub.close()
        assert latest is not None
        return orjson.loads(latest)

    snapshot = asyncio.run(first_snapshot())
    assert sum(q["ready"] for q in snapshot["queues"]) == 0  # the late job is not in it
    assert snapshot["taken_at"] < committed[0]
