"""Sessions that hold back vacuum (the xmin horizon, `pgpool.horizon`), and the dead rows
they keep."""

from __future__ import annotations

import psycopg
from commands import MARKER
from dbtools import one
from waits import wait_until

#: Dead rows `pile_dead_rows` leaves in pgpool_jobs: past `pgpool.horizon.MIN_DEAD`, where
#: the vacuum keeper vacuums and the horizon's warning counts them as piling up.
PILED = 20_500


def hold_horizon(dsn: str, how: str, application_name: str = "report-tool"
                 ) -> psycopg.Connection:
    """A session left idle in a transaction that holds back vacuum, as a forgotten ``psql``
    or a reporting job would: ``"write"`` (a transaction id: it wrote), or ``"snapshot"``
    (a REPEATABLE READ transaction that only read: a snapshot, no id). Its query has two
    lines and `MARKER` in the second. Close it (or roll back) to let go."""
    conn = psycopg.connect(dsn, application_name=application_name)
    if how == "snapshot":
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute(f"SELECT count(*) FROM pgpool_jobs -- the report\n-- {MARKER}")
    else:
        conn.execute(f"SELECT txid_current() -- the forgotten one\n-- {MARKER}")
    return conn


def dead_rows(db: psycopg.Connection, table: str = "pgpool_jobs") -> int:
    """The server's count of dead rows in ``table`` (what vacuum and pgpool read)."""
    return one(db, "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = %s::regclass",
               table)[0]


def pile_dead_rows(db: psycopg.Connection, rows: int = PILED) -> None:
    """Leave ``rows`` dead rows in pgpool_jobs, as a queue that ran as many jobs, and wait
    until the server's statistics count them (call it with the horizon held: then no
    vacuum removes them meanwhile)."""
    with db.transaction():
        db.execute("INSERT INTO pgpool_jobs (kind, payload) "
                   "SELECT 'piled', '{}' FROM generate_series(1, %s)", (rows,))
    db.execute("DELETE FROM pgpool_jobs WHERE kind = 'piled'")
    db.execute("SELECT pg_stat_force_next_flush()")
    wait_until(lambda: dead_rows(db) >= rows, "the statistics to count the dead rows")
