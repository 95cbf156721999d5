"""What ``pgpool web`` costs the database with 1 and with 20 dashboards open.

Starts a throwaway PostgreSQL with pg_stat_statements, a ``pgpool web`` connected as a role
of its own (``pgpool_web``), and opens N server-sent event streams (what each open page
holds). For each N, idle and while jobs are enqueued at --rate (each enqueue notifies, so
the server snapshots more often), it counts over --seconds the statements the server's role
ran (pg_stat_statements, every statement including BEGIN/COMMIT), the snapshots among
them (its transactions), and the snapshots each stream received. Prints one line per case.

    .venv/bin/python bench/web_cost.py [--seconds 30] [--rate 20] [--clients 1,20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

import pgpool

#: The chaos harness, whose `Postgres` this script starts: the tests' helpers.
SUPPORT = Path(__file__).resolve().parent.parent / "tests" / "support"
ROLE = "pgpool_web"
DATABASE = "web_cost"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="each case's window")
    parser.add_argument("--rate", type=float, default=20.0,
                        help="jobs enqueued per second in the busy cases")
    parser.add_argument("--clients", default="1,20", help="numbers of open streams")
    args = parser.parse_args()

    sys.path.insert(0, str(SUPPORT))
    from chaos_cluster import Postgres

    pg = Postgres.start()
    try:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        pg.restart()
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            conn.execute(f"CREATE DATABASE {DATABASE}")
            conn.execute(f"CREATE ROLE {ROLE} LOGIN SUPERUSER")
        app_dsn = make_conninfo(pg.dsn, dbname=DATABASE)
        with psycopg.connect(app_dsn, autocommit=True) as conn:
            pgpool.migrate(conn)
        web = subprocess.Popen(
            [sys.executable, "-m", "pgpool", "web", "--port", "0"],
            env={**os.environ, "PGPOOL_DSN": make_conninfo(app_dsn, user=ROLE),
                 "PGPOOL_LOG_FORMAT": "json"},
            stderr=subprocess.PIPE, text=True)
        try:
            base = _started(web)
            print(f"{'streams':>7} {'enqueued/s':>10} {'statements/s':>12} "
                  f"{'snapshots/s':>11} {'events/s per stream':>19}")
            for clients in map(int, args.clients.split(",")):
                for rate in (0.0, args.rate):
                    _case(pg.dsn, app_dsn, base, clients, rate, args.seconds)
        finally:
            web.terminate()
            web.wait(30)
    finally:
        pg.stop()
    return 0


def _started(web: subprocess.Popen[str]) -> str:
    for line in web.stderr:  # type: ignore[union-attr]
        if line.startswith("{") and json.loads(line).get("event") == "web_started":
            threading.Thread(target=web.stderr.read, daemon=True).start()  # type: ignore
            return f"http://127.0.0.1:{json.loads(line)['port']}"
    raise SystemExit("pgpool web exited before serving")


class Stream(threading.Thread):
    """One open page: reads /api/events and counts its snapshot events."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.answer = urllib.request.urlopen(url + "/api/events", timeout=60)
        self.events = 0
        self.start()

    def run(self) -> None:
        try:
            for line in self.answer:
                if line.startswith(b"event: snapshot"):
                    self.events += 1
        except (OSError, ValueError, AttributeError):
            return  # closed by `close` (http.client raises any of these then)

    def close(self) -> None:
        self.answer.close()


def _counts(admin: psycopg.Connection) -> tuple[int, int]:
    """(statements, transactions) the server's role has run so far. Nothing but the
    snapshot loop opens a transaction while no one acts, so transactions are snapshots."""
    return admin.execute(
        "SELECT coalesce(sum(calls), 0)::bigint,"
        " coalesce(sum(calls) FILTER (WHERE query = 'COMMIT'), 0)::bigint"
        " FROM pg_stat_statements WHERE userid = %s::regrole", (ROLE,)).fetchone()


def _case(admin_dsn: str, app_dsn: str, base: str, clients: int, rate: float,
          seconds: float) -> None:
    streams = [Stream(base) for _ in range(clients)]
    with psycopg.connect(admin_dsn, autocommit=True) as admin, \
            psycopg.connect(app_dsn, autocommit=True) as app:
        time.sleep(2)  # every stream is open and has had its first snapshot
        events0 = sum(s.events for s in streams)
        statements0, snapshots0 = _counts(admin)
        started = time.monotonic()
        end = started + seconds
        sent = 0
        while (now := time.monotonic()) < end:
            if rate and sent < (now - started) * rate:
                pgpool.enqueue(app, "noop", {}, queue="bench")
                sent += 1
            time.sleep(min(0.01, end - now) if rate else end - now)
        elapsed = time.monotonic() - started
        statements1, snapshots1 = _counts(admin)
        events = sum(s.events for s in streams) - events0
    for s in streams:
        s.close()
    print(f"{clients:>7} {sent / elapsed:>10.1f} {(statements1 - statements0) / elapsed:>12.1f} "
          f"{(snapshots1 - snapshots0) / elapsed:>11.2f} {events / clients / elapsed:>19.2f}",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
