"""The ``pgpool web`` processes the `web` fixture keeps from one test to the next."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
from processes import Pgpool
from waits import wait_until

from pgpool.sql import common as sql

#: The ``pgpool web`` processes kept from one test to the next, by (DSN, arguments,
#: environment): starting one costs more than most web tests' own work.
kept_webs: dict[tuple[Any, ...], tuple[Pgpool, str]] = {}


def stop_kept_webs(keep: object = None) -> None:
    for key in [k for k in kept_webs if k != keep]:
        proc, _ = kept_webs.pop(key)
        if proc.poll() is None:
            proc.stop()


def fresh_snapshot(dsn: str, base: str, env: dict[str, str]) -> None:
    """Wait until the ``pgpool web`` at ``base`` serves a snapshot taken after the reset
    of its installation: it keeps the last one it took, which shows the test before's rows.
    A notification on the installation's channel makes it take one at once."""
    import base64
    import urllib.request

    since = time.time()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SELECT pg_notify({sql.OUR_CHANNEL}, 'default')")
    request = urllib.request.Request(base + "/api/snapshot")
    if "PGPOOL_WEB_USER" in env:
        user = f"{env['PGPOOL_WEB_USER']}:{env['PGPOOL_WEB_PASSWORD']}"
        request.add_header("Authorization", "Basic " + base64.b64encode(user.encode()).decode())

    def taken_since() -> bool:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.load(answer).get("taken_at", 0) > since

    wait_until(taken_since, "the kept pgpool web's snapshot of the reset installation")
