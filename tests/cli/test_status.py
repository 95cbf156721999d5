"""The host registry (``pgpool_hosts``) and ``pgpool status``, against real PostgreSQL.

Dispatchers are real ``pgpool run`` processes; the status tests seed rows directly so every
expected count is known exactly.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess

import psycopg
import pytest
from claims import in_registry
from commands import (
    RUN,
    UNREACHABLE,
    assert_user_error,
    pgpool_cmd,
    pgpool_env,
    run_pgpool,
    status_json,
)
from dbtools import make_version_1_schema, one
from places import HANDLERS
from processes import start_pgpool
from psycopg_pool import AsyncConnectionPool
from waits import wait_until

import pgpool
from pgpool import registry
from pgpool.horizon import TABLES
from pgpool.host.dispatcher import make_owner
from pgpool.host.lease import Lease
from pgpool.host.parts.hosts import HostRegistry
from pgpool.sql.fleet import STALE_AFTER_LEASES

HOST_ROW = "SELECT owner, hostname, pid, procs, queues, kinds, lease FROM pgpool_hosts"


def handler_kinds() -> list[str]:
    import testjobs  # noqa: F401 - registers its handlers in this process

    return sorted(k for k, h in registry.registered().items() if h.fn.__module__ == "testjobs")


def host_rows(db: psycopg.Connection) -> list[tuple]:
    return db.execute(HOST_ROW + " ORDER BY owner").fetchall()


# --- the registry, through real dispatchers -----------------------------------------------


def test_a_running_dispatcher_is_registered_and_deregisters_on_sigterm(db, dsn, record_dir):
    host = start_pgpool(dsn, *RUN, "--procs", "2", "--queue", "default", "--queue", "q2",
                        "--lease", "1", record_dir=record_dir)
    (row,) = wait_until(lambda: host_rows(db), "the dispatcher to register")
    owner, hostname, pid, procs, queues, kinds, lease = row
    assert (hostname, pid, procs, queues, lease) == (
        socket.gethostname(), host.pid, 2, ["default", "q2"], 1.0)
    assert kinds == handler_kinds()
    # Readable host and pid, then 128 random bits: containers share hostnames and pids.
    assert re.fullmatch(rf"{re.escape(hostname)}:{host.pid}:[0-9a-f]{{32}}", owner), owner
    # The row is the one its log announces.
    started = host.event("started")
    assert (started["owner"], started["procs"], started["queues"], started["kinds"]) == (
        owner, 2, ["default", "q2"], kinds)

    # It keeps beating: the row follows the work the host does.
    pgpool.enqueue(db, "record", {})
    wait_until(lambda: one(db, "SELECT jobs_done FROM pgpool_hosts") == (1,),
               "the finished job to be counted in pgpool_hosts")
    report = status_json(dsn)
    (seen,) = report["hosts"]
    assert (seen["owner"], seen["pid"], seen["live"], seen["jobs_done"], seen["jobs_claimed"],
            seen["max_claims_per_sec"]) == (owner, host.pid, True, 1, 1, 10_000)
    assert isinstance(seen["batch"], int) and seen["batch"] >= 1, seen
    # Measured between its last two beats: it has beaten since the job finished.
    assert seen["claims_per_sec"] >= 0
    # Alone, it has the whole budget.
    assert (seen["counted"], seen["claims_share"]) == (True, 10_000)
    assert report["fleet"] == {"live_hosts": 1, "counted_hosts": 1,
                               "claims_per_sec": seen["claims_per_sec"], "fleet_budget": None,
                               "max_claims_per_sec": 10_000, "budgets": [10_000],
                               "claims_share": 10_000, "warnings": []}
    done = run_pgpool(dsn, "status")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    ((*_, claimed, per_sec, share, budget),) = section(done.stdout, lines[0])
    assert (claimed, share, budget) == ("1", "10000.0", "10000") and float(per_sec) >= 0
    assert re.fullmatch(r"fleet: [0-9.]+ claims/s of a 10000 claims/s budget \(\d+%\), the "
                        r"hosts' own \(none set with `pgpool budget set`\)", lines[3]), lines[3]

    assert host.stop() == 0, host.stderr
    assert host_rows(db) == []


def test_owner_ids_differ_between_containers_of_one_hostname_all_running_as_pid_1(
        monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "worker")
    monkeypatch.setattr(os, "getpid", lambda: 1)
    owners = {make_owner() for _ in range(1000)}
    assert len(owners) == 1000
    assert all(re.fullmatch(r"worker:1:[0-9a-f]{32}", o) for o in owners), owners


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_a_killed_dispatcher_stays_listed_until_stale_then_another_host_prunes_it(db, dsn):
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--lease", "1")
    ((owner, *_),) = wait_until(lambda: host_rows(db), "the dispatcher to register")
    host.kill()
    host.wait()
    assert [r[0] for r in host_rows(db)] == [owner]  # a hard death cannot deregister

    wait_until(lambda: one(db, "SELECT last_seen < now() - make_interval(secs => %s * lease) "
                               "FROM pgpool_hosts", STALE_AFTER_LEASES)[0],
               "the dead host's row to go stale")
    (seen,) = status_json(dsn)["hosts"]
    assert (seen["owner"], seen["live"]) == (owner, False)

    # Any dispatcher prunes stale hosts when it starts (and every lease/3 while it runs).
    # Only this burst host runs, and deregistering deletes its own row alone: the dead
    # host's row gone afterwards is its prune.
    done = run_pgpool(dsn, *RUN, "--procs", "1", "--lease", "1", "--burst")
    assert done.returncode == 0, done.stderr
    assert host_rows(db) == []


# --- HostRegistry's contract, called directly ---------------------------------------------


def insert_host(db: psycopg.Connection, owner: str, *, lease: float, seen_ago: float,
                queues: tuple[str, ...] = ("default",), kinds: tuple[str, ...] = ("record",),
                claimed: int = 0, rate: float | None = None, budget: float | None = None,
                p99: float | None = None) -> None:
    db.execute(
        "INSERT INTO pgpool_hosts (owner, hostname, pid, procs, queues, kinds, lease, "
        "started_at, last_seen, jobs_claimed, claims_per_sec, max_claims_per_sec, "
        "claim_p99_ms) "
        "VALUES (%s, split_part(%s, ':', 1), 1, 4, %s, %s, %s, now() - interval '1 day', "
        "now() - make_interval(secs => %s), %s, %s, %s, %s)",
        (owner, owner, list(queues), list(kinds), lease, seen_ago, claimed, rate, budget,
         p99))


def registry_for(pool: AsyncConnectionPool, owner: str) -> HostRegistry:
    return HostRegistry(pool, owner, procs=3, queues=["q"], kinds=["b", "a"], lease=Lease(10),
                        max_claims_per_sec=400, counters=lambda: (7, 2, 9, 1.5, 5))


def test_prune_uses_each_hosts_own_lease_and_is_safe_to_run_concurrently(db, dsn):
    insert_host(db, "stale:1:a", lease=1, seen_ago=5)  # 5 s > 3 x 1 s
    insert_host(db, "slow:2:b", lease=10, seen_ago=5)  # 5 s < 3 x 10 s: still live
    insert_host(db, "fresh:3:c", lease=1, seen_ago=0)

    async def prune_twice(pool: AsyncConnectionPool) -> list[list[str]]:
        a, b = registry_for(pool, "x:1:a"), registry_for(pool, "y:2:b")
        return list(await asyncio.gather(a.prune(), b.prune()))

    results = in_registry(dsn, prune_twice)
    assert sorted(results) == [[], ["stale:1:a"]]  # pruned once, by one of them
    assert [r[0] for r in host_rows(db)] == ["fresh:3:c", "slow:2:b"]


def test_beat_recreates_a_pruned_row_and_nothing_writes_it_after_deregister(db, dsn):
    async def lifecycle(pool: AsyncConnectionPool) -> list[object]:
        hosts = registry_for(pool, "me:9:z")
        await hosts.register()
        first = one(db, "SELECT procs, queues, kinds, lease, jobs_done, jobs_failed, "
                        "jobs_claimed, max_claims_per_sec, batch, started_at FROM pgpool_hosts")
        db.execute("DELETE FROM pgpool_hosts")  # as if pruned while cut off
        await hosts.beat()
        again = one(db, "SELECT started_at FROM pgpool_hosts")
        await hosts.deregister()
        gone = one(db, "SELECT count(*) FROM pgpool_hosts")
        await hosts.beat()
        return [first, again, gone, one(db, "SELECT count(*) FROM pgpool_hosts")]

    first, again, gone, after = in_registry(dsn, lifecycle)
    assert first[:9] == (3, ["q"], ["a", "b"], 10.0, 7, 2, 9, 400.0, 5)
    assert again == (first[9],)  # same started_at: the same run, back in the registry
    assert gone == after == (0,)


def test_each_beat_records_the_claims_per_second_since_the_last_beat_written(db, dsn):
    claimed, clock = [0], [100.0]
    claims = "SELECT jobs_claimed, claims_per_sec FROM pgpool_hosts"

    async def beats(pool: AsyncConnectionPool) -> list[object]:
        hosts = HostRegistry(pool, "me:9:z", procs=1, queues=["q"], kinds=["a"], lease=Lease(10),
                             max_claims_per_sec=400, counters=lambda: (0, 0, claimed[0], None, 1),
                             clock=lambda: clock[0])
        await hosts.register()
        seen = [one(db, claims)]  # no interval yet
        claimed[0], clock[0] = 150, 100.5
        await hosts.beat()
        seen.append(one(db, claims))
        # A beat the database refuses writes nothing; the next one covers both intervals.
        claimed[0], clock[0] = 250, 101.0
        db.execute("ALTER TABLE pgpool_hosts RENAME TO pgpool_hosts_away")
        try:
            await hosts.beat()
        except psycopg.errors.UndefinedTable:
            seen.append("refused")
        db.execute("ALTER TABLE pgpool_hosts_away RENAME TO pgpool_hosts")
        claimed[0], clock[0] = 400, 102.0
        await hosts.beat()
        return [*seen, one(db, claims)]

    assert in_registry(dsn, beats) == [(0, None), (150, 300.0), "refused", (400, 250 / 1.5)]


# --- pgpool status ------------------------------------------------------------------------


def seed(db: psycopg.Connection) -> None:
    """Jobs in three queues and two registered hosts, one live and one stale."""
    def jobs(n: int, queue: str, kind: str, *, due_in: float = -60,
             running_on: str | None = None) -> None:
        db.execute(
            "INSERT INTO pgpool_jobs (queue, kind, payload, state, run_at, attempts, "
            "locked_by, lease_until) "
            "SELECT %(queue)s, %(kind)s, '{}', "
            "CASE WHEN %(owner)s::text IS NULL THEN 'ready' ELSE 'running' END, "
            "now() + make_interval(secs => %(due_in)s), "
            "CASE WHEN %(owner)s::text IS NULL THEN 0 ELSE 1 END, %(owner)s, "
            "CASE WHEN %(owner)s::text IS NOT NULL THEN now() + interval '1 hour' END "
            "FROM generate_series(1, %(n)s)",
            {"queue": queue, "kind": kind, "due_in": due_in, "owner": running_on, "n": n})

    jobs(3, "default", "record")
    jobs(2, "default", "record", due_in=3600)
    jobs(1, "default", "record", running_on="live:1:aa")
    jobs(2, "default", "orphan")
    jobs(1, "q2", "record")
    # One parked job, one succeeded job kept (the database refused their ack).
    db.execute("INSERT INTO pgpool_jobs (queue, kind, payload, state, last_error) VALUES "
               "('q2', 'record', '{}', 'parked', 'refused'), "
               "('default', 'record', '{}', 'done', 'refused')")
    db.execute("INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, "
               "created_at, died_at) SELECT i, CASE WHEN i <= 4 THEN 'default' ELSE 'q3' END, "
               "'record', '{}', 0, 3, now(), "
               "now() - CASE WHEN i = 1 THEN interval '2 days' ELSE interval '0' END "
               "FROM generate_series(1, 5) AS i")  # one died before the last 24 hours
    insert_host(db, "live:1:aa", lease=30, seen_ago=1, queues=("default",),
                kinds=("fail", "record"), claimed=1234, rate=123.45, budget=400, p99=4.5)
    # Stale (3600 s > 3 x 1 s): its handlers for orphan and for q2, its claims per second
    # and its budget do not count.
    insert_host(db, "gone:2:bb", lease=1, seen_ago=3600, queues=("default", "q2"),
                kinds=("orphan", "record"), claimed=99, rate=999, budget=1000, p99=99)


def section(text: str, title: str) -> list[list[str]]:
    """The rows (split into cells, header excluded) of one section of the text report."""
    lines = text.splitlines()
    start = lines.index(title) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        rows.append(line.split())
    return rows


def test_status_counts_per_queue_and_names_kinds_no_live_host_handles(db, dsn):
    seed(db)
    done = run_pgpool(dsn, "status")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.splitlines()[0] == "hosts: 1 live, 1 stale"
    hosts = {row[0]: row for row in section(text, "hosts: 1 live, 1 stale")}
    assert "(stale)" in hosts["gone"] and "(stale)" not in hosts["live"]
    # CLAIMED CLAIMS/S SHARE BUDGET: the stale host's share lapsed long ago.
    assert hosts["live"][-4:] == ["1234", "123.5", "-", "400"]
    assert hosts["gone"][-4:] == ["99", "999.0", "lapsed", "1000"]
    assert text.splitlines()[4] == ("fleet: 123.5 claims/s of a 400 claims/s budget (31%), "
                                    "the hosts' own (none set with `pgpool budget set`)")
    # LAG is how long the oldest due job has waited (due 60 s before the seed, so a little
    # more by now); CLAIMS/S and CLAIM P99 come from the live hosts serving the queue only.
    # PARKED DONE: succeeded, but the database refused to delete them (not keep=).
    assert text.splitlines()[text.splitlines().index("queues:") + 1].split() == [
        "QUEUE", "READY", "SCHEDULED", "RUNNING", "DEAD", "PARKED", "PARKED", "DONE", "LAG",
        "DEAD", "24H", "CLAIMS/S", "CLAIM", "P99"]
    queues = section(text, "queues:")
    assert [row[:7] + row[8:] for row in queues] == [
        ["default", "5", "2", "1", "4", "0", "1", "+3", "123.5", "4.5ms"],
        ["q2", "1", "0", "0", "0", "1", "0", "+0", "-", "-"],
        ["q3", "0", "0", "0", "1", "0", "0", "+1", "-", "-"],
    ]
    assert [re.fullmatch(r"\d+s|\d+m|-", row[7]) is not None for row in queues] == [True] * 3
    assert queues[2][7] == "-"  # nothing due in q3
    assert "warning: the database refused to ack or reap 2 jobs" in text
    assert [r[:3] for r in section(text, "kinds waiting with no live handler:")] == [
        ["default", "orphan", "2"],
        ["q2", "record", "1"],
    ]

    report = status_json(dsn)
    not_paused = {"paused": False, "paused_at": None}
    lags = [q.pop("lag") for q in report["queues"]]
    assert lags[0] >= 59 and lags[1] >= 59 and lags[2] is None
    assert report["queues"] == [
        {"queue": "default", "ready": 5, "scheduled": 2, "running": 1, "dead": 4,
         "parked": 0, "parked_done": 1, **not_paused, "dead_24h": 3, "claims_per_sec": 123.45,
         "claim_p99_ms": 4.5, "waiting_on_limits": 0},
        {"queue": "q2", "ready": 1, "scheduled": 0, "running": 0, "dead": 0, "parked": 1,
         "parked_done": 0, **not_paused, "dead_24h": 0, "claims_per_sec": None,
         "claim_p99_ms": None, "waiting_on_limits": 0},
        {"queue": "q3", "ready": 0, "scheduled": 0, "running": 0, "dead": 1, "parked": 0,
         "parked_done": 0, **not_paused, "dead_24h": 1, "claims_per_sec": None,
         "claim_p99_ms": None, "waiting_on_limits": 0},
    ]
    assert [(u["queue"], u["kind"], u["ready"]) for u in report["unhandled"]] == [
        ("default", "orphan", 2), ("q2", "record", 1)]
    assert all(u["oldest_ago"] >= 59 for u in report["unhandled"])
    assert [(h["owner"], h["live"], h["procs"], h["queues"], h["kinds"], h["jobs_claimed"],
             h["claims_per_sec"], h["max_claims_per_sec"]) for h in report["hosts"]] == [
        ("gone:2:bb", False, 4, ["default", "q2"], ["orphan", "record"], 99, 999, 1000),
        ("live:1:aa", True, 4, ["default"], ["fail", "record"], 1234, 123.45, 400),
    ]
    assert report["fleet"] == {"live_hosts": 1, "counted_hosts": 1, "claims_per_sec": 123.45,
                               "fleet_budget": None, "max_claims_per_sec": 400,
                               "budgets": [400], "claims_share": 0, "warnings": []}


def test_status_sums_live_hosts_against_the_smallest_budget_and_says_budgets_differ(db, dsn):
    insert_host(db, "a:1:aa", lease=30, seen_ago=1, claimed=10, rate=100, budget=1000)
    insert_host(db, "b:2:bb", lease=30, seen_ago=1, claimed=20, rate=50.5, budget=400)
    # Written by a pgpool older than schema version 3: no claims per second, no budget.
    insert_host(db, "c:3:cc", lease=30, seen_ago=1)
    insert_host(db, "d:4:dd", lease=1, seen_ago=60, claimed=5, rate=5000, budget=10)  # stale
    report = status_json(dsn)
    warning = ("live hosts run with different budgets (400, 1000 claims/s, from their "
               "--max-claims-per-sec): set one for the fleet with `pgpool budget set N`")
    assert report["fleet"] == {"live_hosts": 3, "counted_hosts": 3, "claims_per_sec": 150.5,
                               "fleet_budget": None, "max_claims_per_sec": 400,
                               "budgets": [400, 1000], "claims_share": 0,
                               "warnings": [warning]}
    done = run_pgpool(dsn, "status")
    assert done.returncode == 0, done.stderr
    rows = section(done.stdout, "hosts: 3 live, 1 stale")
    assert [row[-3:] for row in rows] == [
        ["100.0", "-", "1000"], ["50.5", "-", "400"], ["-", "-", "-"],
        ["5000.0", "lapsed", "10"]]
    assert done.stdout.splitlines()[6:8] == [
        "fleet: 150.5 claims/s of a 400 claims/s budget (38%), the hosts' own (none set with "
        "`pgpool budget set`)", f"warning: {warning}"]

    db.execute("DELETE FROM pgpool_hosts WHERE owner IN ('a:1:aa', 'b:2:bb')")
    done = run_pgpool(dsn, "status")
    assert done.returncode == 0, done.stderr
    assert "\nfleet: 0.0 claims/s; no live host reports a budget\n" in done.stdout


@pytest.mark.own_schema  # a new table: "last autovacuum never"
def test_status_of_an_empty_queue(db, dsn):
    done = run_pgpool(dsn, "status")
    assert done.returncode == 0, done.stderr
    report = status_json(dsn)
    vacuum = report.pop("vacuum")
    assert done.stdout.startswith(
        "hosts: 0 live\n  (none)\nfleet: 0.0 claims/s (no live hosts)\n\n"
        "queues:\n  (none)\n\n"
        f"jobs table: {vacuum['dead_tuples']} dead tuples, "
        f"{vacuum['live_tuples']} live; last autovacuum never\n\nxmin horizon: ")
    tables = "".join(f"\n  {t:<16}  0          0          never        0        never"
                     "            0" for t in TABLES)
    assert f"\npgpool's tables:\n  TABLE{' ' * 13}DEAD ROWS  LIVE ROWS" in done.stdout
    assert done.stdout.endswith(f"{tables}\n\nkinds waiting with no live handler:\n  (none)\n")
    # Whatever else may hold the horizon for a moment, nothing piles up and none warns.
    horizon = report.pop("horizon")
    assert [t["table"] for t in horizon["tables"]] == list(TABLES)
    assert not horizon["piling_up"] and horizon["warning"] is None
    assert horizon["warn_after"] == 300 and horizon["dead_rows_per_min"] is None
    assert report == {
        "hosts": [], "queues": [], "unhandled": [], "schedules": [],
        "groups": {"in_progress": 0, "oldest": []}, "limits": [], "succeeded": [],
        "fleet": {"live_hosts": 0, "counted_hosts": 0, "claims_per_sec": 0.0,
                  "fleet_budget": None, "max_claims_per_sec": None, "budgets": [],
                  "claims_share": 0, "warnings": []}}
    assert vacuum == {"dead_tuples": vacuum["dead_tuples"], "live_tuples": 0,
                      "last_autovacuum_ago": None, "settings_kept": True, "warning": None}


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
@pytest.mark.own_schema
def test_status_warns_of_vacuum_debt_and_of_lost_autovacuum_settings(db, dsn):
    # The runbook's condition: dead tuples far past the table's autovacuum trigger, and no
    # autovacuum for a while. Autovacuum is held off here so it cannot clear the debt first.
    db.execute("ALTER TABLE pgpool_jobs SET (autovacuum_enabled = false)")
    pgpool.enqueue_many(db, "record", [{}] * 2000)
    db.execute("DELETE FROM pgpool_jobs")
    # Table statistics reach pg_stat_user_tables a moment after the transaction ends.
    vacuum = wait_until(lambda: (v := status_json(dsn)["vacuum"])["dead_tuples"] >= 2000 and v,
                        "the dead tuples to be counted", 30)
    assert vacuum["live_tuples"] == 0 and vacuum["last_autovacuum_ago"] is None
    assert vacuum["warning"].startswith("vacuum debt: ")
    assert "VACUUM (VERBOSE) pgpool_jobs" in vacuum["warning"]
    text = run_pgpool(dsn, "status").stdout
    assert f"\nwarning: {vacuum['warning']}\n" in text

    db.execute("VACUUM pgpool_jobs")  # the debt paid; then a migration resets a setting
    db.execute("ALTER TABLE pgpool_jobs RESET (autovacuum_vacuum_scale_factor)")
    vacuum = wait_until(lambda: (v := status_json(dsn)["vacuum"])["dead_tuples"] < 2000 and v,
                        "the vacuum to be counted", 30)
    assert vacuum["settings_kept"] is False
    assert vacuum["warning"].startswith("pgpool_jobs lost its autovacuum settings")


def test_status_shows_groups_in_progress_and_the_successes_kept_per_kind(db, dsn):
    # Seven groups, the oldest first: one has finished and its callback ran (not in
    # progress), one of the rest had a member cancelled.
    groups = [pgpool.group(db, "score", [{"doc": d} for d in range(n + 1)],
                           then=("combine", {})) for n in range(7)]
    for i, g in enumerate(groups):
        db.execute("UPDATE pgpool_groups SET created_at = now() - make_interval(mins => %s) "
                   "WHERE id = %s", (70 - i, g.id))
    finished, cancelled, *rest = groups
    db.execute("DELETE FROM pgpool_jobs WHERE id = %s OR group_id = %s",
               (finished.id, finished.id))
    db.execute("UPDATE pgpool_groups SET done = total, completed_at = now() WHERE id = %s",
               (finished.id,))
    (member, _) = [i for (i,) in db.execute(
        "SELECT id FROM pgpool_jobs WHERE group_id = %s ORDER BY id", (cancelled.id,))]
    pgpool.ops.cancel(db, [member])
    # Successes kept: 3 of one kind in the last hour and 1 before it; 1 of another, old.
    db.execute("INSERT INTO pgpool_done (id, queue, kind, attempts, created_at, finished_at, "
               "keep_until) SELECT 10000 + i, 'default', CASE WHEN i = 5 THEN 'b.old' "
               "ELSE 'a.kept' END, 1, now() - interval '3 hours', "
               "now() - CASE WHEN i >= 4 THEN interval '2 hours' ELSE make_interval(secs => i) "
               "END, now() + interval '1 day' FROM generate_series(1, 5) AS i")

    report = status_json(dsn)
    assert report["groups"]["in_progress"] == 6
    oldest = report["groups"]["oldest"]
    assert [(g["id"], g["total"], g["done"], g["dead"], g["finished"], g["callback"])
            for g in oldest] == [
        (cancelled.id, 2, 0, 1, 1, "waiting"),
        *[(g.id, g.size, 0, 0, 0, "waiting") for g in rest[:4]]]
    assert oldest[0]["age"] >= 68 * 60
    succeeded = report["succeeded"]
    assert [(s["kind"], s["last_hour"], s["last_hour_more"]) for s in succeeded] == [
        ("a.kept", 3, False), ("b.old", 0, False)]
    assert 1 <= succeeded[0]["last_ago"] < 60 and succeeded[1]["last_ago"] >= 7200

    done = run_pgpool(dsn, "status")
    assert done.returncode == 0, done.stderr
    assert "\ngroups in progress: 6 (the 5 oldest)\n" in done.stdout
    rows = section(done.stdout, "groups in progress: 6 (the 5 oldest)")
    assert rows[0][:5] == [str(cancelled.id), "1/2", "0", "1", "waiting"]
    assert rows[0][5:] in (["69m", "ago"], ["70m", "ago"])  # started 69 minutes before
    assert [r[:5] for r in rows[1:]] == [[str(g.id), f"0/{g.size}", "0", "0", "waiting"]
                                         for g in rest[:4]]
    rows = section(done.stdout, "successes kept, per kind:")
    assert [r[:2] for r in rows] == [["a.kept", "3"], ["b.old", "0"]]
    assert rows[1][2:] == ["2h", "ago"]

    # Every group done and its callback run: the section goes.
    db.execute("DELETE FROM pgpool_jobs")
    db.execute("UPDATE pgpool_groups SET completed_at = now()")
    assert status_json(dsn)["groups"] == {"in_progress": 0, "oldest": []}
    assert "groups in progress" not in run_pgpool(dsn, "status").stdout


def test_status_counts_the_successes_of_the_last_hour_up_to_a_cap(db, dsn, monkeypatch):
    from pgpool import observe
    from pgpool.cli.status import render

    db.execute("INSERT INTO pgpool_done (id, queue, kind, attempts, created_at, keep_until) "
               "SELECT i, 'default', 'many', 1, now(), now() + interval '1 day' "
               "FROM generate_series(1, 12) AS i")
    monkeypatch.setattr(observe, "SUCCEEDED_CAP", 10)
    (many,) = observe.collect(db)["succeeded"]
    assert (many["last_hour"], many["last_hour_more"]) == (10, True)
    assert "many  10+" in render(observe.collect(db))


def test_status_watch_refreshes_until_interrupted(db, dsn):
    watch = subprocess.Popen(pgpool_cmd("status", "--watch", "0.2", "--json"), cwd=HANDLERS,
                             env=pgpool_env(dsn), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(watch.stdout.readline())
        assert first["queues"] == []
        pgpool.enqueue(db, "record", {})
        # Every refresh is a complete report, one per line; one comes after the enqueue.
        while not (report := json.loads(watch.stdout.readline()))["queues"]:
            pass
        assert report["queues"][0]["ready"] == 1
    finally:
        watch.send_signal(signal.SIGINT)
        assert watch.wait(30) == 0, watch.stderr.read()


# --- pgpool status: user errors -----------------------------------------------------------


@pytest.mark.own_schema
def test_status_without_schema_says_to_migrate(dsn):
    assert_user_error(run_pgpool(dsn, "status"), "pgpool migrate")
    assert_user_error(run_pgpool(dsn, "status", "--json"), "pgpool migrate")


@pytest.mark.own_schema
def test_status_with_a_version_1_schema_asks_for_the_upgrade(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        make_version_1_schema(conn)
    assert_user_error(run_pgpool(dsn, "status"), "run `pgpool migrate` to upgrade")


def test_status_says_in_one_line_it_cannot_connect():
    assert_user_error(run_pgpool(UNREACHABLE, "status"), "cannot connect", "127.0.0.1:1")
