"""Stopping a host's asyncio tasks: each cancelled once, and waited for.

A task whose query psycopg is cancelling on the server (a connection to the server to
cancel it, then the query's end) must not be cancelled again meanwhile: psycopg then gives
up, drops the connection, and logs a warning into a clean stop's output. Every place that
stops tasks (the dispatcher at its end, an elected part at the end of a term, the long
jobs' writers) does it through `stop_tasks`.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def stop_tasks(*tasks: asyncio.Future[Any]) -> None:
    """Cancel each of ``tasks`` once and wait until all have ended, their errors dropped.

    A cancel of the caller meanwhile waits until then and is raised after: a task
    cancelled twice while psycopg cancels its query on the server gives that up, drops the
    connection and logs a warning.
    """
    for task in tasks:
        task.cancel()
    ending = asyncio.gather(*tasks, return_exceptions=True)
    interrupted = False
    while not ending.done():
        try:
            await asyncio.shield(ending)
        except asyncio.CancelledError:
            interrupted = True
    if interrupted:
        raise asyncio.CancelledError
