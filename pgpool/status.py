"""``pgpool status``: registered hosts, the fleet's claims per second against its budget,
per-queue counts, and work no live host can take.

`collect` reads everything in one read-only REPEATABLE READ transaction, so every number
comes from the same snapshot and the same ``now()``. `render` formats the result as text;
the same dictionary, printed as JSON, is ``pgpool status --json``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg

from . import sql
from .lease import STALE_AFTER_LEASES


def collect(conn: psycopg.Connection) -> dict[str, Any]:
    """Status as a JSON-ready dict with keys ``hosts``, ``fleet``, ``queues`` and ``unhandled``.

    Each host reports ``jobs_claimed`` (since it started), ``claims_per_sec`` (between its
    last two beats; None before its second) and ``max_claims_per_sec`` (the fleet budget it
    runs with; None from a pgpool older than schema version 3). ``fleet`` sums the live
    hosts' claims per second against their budget: ``max_claims_per_sec`` is the smallest
    budget a live host reports, and ``budgets`` lists every distinct one (more than one
    means the hosts were started with different ``--max-claims-per-sec``).

    ``queues`` counts, per queue: ``ready`` (due now), ``scheduled`` (``run_at`` in the
    future, including retries waiting out their backoff), ``running`` (claimed), ``dead``,
    ``parked`` (the database refused their ack or reap: they wait for an operator),
    ``done`` (succeeded, kept because the database refused to delete them), and ``paused``
    (``pgpool pause``; ``paused_at`` is when). ``unhandled`` lists (queue, kind) pairs with
    jobs due now that no live host both serves and has a handler for. A host is live until
    it is `STALE_AFTER_LEASES` leases past its last beat. ``conn`` must be in autocommit
    mode, outside a transaction.
    """
    params = {"stale_leases": STALE_AFTER_LEASES}
    with conn.transaction():
        conn.execute(sql.STATUS_SNAPSHOT)
        hosts = conn.execute(sql.STATUS_HOSTS, params).fetchall()
        queues = conn.execute(sql.STATUS_QUEUES).fetchall()
        unhandled = conn.execute(sql.STATUS_UNHANDLED, params).fetchall()
        paused = dict(conn.execute(sql.PAUSED).fetchall())
    host_list = [
        {
            "owner": owner, "hostname": hostname, "pid": pid, "procs": procs,
            "queues": host_queues, "kinds": kinds, "lease": lease,
            "started_at": started.isoformat(), "last_seen": seen.isoformat(),
            "last_seen_ago": round(ago, 3), "live": live,
            "jobs_done": done, "jobs_failed": failed, "jobs_claimed": claimed,
            "claims_per_sec": None if rate is None else round(rate, 3),
            "max_claims_per_sec": budget,
        }
        for (owner, hostname, pid, procs, host_queues, kinds, lease, started, seen, ago,
             live, done, failed, claimed, rate, budget) in hosts
    ]
    return {
        "hosts": host_list,
        "fleet": _fleet(host_list),
        "queues": _queues(queues, paused),
        "unhandled": [
            {"queue": q, "kind": kind, "ready": ready, "oldest_ago": round(ago, 3)}
            for q, kind, ready, ago in unhandled
        ],
    }


def _queues(rows: list[tuple[Any, ...]], paused: dict[str, datetime]) -> list[dict[str, Any]]:
    """Per-queue counts, each with whether it is paused (and since when); a paused queue
    with no jobs and no host is listed too."""
    listed = {row[0] for row in rows}
    rows = rows + [(q, 0, 0, 0, 0, 0, 0) for q in paused if q not in listed]
    return [
        {"queue": q, "ready": ready, "scheduled": scheduled, "running": running,
         "dead": dead, "parked": parked, "done": done, "paused": q in paused,
         "paused_at": paused[q].isoformat() if q in paused else None}
        for q, ready, scheduled, running, dead, parked, done in rows
    ]


def _fleet(hosts: list[dict[str, Any]]) -> dict[str, Any]:
    live = [h for h in hosts if h["live"]]  # a stale host claims nothing any more
    budgets = sorted({h["max_claims_per_sec"] for h in live} - {None})
    return {
        "live_hosts": len(live),
        "claims_per_sec": round(sum(h["claims_per_sec"] or 0.0 for h in live), 3),
        "max_claims_per_sec": budgets[0] if budgets else None,
        "budgets": budgets,
    }


def render(status: dict[str, Any]) -> str:
    """The human-readable report of a `collect` result."""
    hosts = status["hosts"]
    live = sum(h["live"] for h in hosts)
    out = [f"hosts: {live} live" + (f", {len(hosts) - live} stale" if live < len(hosts) else "")]
    out += _table(
        ("HOST", "PID", "PROCS", "QUEUES", "LAST SEEN", "STARTED", "DONE", "FAILED",
         "CLAIMED", "CLAIMS/S", "BUDGET"),
        [(h["hostname"], h["pid"], h["procs"], ",".join(h["queues"]),
          _ago(h["last_seen_ago"]) + ("" if h["live"] else " (stale)"),
          _utc(h["started_at"]), h["jobs_done"], h["jobs_failed"], h["jobs_claimed"],
          _rate(h["claims_per_sec"]), _budget(h["max_claims_per_sec"])) for h in hosts],
    )
    out.append(_fleet_line(status["fleet"]))
    out.append("")
    out.append("queues:")
    out += _table(
        ("QUEUE", "READY", "SCHEDULED", "RUNNING", "DEAD", "PARKED", "KEPT"),
        [(q["queue"] + (" (paused)" if q["paused"] else ""), q["ready"], q["scheduled"],
          q["running"], q["dead"], q["parked"], q["done"]) for q in status["queues"]],
    )
    parked = sum(q["parked"] + q["done"] for q in status["queues"])
    if parked:
        out.append(f"warning: the database refused to ack or reap {parked} jobs: PARKED "
                   "wait for an operator, KEPT succeeded but could not be deleted; their "
                   "last_error says why")
    out.append("")
    out.append("kinds waiting with no live handler:")
    out += _table(
        ("QUEUE", "KIND", "READY", "OLDEST DUE"),
        [(u["queue"], u["kind"], u["ready"], _ago(u["oldest_ago"]))
         for u in status["unhandled"]],
    )
    return "\n".join(out)


def _fleet_line(fleet: dict[str, Any]) -> str:
    line = f"fleet: {_rate(fleet['claims_per_sec'])} claims/s"
    budget = fleet["max_claims_per_sec"]
    if budget is None:
        return line + ("; no live host reports a budget" if fleet["live_hosts"] else
                       " (no live hosts)")
    line += (f" of a {_budget(budget)} claims/s budget "
             f"({100 * fleet['claims_per_sec'] / budget:.0f}%)")
    if len(fleet["budgets"]) > 1:
        line += ("; the smallest: live hosts run with different budgets, "
                 + ", ".join(map(_budget, fleet["budgets"])))
    return line


def _rate(per_sec: float | None) -> str:
    return "-" if per_sec is None else f"{per_sec:.1f}"


def _budget(per_sec: float | None) -> str:
    if per_sec is None:
        return "-"
    return str(int(per_sec)) if per_sec.is_integer() else f"{per_sec:g}"


def _table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> list[str]:
    if not rows:
        return ["  (none)"]
    cells = [header, *[tuple(map(str, r)) for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in cells]


def _ago(seconds: float) -> str:
    s = max(0, round(seconds))
    if s < 120:
        return f"{s}s ago"
    if s < 7200:
        return f"{s // 60}m ago"
    if s < 172_800:
        return f"{s // 3600}h ago"
    return f"{s // 86_400}d ago"


def _utc(iso: str) -> str:
    return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
