"""Why the queue slowed down: the xmin horizon of pgpool's tables, and who holds it.

A vacuum removes only the rows that died before the oldest transaction that may still see
them: the horizon. A session that keeps a transaction (or a REPEATABLE READ snapshot) open,
a prepared transaction nobody finished, a replication slot a standby's feedback reached or
a standby's ``hot_standby_feedback`` holds it back, and from then on every claimed, acked
or retried job leaves rows in ``pgpool_jobs`` that no vacuum can remove: claims walk over
them, and slow down.

`collect` reads, on the caller's connection, the holders of that horizon
(`sql.HORIZON_HOLDERS` has PostgreSQL's rule), the dead rows and vacuums of pgpool's
tables, and says whether to warn: when the oldest holder is older than ``--horizon-warn``
(default `HORIZON_WARN`) and the dead rows of ``pgpool_jobs`` pile up past where the
vacuum keeper vacuums (`MIN_DEAD`, `SCALE`), the point from which claims slow
(``piling_up``). The warning names the holder and the statement that ends it; nothing
here runs it. A holder whose age the server keeps no clock for (a standby's feedback, an
active slot) counts as old once the rows pile up.

What a surface shows of a holder: see the Security guide. `collect` returns everything
the connection's role may read; `for_dashboard` takes away what a read-only dashboard
must not show.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from .sql import observe as sql
from .sql.fleet import STALE_AFTER_LEASES

if TYPE_CHECKING:
    import psycopg

#: Dead rows of ``pgpool_jobs`` (row versions: a job claimed and acked leaves two) from
#: which claims slow, so that the vacuum keeper (`pgpool.host.parts.vacuum`) vacuums, and the
#: share of the live rows: with a deep backlog a vacuum reads all of its indexes, so it
#: comes less often. Past them, with the horizon held, the rows are piling up.
MIN_DEAD: Final = 20_000
SCALE: Final = 0.05
#: ``--horizon-warn``'s default, seconds.
HORIZON_WARN: Final = 300.0
#: The holders listed, the oldest first (of those holding back pgpool's tables, and of
#: those holding back the catalogs only).
HOLDERS_SHOWN: Final = 5
#: pgpool's tables whose rows die: a claim, an ack, a beat, a retention pass.
TABLES: Final = ("pgpool_jobs", "pgpool_dead", "pgpool_done", "pgpool_groups", "pgpool_hosts",
                 "pgpool_schedules")
#: What a role without pg_read_all_stats is told of the sessions it may not inspect.
HIDDEN_HINT: Final = "grant pg_read_all_stats to see it"
#: Holders younger than this (or than ``--horizon-warn``, if shorter) are not shown on a
#: screen, status's or the dashboard's (a busy database always has some short transaction
#: holding the horizon for a moment); ``--json`` and the snapshot list them.
SHOWN_AFTER: Final = 60.0
#: A query's first line is cut to this many characters.
QUERY_CHARS: Final = 200


def collect(conn: psycopg.Connection, warn_after: float | None) -> dict[str, Any]:
    """The horizon as a JSON-ready dict: ``age_transactions`` and ``age_seconds`` of the
    oldest holder of pgpool's tables (None: none; ``age_seconds`` also when the server
    keeps no clock for it), ``holders`` (the `HOLDERS_SHOWN` oldest, each with ``kind``,
    ``age_transactions``, ``age_seconds``, ``pid``, ``user``, ``application_name``,
    ``client_addr``, ``state``, ``query_seconds``, ``query`` (its first line), ``name``
    (a slot's or a prepared transaction's), ``slot_type``, ``end`` (the statement that ends
    it, or None), ``advice`` (what to do, in words) and ``description`` (`describe`'s
    line)), ``catalog_holders`` (logical slots: they hold back the catalogs only),
    ``hidden_sessions`` (sessions of the database this
    role may not inspect), ``tables`` (dead and live rows and vacuums of each of `TABLES`),
    ``piling_up`` (the dead rows of ``pgpool_jobs`` are past ``pile_at``), ``claim_p99_ms``
    (the worst of the live hosts'), ``warn_after``, ``shown_after`` (`SHOWN_AFTER`, or
    ``warn_after`` if shorter) and ``warning`` (None, or its text).
    Runs in the caller's transaction, if any."""
    rows = conn.execute(sql.HORIZON_HOLDERS, {"limit": HOLDERS_SHOWN}).fetchall()
    hidden = _one(conn, sql.HORIZON_HIDDEN)
    tables = [
        {"table": name, "dead_tuples": dead, "live_tuples": live,
         "last_vacuum_ago": _round(vacuum_ago), "last_autovacuum_ago": _round(auto_ago),
         "vacuums": vacuums, "autovacuums": autovacuums}
        for name, dead, live, vacuum_ago, auto_ago, vacuums, autovacuums
        in conn.execute(sql.TABLES_VACUUM, {"tables": list(TABLES)}).fetchall()
    ]
    p99 = _one(conn, sql.HORIZON_CLAIM_P99, {"stale_leases": STALE_AFTER_LEASES})
    held = [holder(row) for row in rows if row[1] == "tables"]
    oldest = held[0] if held else None
    jobs = _jobs_table(tables)
    pile_at = None if jobs is None else max(MIN_DEAD, round(SCALE * jobs["live_tuples"]))
    report = {
        "age_transactions": None if oldest is None else oldest["age_transactions"],
        "age_seconds": None if oldest is None else oldest["age_seconds"],
        "holders": held,
        "catalog_holders": [holder(row) for row in rows if row[1] != "tables"],
        "hidden_sessions": hidden,
        "tables": tables,
        "pile_at": pile_at,
        "piling_up": jobs is not None and jobs["dead_tuples"] >= max(MIN_DEAD, pile_at or 0),
        "dead_rows_per_min": None,  # `DeadRowsTrend`'s, where reports follow each other
        "claim_p99_ms": _round(p99),
        "warn_after": warn_after,
        "shown_after": min(SHOWN_AFTER, warn_after or SHOWN_AFTER),
    }
    report["warning"] = _warning(report, jobs)
    return report


def _one(conn: psycopg.Connection, query: str, params: dict[str, Any] | None = None) -> Any:
    """The one value of a query that returns one row."""
    row = conn.execute(query, params).fetchone()
    assert row is not None  # an aggregate without GROUP BY
    return row[0]


def _jobs_table(tables: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((t for t in tables if t["table"] == "pgpool_jobs"), None)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def holder(row: tuple[Any, ...]) -> dict[str, Any]:
    """A holder as `collect` lists it, from a row of `sql.HORIZON_HOLDERS`."""
    (kind, _, age_xids, age_seconds, pid, user, application, client, state, query_seconds,
     query, name, slot_type, end) = row
    found = {
        "kind": kind, "age_transactions": age_xids,
        "age_seconds": _round(age_seconds), "pid": pid, "user": user,
        "application_name": application or None, "client_addr": client, "state": state,
        "query_seconds": _round(query_seconds),
        # Empty with track_activities off: no text, rather than an empty one.
        "query": query[:QUERY_CHARS] if query else None,
        "name": name, "slot_type": slot_type, "end": end,
    }
    found["advice"] = _advice(found)
    found["description"] = describe(found)
    return found


def _advice(h: dict[str, Any]) -> str:
    """What ends the hold, in words, with the statement where there is one."""
    kind = h["kind"]
    if kind == "backend":
        return (f"end its transaction: {h['end']} (or ask its owner to commit or roll "
                "back)")
    if kind == "prepared":
        return (f"finish it: {h['end']} (COMMIT PREPARED instead if its work must stand; "
                "ask whoever prepared it)")
    if kind == "slot" and h["state"] == "active":
        return ("a standby streaming through it holds it with hot_standby_feedback: end the "
                "long query on that standby, or set hot_standby_feedback = off there; if the "
                f"standby is gone for good, stop it and run {h['end']}")
    if kind == "slot":
        return f"drop it if no standby or subscriber will use it again: {h['end']}"
    return ("end the long query on that standby, or set hot_standby_feedback = off there "
            "(its queries may then be cancelled by replication conflicts; "
            "max_standby_streaming_delay bounds how long one may hold replay)")


def describe(h: dict[str, Any]) -> str:
    """One line naming a holder, without its query or client address (see the module)."""
    kind = h["kind"]
    if kind == "backend":
        parts = [f'user "{h["user"]}"']
        if h["application_name"]:
            parts.append(f'application "{h["application_name"]}"')
        parts.append(h["state"] or "state unknown")
        if h["age_seconds"] is not None:
            parts.append(f"transaction open {span(h['age_seconds'])}")
        return f"backend pid {h['pid']} ({', '.join(parts)})"
    if kind == "prepared":
        return (f"prepared transaction {h['name']!r} (owner \"{h['user']}\", prepared "
                f"{span(h['age_seconds'])} ago)")
    if kind == "slot":
        what = f"{h['slot_type']} replication slot \"{h['name']}\""
        if h["state"] == "active":
            standby = f', standby "{h["application_name"]}"' if h["application_name"] else ""
            return f"{what} (active: walsender pid {h['pid']}{standby})"
        since = "" if h["age_seconds"] is None else f" for {span(h['age_seconds'])}"
        return f"{what} (inactive{since})"
    standby = f' "{h["application_name"]}"' if h["application_name"] else ""
    return f"the hot_standby_feedback of standby{standby} (walsender pid {h['pid']})"


def _warning(report: dict[str, Any], jobs: dict[str, Any] | None) -> str | None:
    holders = report["holders"]
    warn_after = report["warn_after"]
    if not warn_after or not holders or not report["piling_up"] or jobs is None:
        return None
    oldest = holders[0]
    seconds = oldest["age_seconds"]
    if seconds is not None and seconds < warn_after:
        return None
    age = (f"{span(seconds)} old ({oldest['age_transactions']:,} transactions)"
           if seconds is not None else
           f"{oldest['age_transactions']:,} transactions old (the server keeps no clock for "
           "it)")
    p99 = report["claim_p99_ms"]
    cost = "" if p99 is None else f" (claim p99 now {p99:.1f}ms)"
    return (f"the xmin horizon of pgpool's tables is {age}, held by {describe(oldest)}: "
            f"vacuum cannot remove the rows that died since, and pgpool_jobs has "
            f"{jobs['dead_tuples']:,} dead rows that every claim walks over{cost}. "
            f"{oldest['advice'][0].upper()}{oldest['advice'][1:]}. pgpool never does it for "
            "you; see \"The queue slowed down\" in the operating guide")


def for_dashboard(report: dict[str, Any], *, allow_payloads: bool) -> dict[str, Any]:
    """``report`` as a dashboard shows it: a holder's query text and client address only
    with ``--allow-payloads`` (the query may quote user data)."""
    if allow_payloads:
        return report
    hidden = {"query": None, "client_addr": None}
    return {**report,
            "holders": [{**h, **hidden} for h in report["holders"]],
            "catalog_holders": [{**h, **hidden} for h in report["catalog_holders"]]}


def span(seconds: float) -> str:
    """A duration, short: 45s, 12m, 3h, 2d."""
    s = max(0, round(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172_800:
        return f"{s // 3600}h"
    return f"{s // 86_400}d"


def run_time(seconds: float) -> str:
    """A run time (a job's, in the hosts' logs): precise below two minutes (0.0042ms,
    0.4ms, 12.3ms, 1.25s, 14.2s), then as `span`."""
    if seconds < 0.01:
        return f"{seconds * 1000:.2g}ms"
    if seconds < 1:
        return f"{seconds * 1000:.1f}ms"
    if seconds < 10:
        return f"{seconds:.2f}s"
    return f"{seconds:.1f}s" if seconds < 120 else span(seconds)


class DeadRowsTrend:
    """How fast the dead rows of ``pgpool_jobs`` grow, per minute, over the reports of the
    last `WINDOW` seconds: what a watch (`pgpool status --watch`, the dashboard) adds to
    each report, one report alone having no trend."""

    #: Seconds of reports the trend is taken over, and the least span that makes one
    #: (the server's counts move about once a second).
    WINDOW: Final = 60.0
    LEAST: Final = 5.0

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, report: dict[str, Any], at: float | None = None) -> None:
        """Record ``report`` (a `collect` result) taken at ``at`` (`time.monotonic()`), and
        set its ``dead_rows_per_min`` (None until the reports span `LEAST` seconds)."""
        now = time.monotonic() if at is None else at
        jobs = _jobs_table(report["tables"])
        report["dead_rows_per_min"] = None
        if jobs is None:
            return
        self._samples.append((now, jobs["dead_tuples"]))
        while self._samples[0][0] < now - self.WINDOW:
            self._samples.popleft()
        first_at, first = self._samples[0]
        if now - first_at >= self.LEAST:
            report["dead_rows_per_min"] = round((jobs["dead_tuples"] - first) * 60
                                                / (now - first_at), 1)
