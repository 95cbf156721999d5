"""``pgpool web`` stops when asked, whatever its snapshot loop is doing at that moment.

At shutdown the server cancels the hub's task. A cancel that its snapshot loop lost (the
loop went on, so the task never ended) kept the server running after SIGTERM, taking a
snapshot every `PERIOD` seconds for ever. A notification arriving as the server stops is
the case that lost it; the test makes the two coincide exactly: asyncio runs ready
callbacks in order, so the interleaving is fixed, not timed.
"""

from __future__ import annotations

import asyncio

import psycopg
from dbtools import one
from waits import wait_until

from pgpool.web.snapshots import APPLICATION_NAME, Hub

#: Seconds the stop may take: generous, the machine is shared with other test runs. A
#: lost cancel never ends, so any bound tells the two apart.
TIMEOUT = 20


def test_hub_stops_when_a_notification_arrives_with_the_cancel(db: psycopg.Connection,
                                                               dsn: str) -> None:
    def listening() -> bool:
        return one(db, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                       "AND datname = current_database() AND query LIKE 'LISTEN %%'",
                   APPLICATION_NAME)[0] == 1

    async def main() -> bool:
        hub = Hub(dsn)
        task = asyncio.create_task(hub.run())
        updates = hub.updates()
        await anext(updates)
        await asyncio.to_thread(wait_until, listening, "the hub's LISTEN", TIMEOUT)
        # The second snapshot from now began after the listener's poke: none is pending,
        # and once it is published the loop waits for a poke or its period.
        seen = hub.version + 2
        while hub.version < seen:
            await anext(updates)
        await updates.aclose()
        hub._poke.set()  # a notification...
        task.cancel()  # ...and the server's stop, in the same turn of the loop
        done, _ = await asyncio.wait({task}, timeout=TIMEOUT)
        await hub.close()
        return bool(done)  # if not, asyncio.run cancels the loop's tasks one by one

    assert asyncio.run(main()), f"the hub still ran {TIMEOUT}s after it was cancelled"
