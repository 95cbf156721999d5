"""Periodic jobs (`pgpool.periodic`): real dispatchers on real PostgreSQL, running the
schedules of tests/handlers/testperiodic.py, whose jobs stay in ``pgpool_jobs`` as the
record of every tick enqueued (their queue is not served)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import psycopg
import pytest
from commands import assert_user_error, run_pgpool, status_json
from dbtools import one
from processes import start_pgpool
from testperiodic import CATCH_UP
from waits import wait_until

import pgpool
from pgpool import schedules

#: Short leases: declarations refresh every 2/3 s and lapse 6 s after the last one.
HOST = ("run", "--handlers", "testperiodic", "--procs", "1", "--lease", "2")
SECOND = timedelta(seconds=1)
#: Seconds every host stays down: more ticks than the bounded catch-up enqueues.
DOWNTIME = CATCH_UP + 3


def ticks(db: psycopg.Connection, schedule: str) -> list[tuple[datetime, datetime]]:
    """(tick, the enqueueing transaction's time) of every job ``schedule`` enqueued."""
    return db.execute(
        "SELECT (payload->>'tick')::timestamptz, created_at FROM pgpool_jobs "
        "WHERE payload->>'schedule' = %s ORDER BY 1, 2", (schedule,)).fetchall()


def db_now(db: psycopg.Connection) -> datetime:
    return one(db, "SELECT now()")[0]


def ticks_after(db: psycopg.Connection, schedule: str, after: datetime, n: int) -> bool:
    return len([t for t, _ in ticks(db, schedule) if t > after]) >= n


def start_host(dsn: str, **env: str):
    host = start_pgpool(dsn, *HOST, **env)
    host.event("started")
    return host


def consecutive(times: list[datetime]) -> bool:
    return all(b - a == SECOND for a, b in pairwise(times))


@pytest.mark.soak  # hosts frozen or racing for many seconds: `make soak-test`
@pytest.mark.xdist_group("fleet")  # several hosts on the shared server: tests/conftest.py
def test_three_hosts_enqueue_each_tick_once_and_a_gap_collapses(db, dsn):
    hosts = [start_host(dsn) for _ in range(3)]
    # Timeouts here are generous (a tick a second, 20 s to see a few): the machine is shared.
    start = db_now(db)
    wait_until(lambda: ticks_after(db, "every-second", start, 3), "three ticks", timeout=20)

    # One host restarts mid-way; the other two keep ticking meanwhile.
    assert hosts[0].stop() == 0
    hosts[0] = start_host(dsn)
    restarted = db_now(db)
    wait_until(lambda: ticks_after(db, "every-second", restarted, 3),
               "three ticks after the restart", timeout=20)

    # Every host down for DOWNTIME seconds, then one comes back.
    for host in hosts:
        assert host.stop() == 0
    last = {name: ticks(db, name)[-1][0] for name in ("every-second", "every-second-latest")}
    # Waiting out the downtime is the point of the test: the condition is the database's
    # clock passing it (a bound of DOWNTIME plus a generous margin).
    wait_until(lambda: db_now(db) > max(last.values()) + DOWNTIME * SECOND,
               "the downtime to pass", timeout=DOWNTIME + 20, interval=0.2)
    back = start_host(dsn)
    restarted = db_now(db)
    for name in last:
        wait_until(lambda n=name: ticks_after(db, n, restarted, 2),
                   f"{name} to tick after the catch-up", timeout=20)
    assert back.stop() == 0

    for name, before in last.items():
        rows = ticks(db, name)
        times = [t for t, _ in rows]
        assert len(set(times)) == len(times), f"{name}: a tick enqueued twice: {times}"
        live, resumed = [t for t in times if t <= before], [t for t in times if t > before]
        # The first catch-up transaction after the downtime, then one tick at a time.
        catch_up_at = min(at for t, at in rows if t > before)
        caught_up = [t for t, at in rows if at == catch_up_at]
        expected = CATCH_UP if name == "every-second" else 1
        assert len(caught_up) == expected, (name, caught_up)
        assert caught_up[0] - before > SECOND, f"{name}: the missed ticks were not skipped"
        assert consecutive(caught_up) and consecutive(resumed), (name, resumed)
        if name == "every-second":
            # Bounded catch-up: no tick lost while any host was up, restart included.
            assert consecutive(live), f"ticks lost while hosts were up: {live}"


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_status_lists_schedules_and_a_schedule_removed_from_the_code_stops(db, dsn):
    host = start_host(dsn)
    start = db_now(db)
    wait_until(lambda: ticks_after(db, "every-second-latest", start, 1), "a tick",
               timeout=20)
    listed = {s["name"]: s for s in status_json(dsn)["schedules"]}
    assert set(listed) == {"every-second", "every-second-latest"}
    latest = listed["every-second-latest"]
    assert latest["declared"] is True
    assert (latest["cron"], latest["timezone"], latest["kind"], latest["queue"],
            latest["catch_up"]) == ("* * * * * *", "Europe/Paris", "tick", "ticks", 1)
    assert latest["last_run"] is not None
    assert datetime.fromisoformat(latest["next_run"]) - datetime.fromisoformat(
        latest["last_tick"]) == SECOND
    assert listed["every-second"]["catch_up"] == CATCH_UP
    text = run_pgpool(dsn, "status")
    assert text.returncode == 0, text.stderr
    assert "periodic schedules:" in text.stdout and "every-second-latest" in text.stdout

    # The same code without the schedules: nothing enqueues them any more.
    assert host.stop() == 0
    stopped = db_now(db)
    other = start_host(dsn, TESTPERIODIC_SCHEDULES="0")

    # Declarations lapse 3 leases (6 s) after the last refresh; 30 s is the generous bound.
    wait_until(lambda: not one(db, "SELECT bool_or(declared_until > now()) "
                                   "FROM pgpool_schedules")[0],
               "the declarations to lapse", timeout=30, interval=0.1)
    assert other.poll() is None
    for name in ("every-second", "every-second-latest"):
        assert ticks(db, name)[-1][0] <= stopped, f"{name} ticked after its removal"
    listed = {s["name"]: s for s in status_json(dsn)["schedules"]}
    assert not any(s["declared"] for s in listed.values()), listed
    assert listed["every-second"]["next_run"] is None
    text = run_pgpool(dsn, "status")
    assert "not declared by any live host" in text.stdout, text.stdout
    assert other.stop() == 0


@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_bad_cron_expressions_and_time_zones_are_one_line_errors(dsn):
    for cron, zone, needles in (
        ("61 * * * *", "UTC", ("schedule 'custom'", "bad cron expression '61 * * * *'",
                               "use 5 fields")),
        ("* * *", "UTC", ("schedule 'custom'", "bad cron expression '* * *'")),
        ("0 0 31 2 *", "UTC", ("schedule 'custom'", "never fires")),
        ("* * * * *", "Mars/Olympus", ("schedule 'custom'", "unknown time zone 'Mars/Olympus'",
                                      "IANA name")),
    ):
        done = run_pgpool(dsn, *HOST, TESTPERIODIC_CRON=cron, TESTPERIODIC_TZ=zone)
        assert_user_error(done, *needles)


# --- tick arithmetic and declarations, in this process ------------------------------------

PARIS = schedules.zone("Europe/Paris")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_a_long_gap_yields_only_the_latest_ticks():
    now = utc(2026, 1, 1, 12, 0, 0) + timedelta(microseconds=300_000)
    month_ago = now - timedelta(days=30)
    assert schedules.due_ticks("*/5 * * * *", schedules.zone("UTC"), month_ago, now, 1) == [
        utc(2026, 1, 1, 12, 0)]
    assert schedules.due_ticks("* * * * * *", schedules.zone("UTC"), month_ago, now, 3) == [
        utc(2026, 1, 1, 11, 59, 58), utc(2026, 1, 1, 11, 59, 59), utc(2026, 1, 1, 12, 0)]
    # Nothing due between two ticks; a tick exactly at ``now`` is due.
    assert schedules.due_ticks("* * * * * *", schedules.zone("UTC"),
                               now - timedelta(seconds=0.2), now, 3) == []
    assert schedules.due_ticks("0 12 * * *", schedules.zone("UTC"), month_ago,
                               utc(2026, 1, 1, 12, 0), 1) == [utc(2026, 1, 1, 12, 0)]


def test_ticks_follow_the_time_zone_across_dst_changes():
    # Spring forward in Paris (2026-03-29, 02:00 -> 03:00): 02:30 does not exist that day;
    # it fires once, when the clock jumps (01:00 UTC), and at 02:30 CEST the day after.
    assert schedules.due_ticks("30 2 * * *", PARIS, utc(2026, 3, 28, 12), utc(2026, 3, 30, 12),
                               10) == [utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]
    # Fall back (2026-10-25, 03:00 -> 02:00): a fixed 02:30 fires once, at its first
    # occurrence; an hourly schedule fires in both 02:00 hours.
    assert schedules.due_ticks("30 2 * * *", PARIS, utc(2026, 10, 24, 12),
                               utc(2026, 10, 26, 12), 10) == [utc(2026, 10, 25, 0, 30),
                                                              utc(2026, 10, 26, 1, 30)]
    assert schedules.next_tick("30 2 * * *", PARIS, utc(2026, 10, 25, 0, 30)) == utc(
        2026, 10, 26, 1, 30)
    assert schedules.due_ticks("0 * * * *", PARIS, utc(2026, 10, 24, 23, 30),
                               utc(2026, 10, 25, 3), 10) == [
        utc(2026, 10, 25, 0), utc(2026, 10, 25, 1), utc(2026, 10, 25, 2), utc(2026, 10, 25, 3)]
    # Winter and summer: the same wall-clock time is a different UTC time.
    assert schedules.next_tick("0 9 * * *", PARIS, utc(2026, 1, 10)) == utc(2026, 1, 10, 8)
    assert schedules.next_tick("0 9 * * *", PARIS, utc(2026, 7, 10)) == utc(2026, 7, 10, 7)


def test_declarations_are_checked_and_the_tick_goes_in_the_payload():
    s = pgpool.periodic("t-ok", "0 3 * * *", kind="tick", payload={"a": 1},
                        timezone="Europe/Paris", catch_up=4)
    assert (s.catch_up, s.payload_for(utc(2026, 1, 1, 2))) == (
        4, {"a": 1, "tick": "2026-01-01T02:00:00+00:00"})
    assert pgpool.periodic("t-ok", "0 3 * * *", kind="tick", payload={"a": 1},
                           timezone="Europe/Paris", catch_up=4) == s  # the same again: fine
    for kwargs, needle in (
        ({"cron": "0 4 * * *"}, "schedule 't-ok' is declared twice, differently"),
        ({"name": "t-2", "catch_up": 0}, "catch_up must be \"latest\" or a number"),
        ({"name": "t-3", "catch_up": "all"}, "catch_up must be"),
        ({"name": "t-4", "payload": {"tick": 1}}, "tick_key 'tick' must be"),
        ({"name": "t-5", "payload": {"x": float("nan")}}, "NaN"),
        ({"name": "t-6", "kind": "bad kind"}, "invalid kind"),
        ({"name": "t 7"}, "invalid schedule name"),
        ({"name": "t-8", "timezone": "Europe/Nowhere"}, "unknown time zone"),
        ({"name": "t-9", "cron": "* * * * * * *"}, "bad cron expression"),
    ):
        args = {"name": "t-ok", "cron": "0 3 * * *", "kind": "tick", "payload": {"a": 1},
                "timezone": "Europe/Paris", "catch_up": 4, **kwargs}
        with pytest.raises(pgpool.HandlerError) as raised:
            pgpool.periodic(args.pop("name"), args.pop("cron"), **args)
        message = str(raised.value)
        assert needle in message and "\n" not in message, message


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_hosts_declaring_a_schedule_differently_say_so(db, dsn):
    # Two code versions of the schedule "custom" (its jobs go to the served default queue).
    first = start_host(dsn, TESTPERIODIC_SCHEDULES="0", TESTPERIODIC_CRON="* * * * * *")
    second = start_host(dsn, TESTPERIODIC_SCHEDULES="0", TESTPERIODIC_CRON="*/2 * * * * *")
    # Each sees the other's declaration within a refresh (2/3 s); 30 s for a loaded machine.
    warned = first.event("periodic_mismatch", timeout=30)
    assert (warned["schedule"], warned["other"]) == (
        "custom", second.event("started")["owner"]), warned
    assert first.stop() == 0 and second.stop() == 0
