"""What an operator reads of an installation: registered hosts, the fleet's claims per
second against its budget, per-queue counts and the panels of the runbook (lag, claims/s
and claim p99, DLQ growth, autovacuum debt on the jobs table, who holds the xmin horizon),
work no live host can take, groups in progress and the successes kept per kind.

`collect` reads everything in one read-only REPEATABLE READ transaction, so every number
comes from the same snapshot and the same ``now()``. ``pgpool status`` prints it as text
(`pgpool.cli.status.render`) or as JSON (``--json``); the dashboard's snapshots are the
same dictionary.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import horizon as horizon_
from . import schedules
from .ops import TOP_SCOPES, limit_uses
from .sql import observe as sql
from .sql.fleet import COUNTED_LEASES, FLEET_BUDGET, STALE_AFTER_LEASES
from .sql.ops import LIMITS, PAUSED

if TYPE_CHECKING:
    import psycopg


def collect(conn: psycopg.Connection, horizon_warn: float | None = horizon_.HORIZON_WARN
            ) -> dict[str, Any]:
    """Status as a JSON-ready dict with keys ``hosts``, ``fleet``, ``queues`` and ``unhandled``.

    Each host reports ``jobs_claimed`` (since it started), ``claims_per_sec`` (between its
    last two beats; None before its second), ``max_claims_per_sec`` (the fleet budget it
    runs with; None from a pgpool older than schema version 3), ``claims_share`` (its share
    of that budget), ``claims_demand`` (what it asked for; None when ``wants_more``: its
    share held it back) and ``counted`` (whether the others still leave it its share; a
    crashed host stops counting about two beats after its last). ``fleet`` sums the live
    hosts' claims per second against the budget: ``fleet_budget`` is the one set with
    ``pgpool budget set`` (None if none), ``max_claims_per_sec`` the budget in force (the
    fleet's, else the smallest a live host runs with), ``budgets`` every distinct one live
    hosts run with, ``claims_share`` the counted hosts' shares added up, and ``warnings``
    says when live hosts disagree on the budget.

    ``queues`` counts, per queue: ``ready`` (due now), ``scheduled`` (``run_at`` in the
    future, including retries waiting out their backoff), ``running`` (claimed), ``dead``,
    ``parked`` (the database refused their ack or reap: they wait for an operator),
    ``parked_done`` (they succeeded, but the database refused to delete them: rows in state
    ``done``, not successes kept with ``keep=``), and ``paused``
    (``pgpool pause``; ``paused_at`` is when); ``lag`` (seconds since the oldest job due now
    was due; None when none is), ``dead_24h`` (dead letters added in the last 24 hours),
    ``claims_per_sec`` and ``claim_p99_ms`` (from the live hosts serving it: their rates
    added up, the worst of their recent claim p99s). ``vacuum`` is the autovacuum debt of
    ``pgpool_jobs``: ``dead_tuples``, ``live_tuples``, ``last_autovacuum_ago`` (seconds;
    None: never), ``settings_kept`` (the schema's per-table autovacuum settings are still
    set) and ``warning`` (the runbook's condition: `VACUUM_DEBT_FACTOR`). ``unhandled``
    lists (queue, kind) pairs with jobs due now that no live host both serves and has a
    handler for. A host is live until it is `STALE_AFTER_LEASES` leases past its last beat.
    ``schedules`` lists the periodic schedules (`pgpool.schedules`): ``declared`` (a live
    host's code declares it; ``declared_by`` names the host that last did, and
    ``declared_until`` how long that holds), ``last_run`` (the latest tick enqueued, and
    ``last_run_at`` when; None before the first), ``last_tick`` (every tick up to it is
    handled) and ``next_run`` (its next tick; None when not declared, since then nothing
    enqueues it). ``groups`` has ``in_progress`` (groups whose members have not all
    finished or whose callback has not run yet) and the `GROUPS_SHOWN` ``oldest`` of them:
    ``id`` (the callback's), ``total``, ``done``, ``dead`` (cancelled included),
    ``finished``, ``age`` (seconds) and ``callback`` (its state, as `pgpool.job_status`
    says it). ``succeeded`` lists, per kind with successes kept in ``pgpool_done``
    (``keep=``, ``--keep-done``, members of groups), ``last_hour`` (how many finished in
    the last hour, counted up to `SUCCEEDED_CAP`; ``last_hour_more``: more than that) and
    ``last_ago`` (seconds since the latest). ``limits`` lists the kinds with an operator's
    override of their limit or with jobs holding a limit's slots or a rate's rows
    (`pgpool.ops.limits`, `pgpool.ops.LimitUse.as_json`): ``override`` (None: the code's
    limit holds), ``running``, ``rate_used``, ``ready``, ``in_force`` (the limit the hosts
    apply; None: none known), ``waiting`` (the ready jobs waiting on it, which are not
    lag), and for limits by tenant or by key, ``scopes`` in use and the ``top`` busiest.
    Each queue's ``lag`` leaves out its jobs waiting on a limit, and ``waiting_on_limits``
    counts them. ``horizon`` is `pgpool.horizon.collect`'s:
    who holds back vacuum of pgpool's tables, their dead rows and vacuums, and the warning
    past ``horizon_warn`` seconds (None: never). ``conn`` must be in autocommit mode,
    outside a transaction.
    """
    params = {"stale_leases": STALE_AFTER_LEASES, "counted_leases": COUNTED_LEASES}
    with conn.transaction():
        conn.execute(sql.STATUS_SNAPSHOT)
        fleet = conn.execute(FLEET_BUDGET).fetchone()
        hosts = conn.execute(sql.STATUS_HOSTS, params).fetchall()
        queues = conn.execute(sql.STATUS_QUEUES, params).fetchall()
        vacuum = conn.execute(sql.STATUS_VACUUM).fetchone()
        unhandled = conn.execute(sql.STATUS_UNHANDLED, params).fetchall()
        paused: dict[str, datetime] = dict(conn.execute(PAUSED).fetchall())
        schedule_rows = conn.execute(sql.STATUS_SCHEDULES).fetchall()
        groups = conn.execute(sql.STATUS_GROUPS, {"limit": GROUPS_SHOWN}).fetchall()
        succeeded = conn.execute(sql.STATUS_SUCCEEDED, {"cap": SUCCEEDED_CAP}).fetchall()
        limits = conn.execute(LIMITS, {"top": TOP_SCOPES}).fetchall()
        horizon = horizon_.collect(conn, horizon_warn)
    host_list = [
        {
            "owner": owner, "hostname": hostname, "pid": pid, "procs": procs,
            "queues": host_queues, "kinds": kinds, "lease": lease,
            "started_at": started.isoformat(), "last_seen": seen.isoformat(),
            "last_seen_ago": round(ago, 3), "live": live, "counted": counted,
            "jobs_done": done, "jobs_failed": failed, "jobs_claimed": claimed,
            "claims_per_sec": _round(rate), "max_claims_per_sec": budget,
            "claims_share": _round(share),
            "claims_demand": None if demand == math.inf else _round(demand),
            "wants_more": demand == math.inf, "claim_p99_ms": _round(p99), "batch": batch,
        }
        for (owner, hostname, pid, procs, host_queues, kinds, lease, started, seen, ago,
             live, counted, done, failed, claimed, rate, budget, share, demand, p99,
             batch) in hosts
    ]
    return {
        "hosts": host_list,
        "fleet": _fleet(host_list, fleet[0] if fleet else None),
        "queues": _queues(queues, paused),
        "vacuum": _vacuum(vacuum),
        "horizon": horizon,
        "unhandled": [
            {"queue": q, "kind": kind, "ready": ready, "oldest_ago": round(ago, 3)}
            for q, kind, ready, ago in unhandled
        ],
        "schedules": [_schedule(row) for row in schedule_rows],
        "groups": {
            "in_progress": groups[0][0],
            "oldest": [
                {"id": gid, "total": total, "done": done, "dead": dead,
                 "finished": done + dead, "age": round(age, 3), "callback": callback}
                for _, gid, total, done, dead, age, callback in groups if gid is not None
            ],
        },
        "limits": [use.as_json() for use in limit_uses(limits)],
        "succeeded": [
            {"kind": kind, "last_hour": min(count, SUCCEEDED_CAP),
             "last_hour_more": count > SUCCEEDED_CAP, "last_ago": _round(ago)}
            for kind, count, ago in succeeded
        ],
    }


#: The oldest groups in progress that status lists (all are counted).
GROUPS_SHOWN = 5
#: Successes per kind in the last hour are counted up to this many (then "10000+"): a
#: status, and the dashboard's snapshot every few seconds, stay cheap however many are kept.
SUCCEEDED_CAP = 10_000


def _schedule(row: tuple[Any, ...]) -> dict[str, Any]:
    (name, cron, timezone, kind, queue, catch_up, last_tick, last_run, last_run_at, declared,
     declared_until, declared_by, now) = row
    next_run = None
    if declared:
        try:
            next_run = schedules.next_tick(cron, schedules.zone(timezone), last_tick)
        except (ValueError, KeyError):  # written by a pgpool version that reads more syntax
            next_run = None
    return {
        "name": name, "cron": cron, "timezone": timezone, "kind": kind, "queue": queue,
        "catch_up": catch_up, "declared": declared, "declared_by": declared_by,
        "declared_until": declared_until.isoformat(),
        "last_tick": last_tick.isoformat(), "last_run": _iso(last_run),
        "last_run_at": _iso(last_run_at), "next_run": _iso(next_run),
        "next_run_in": None if next_run is None else round((next_run - now).total_seconds(), 3),
    }


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _queues(rows: list[tuple[Any, ...]], paused: dict[str, datetime]) -> list[dict[str, Any]]:
    """Per-queue counts, each with whether it is paused (and since when); a paused queue
    with no jobs and no host is listed too."""
    listed = {row[0] for row in rows}
    rows = rows + [(q, 0, 0, 0, 0, 0, 0, None, 0, None, None, 0)
                   for q in paused if q not in listed]
    return [
        {"queue": q, "ready": ready, "scheduled": scheduled, "running": running,
         "dead": dead, "parked": parked, "parked_done": done, "paused": q in paused,
         "paused_at": paused[q].isoformat() if q in paused else None,
         "lag": _round(lag), "dead_24h": dead_24h, "claims_per_sec": _round(rate),
         "claim_p99_ms": _round(p99), "waiting_on_limits": on_limits}
        for (q, ready, scheduled, running, dead, parked, done, lag, dead_24h, rate,
             p99, on_limits) in rows
    ]


#: The runbook's vacuum-debt condition (seed 004: "dead tuples climbing and autovacuum
#: lagging"): dead tuples past ten times the table's own autovacuum trigger (50 + 2% of the
#: live ones, as the schema sets it) while autovacuum has not finished on it for
#: `VACUUM_LAGGING` seconds, or the per-table settings are gone.
VACUUM_DEBT_FACTOR = 10
VACUUM_LAGGING = 600.0


def _vacuum(row: tuple[Any, ...] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    dead, live, ago, kept = row
    trigger = 50 + 0.02 * live
    lagging = ago is None or ago > VACUUM_LAGGING
    warning = None
    if dead > VACUUM_DEBT_FACTOR * trigger and lagging:
        warning = (f"vacuum debt: {dead} dead tuples in pgpool_jobs (autovacuum triggers at "
                   f"{trigger:.0f}) and no autovacuum for "
                   f"{'ever' if ago is None else horizon_.span(ago)}: run "
                   "VACUUM (VERBOSE) pgpool_jobs, then see why autovacuum falls behind "
                   "(long transactions, cost limits); do not scale the host or add an index")
    elif not kept:
        warning = ("pgpool_jobs lost its autovacuum settings (autovacuum_vacuum_scale_factor "
                   "= 0.02 and others, see Tables and SQL in the docs): a migration or an "
                   "ALTER TABLE reset them; set them again")
    return {"dead_tuples": dead, "live_tuples": live,
            "last_autovacuum_ago": _round(ago), "settings_kept": kept, "warning": warning}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _fleet(hosts: list[dict[str, Any]], fleet_budget: float | None) -> dict[str, Any]:
    live = [h for h in hosts if h["live"]]  # a stale host claims nothing any more
    budgets = sorted({h["max_claims_per_sec"] for h in live} - {None})
    warnings = []
    if fleet_budget is not None and set(budgets) - {fleet_budget}:
        warnings.append(
            f"live hosts run with {budgets_text(budgets)} claims/s, but the fleet budget is "
            f"{budget_text(fleet_budget)}: a host takes it at its next beat (one that does not "
            "runs a pgpool older than this one)")
    elif fleet_budget is None and len(budgets) > 1:
        warnings.append(
            f"live hosts run with different budgets ({budgets_text(budgets)} claims/s, from "
            "their --max-claims-per-sec): set one for the fleet with `pgpool budget set N`")
    return {
        "live_hosts": len(live),
        "counted_hosts": sum(h["counted"] for h in hosts),
        "claims_per_sec": round(sum(h["claims_per_sec"] or 0.0 for h in live), 3),
        "fleet_budget": fleet_budget,
        "max_claims_per_sec": fleet_budget or (budgets[0] if budgets else None),
        "budgets": budgets,
        "claims_share": round(sum(h["claims_share"] or 0.0 for h in hosts if h["counted"]), 3),
        "warnings": warnings,
    }


def budget_text(per_sec: float | None) -> str:
    """A claims-per-second budget as status shows it: 500, 2.5, or - for none."""
    if per_sec is None:
        return "-"
    return str(int(per_sec)) if per_sec.is_integer() else f"{per_sec:g}"


def budgets_text(values: list[float]) -> str:
    return ", ".join(map(budget_text, values))
