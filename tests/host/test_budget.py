"""The fleet claim budget: one budget, shared by demand among the hosts that beat, a token
bucket per host."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Callable

import psycopg
import pytest
from claims import in_registry
from commands import JSON_LOGS, RUN, assert_user_error, run_pgpool, status_json
from dbtools import one
from jsonlogs import only_event
from processes import start_pgpool
from psycopg_pool import AsyncConnectionPool
from waits import wait_until

import pgpool
from pgpool.host.budget import COUNTED_BEATS, ClaimBudget, Peer, demand, fair_shares, floor, share
from pgpool.host.lease import Lease
from pgpool.host.parts.hosts import HostRegistry
from pgpool.sql import fleet as sql

#: Its timing is its subject: these run one after another (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("timing")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- the token bucket ---------------------------------------------------------------------


def test_the_bucket_refills_at_the_granted_share_and_caps_bursts_at_one_second():
    clock = Clock()
    budget = ClaimBudget(10, clock=clock)
    assert budget.available() == 10  # before any grant: the floor, and a floor's worth
    budget.grant(1000, floor_rate=10, until=clock.now + 100)
    clock.now += 1
    assert budget.available() == 1000  # a full second's worth, no more
    assert budget.take(1000, backlog=False) and budget.available() == 0
    # Refused while jobs wait: the budget holds this host back (counted); nothing spent.
    assert not budget.take(1, backlog=True)
    assert (budget.throttles, budget.held_back) == (1, True)
    # Refused while polling an empty queue: this host wants nothing more.
    assert not budget.take(1, backlog=False)
    assert (budget.throttles, budget.held_back) == (1, False)
    assert budget.wait_for(50) == 0.05
    clock.now += 0.05
    assert budget.available() == 50
    clock.now += 60  # idle for a minute: still only one second's worth
    assert budget.available() == 1000


def test_a_smaller_grant_shrinks_the_bucket_and_a_lapsed_one_falls_to_the_floor():
    clock = Clock()
    budget = ClaimBudget(10, clock=clock)
    budget.grant(1000, floor_rate=10, until=clock.now + 1.5)
    clock.now += 1
    budget.grant(250, floor_rate=10, until=clock.now + 1.5)
    assert (budget.rate, budget.available()) == (250, 250)  # the burst shrinks with the share
    budget.spend(250)
    clock.now += 0.2
    assert budget.available() == 50
    clock.now += 1.3  # no beat renewed it: this host falls back to its floor
    assert budget.rate == 10


# --- how the hosts share the budget (pgpool.host.budget's rule) ---------------------------


def test_demands_that_fit_are_scaled_up_in_proportion():
    assert fair_shares(1000, [10, 30]) == [250, 750]
    assert fair_shares(1000, [500, 500]) == [500, 500]


def test_demands_past_the_budget_are_shared_max_min_fair():
    # The small demand is met; the unbounded ones split the rest equally.
    assert fair_shares(1000, [10, math.inf, math.inf]) == [10, 495, 495]
    assert fair_shares(1000, [math.inf, 100, 600]) == [450, 100, 450]
    shares = fair_shares(1000, [math.inf, 10, 10, 10])
    assert shares == [970, 10, 10, 10] and sum(shares) == 1000


def test_a_floor_is_a_share_of_the_budget_and_demand_keeps_headroom():
    assert floor(1000, 1) == floor(1000, 10) == 10  # 1% of the budget...
    assert floor(1000, 100) == 1  # ...but all floors together at most 10%
    assert demand(None, False, 10) == 10  # just started: the floor
    assert demand(100, False, 10) == 150  # headroom over what it claimed
    assert demand(0, True, 10) == math.inf  # held back: it wants more


def test_a_host_takes_its_fair_share_only_out_of_what_the_others_leave():
    # Alone: everything.
    assert share(1000, 10, []) == (1000, 10)
    # A newcomer while a busy host holds everything: only its floor for now (the fleet is
    # over the budget by that floor until the busy host's next beat).
    assert share(1000, 10, [Peer(math.inf, 1000)]) == (10, 10)
    # The busy host then leaves it the floor...
    assert share(1000, math.inf, [Peer(10, 10)]) == (990, 10)
    # ...the newcomer, now wanting more, must wait for the busy host to shrink to its
    # fair half, and then takes it.
    assert share(1000, math.inf, [Peer(math.inf, 990)]) == (10, 10)
    assert share(1000, math.inf, [Peer(math.inf, 10)]) == (500, 10)
    assert share(1000, math.inf, [Peer(math.inf, 500)]) == (500, 10)
    # A row claiming more than the budget takes the budget, no more.
    assert share(1000, math.inf, [Peer(math.inf, 1e12)]) == (10, 10)


def registry(pool: AsyncConnectionPool, owner: str, clock: Clock,
             counters: Callable[[], tuple[int, int, int, float | None, int]] = (
                 lambda: (0, 0, 0, None, 1)),
             max_claims_per_sec: float | None = None) -> HostRegistry:
    return HostRegistry(pool, owner, procs=1, queues=["default"], kinds=["k"],
                        lease=Lease(30), max_claims_per_sec=max_claims_per_sec,
                        counters=counters, clock=clock)


def test_registered_hosts_share_by_demand_and_never_past_the_budget_but_a_floor(db, dsn):
    db.execute("UPDATE pgpool_fleet SET max_claims_per_sec = 1000")
    clock = Clock()
    claimed = [0]

    async def work(pool: AsyncConnectionPool) -> list[tuple[float, float]]:
        a = registry(pool, "a", clock)
        b = registry(pool, "b", clock, counters=lambda: (0, 0, claimed[0], None, 1))
        seen = []

        async def beat(host: HostRegistry, *, throttled: bool) -> None:
            clock.now += 1
            host.budget.throttles += throttled
            await host.beat()
            seen.append((a.budget.rate, b.budget.rate))

        await a.register()
        seen.append((a.budget.rate, 0))
        await b.register()
        seen.append((a.budget.rate, b.budget.rate))
        for host in (a, b, a, b):  # both held back by their shares
            await beat(host, throttled=True)
        claimed[0] += 5  # b's queue runs dry: 5 claims in a second
        await beat(b, throttled=False)
        await beat(a, throttled=True)
        return seen

    seen = in_registry(dsn, work)
    assert seen == [
        (1000, 0),  # alone: the whole budget
        (1000, 10),  # b starts at its floor, out of nothing free
        (990, 10),  # a leaves b its floor
        (990, 10),  # b wants more, but a still holds it
        (500, 10),  # a shrinks to its fair half
        (500, 500),  # b takes the half a left it
        (500, 10),  # b asks for 1.5 x 5 claims/s: less than its floor
        (990, 10),  # a takes what b left
    ]
    assert all(x + y <= 1000 + 10 for x, y in seen)
    rows = db.execute("SELECT owner, claims_share, claims_demand, max_claims_per_sec "
                      "FROM pgpool_hosts ORDER BY owner").fetchall()
    assert rows == [("a", 990, math.inf, 1000), ("b", 10, 10, 1000)]


def test_a_host_that_stopped_beating_stops_counting_after_two_beats(db, dsn):
    clock = Clock()

    async def work(pool: AsyncConnectionPool) -> list[float]:
        a, b = registry(pool, "a", clock), registry(pool, "b", clock)
        for host in (a, b, a, b, a):
            host.budget.throttles += 1
            await host.beat()
        seen = [a.budget.rate]
        # b's last beat just under two of its beat intervals (2 x 10 s) ago: it counts;
        # just over: a takes the whole budget.
        for ago in (19, 21):
            db.execute("UPDATE pgpool_hosts SET last_seen = now() - make_interval(secs => %s) "
                       "WHERE owner = 'b'", (ago,))
            a.budget.throttles += 1  # a still wants more
            await a.beat()
            seen.append(a.budget.rate)
        # b's own share lapsed before that: 1.5 beat intervals after it sent its last beat.
        clock.now += 15
        return [*seen, b.budget.rate]

    assert in_registry(dsn, work) == [5000, 5000, 10_000, 100]


def test_a_beat_stuck_holding_the_lock_does_not_stop_the_others(db, dsn, caplog):
    # Another host's beat that stalls while holding the budget lock: a transaction of its
    # own holding that lock until the test ends.
    with psycopg.connect(dsn) as stalled:
        stalled.execute(sql.BUDGET_LOCK)

        async def work(pool: AsyncConnectionPool) -> float:
            host = HostRegistry(pool, "a", procs=1, queues=["default"], kinds=["k"],
                                lease=Lease(3), max_claims_per_sec=400,
                                counters=lambda: (0, 0, 0, None, 1))
            # The beat waits a quarter of its 1 s interval for the lock; 10 s is ample on
            # a loaded machine, and turns a beat that waits for good into a failure.
            async with asyncio.timeout(10):
                await host.register()
            return host.budget.rate

        with caplog.at_level(logging.WARNING, "pgpool.hosts"):
            assert in_registry(dsn, work) == 400  # beaten, without the lock
        assert one(db, "SELECT claims_share FROM pgpool_hosts") == (400,)
        assert "holds its lock" in caplog.text


def test_the_fleet_budget_overrides_a_hosts_own_with_a_warning(db, dsn, caplog):
    clock = Clock()

    async def work(pool: AsyncConnectionPool) -> list[float]:
        host = registry(pool, "a", clock, max_claims_per_sec=400)
        await host.register()
        seen = [host.budget.rate]
        db.execute("UPDATE pgpool_fleet SET max_claims_per_sec = 300")
        await host.beat()
        await host.beat()  # warned once, not at every beat
        seen.append(host.budget.rate)
        db.execute("UPDATE pgpool_fleet SET max_claims_per_sec = NULL")
        await host.beat()
        return [*seen, host.budget.rate]

    with caplog.at_level(logging.WARNING, "pgpool.hosts"):
        assert in_registry(dsn, work) == [400, 300, 400]
    warned = [r for r in caplog.records if getattr(r, "event", None) == "budget_overridden"]
    assert [r.fields for r in warned] == [{"given": 400, "fleet": 300}]


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_a_dispatcher_claims_no_faster_than_its_budget(db, dsn, record_dir):
    pgpool.enqueue_many(db, "noop", [{}] * 900)
    done = run_pgpool(dsn, *RUN, "--burst", "--max-claims-per-sec", "300",
                      record_dir=record_dir, **JSON_LOGS)
    assert done.returncode == 0, done.stderr
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0
    finished = only_event(done.stderr, "finished")
    assert finished["done"] == 900
    # The bucket starts with its floor's worth (3 jobs: 1% of the budget) and refills at
    # 300/s: the 900 jobs take at least 2.99 s from the start. A lower bound, so load only
    # makes it easier to meet (a slower machine takes longer); the 0.2 s spare keeps it
    # from hinging on exactly when the bucket and the run's clock start.
    assert finished["seconds"] >= 2.8, finished


# --- two hosts on one database ------------------------------------------------------------

#: Every claim as the claim statement wrote it, one row per job moved to running: a trigger
#: in the test's schema, so the dispatchers run unchanged.
CLAIM_LOG = """
CREATE TABLE claim_log (id bigint NOT NULL, owner text NOT NULL, at float8 NOT NULL);
CREATE FUNCTION log_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO claim_log VALUES (NEW.id, NEW.locked_by, extract(epoch FROM NEW.claimed_at));
    RETURN NULL;
END $$;
CREATE TRIGGER log_claim AFTER UPDATE OF state ON pgpool_jobs FOR EACH ROW
    WHEN (OLD.state = 'ready' AND NEW.state = 'running') EXECUTE FUNCTION log_claim();
"""


def max_excess(times: list[float], rate: float) -> float:
    """The most that the claims in any window [t0, t1] exceed ``rate`` x (t1 - t0).

    Claims of one statement share its ``claimed_at``, so windows need only start and end
    on those instants.
    """
    per_instant = sorted(Counter(times).items())
    worst = 0.0
    for i, (start, _) in enumerate(per_instant):
        claims = 0
        for end, n in per_instant[i:]:
            claims += n
            worst = max(worst, claims - rate * (end - start))
    return worst


def registered_at(db: psycopg.Connection, pid: int) -> tuple[float] | None:
    return db.execute("SELECT extract(epoch FROM started_at)::float8 FROM pgpool_hosts "
                      "WHERE pid = %s", (pid,)).fetchone()


def claiming_status(dsn: str, hosts: int) -> dict | None:
    """``pgpool status --json``, once it shows ``hosts`` hosts that claimed since their last
    beat."""
    report = status_json(dsn)
    rates = [h["claims_per_sec"] for h in report["hosts"]]
    return report if len(rates) == hosts and all(rates) else None


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
@pytest.mark.own_schema
def test_two_hosts_on_one_database_together_stay_under_the_fleet_cap(db, dsn):
    cap, lease, jobs = 400, 1.0, 2400
    db.execute(CLAIM_LOG)
    run = (*RUN, "--procs", "1", "--batch", "20", "--lease", str(lease),
           "--max-claims-per-sec", str(cap))
    first = start_pgpool(dsn, *run)
    wait_until(lambda: registered_at(db, first.pid), "the first host to register")
    # The second host joins while the first drains at the whole fleet's rate; most jobs are
    # enqueued once it has, so however long it took to start (a loaded machine), the two
    # drain together for 4 s or more at the cap: well past the ramp measured below.
    pgpool.enqueue_many(db, "noop", [{}] * (jobs // 3))
    second = start_pgpool(dsn, *run)
    (joined,) = wait_until(lambda: registered_at(db, second.pid), "the second host")
    pgpool.enqueue_many(db, "noop", [{}] * (jobs - jobs // 3))
    # While they drain, status shows both hosts' claims/s against the budget they share.
    draining = wait_until(lambda: claiming_status(dsn, hosts=2), "status to show both hosts "
                          "claiming")
    wait_until(lambda: db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0,
               "the drain", timeout=60)

    claims = db.execute("SELECT id, owner, at FROM claim_log ORDER BY at").fetchall()
    per_host = Counter(owner for _, owner, _ in claims)
    # pgpool_hosts follows each host's own count of what it claimed, at its next beat.
    wait_until(lambda: dict(db.execute("SELECT owner, jobs_claimed FROM pgpool_hosts")
                            .fetchall()) == per_host, "both hosts to report their claims")
    report = status_json(dsn)
    for host in (first, second):
        assert host.stop() == 0, host.stderr

    # Nothing lost: every job claimed, done and gone; nothing dead-lettered.
    assert len({job for job, _, _ in claims}) == len(claims) == jobs
    assert db.execute("SELECT (SELECT count(*) FROM pgpool_jobs), "
                      "(SELECT count(*) FROM pgpool_dead)").fetchone() == (0, 0)
    # Both hosts claimed, sharing the cap once both ran: neither took it all. The second
    # starts at its floor and reaches its fair half once the first has given it up: four
    # beats (its floor, the first leaves it that, the second asks for more, the first
    # shrinks to half, the second takes it), plus their round trips. From then on each
    # claims at its share, cap/2 = 200 jobs/s, far below what one worker runs of noop jobs
    # (thousands a second; still many hundreds on a loaded machine), so neither falls
    # behind its share. An even split is 0.5.
    beat, latency = lease / 3, 0.25
    ramped = joined + 4 * (beat + latency)
    after_ramp = Counter(owner for _, owner, at in claims if at >= ramped)
    assert len(after_ramp) == 2, (per_host, after_ramp)
    assert min(after_ramp.values()) >= 0.3 * sum(after_ramp.values()), after_ramp
    # status showed both hosts' claims/s against the budget they share, and in the end what
    # each claimed.
    fleet = draining["fleet"]
    assert (fleet["live_hosts"], fleet["max_claims_per_sec"], fleet["budgets"]) == (
        2, cap, [cap])
    assert fleet["claims_per_sec"] == pytest.approx(sum(h["claims_per_sec"]
                                                        for h in draining["hosts"]), abs=0.01)
    assert {h["owner"]: (h["jobs_claimed"], h["max_claims_per_sec"]) for h in report["hosts"]
            } == {owner: (n, cap) for owner, n in per_host.items()}

    # The limiter's guarantee, checked on every window (a window's claims minus cap x its
    # length). A host's bucket holds one second of its share and refills at that share, so
    # in any window a host claims at most share x window plus one share-second. The shares
    # in force add up to at most the cap, plus the second host's floor (1% of the cap)
    # from its start until the first host's next beat. Time enters only through
    # `latency`: how long a claim statement may take from the moment the dispatcher
    # decides to send it until PostgreSQL stamps it (a pooled connection, then a core for
    # the backend). That is milliseconds, tens on a loaded two-core machine; 0.25 s is ten
    # times that. (A limiter giving each host the whole cap exceeds the bound by
    # hundreds.) Here:
    bursts = cap + 2 * 0.01 * cap  # one second of the shares, floors included
    # and a claim is stamped when its statement starts, a moment after its bucket allowed
    # it.
    in_flight = cap * latency
    times = [at for _, _, at in claims]
    excess = max_excess(times, cap)
    assert excess <= bursts + in_flight, excess


# --- sharing by demand, between real dispatchers ------------------------------------------

#: Every beat of every host as it was written: a trigger in the test's schema, so the
#: dispatchers run unchanged.
BEAT_LOG = """
CREATE TABLE beat_log (pid integer NOT NULL, at float8 NOT NULL, share float8);
CREATE FUNCTION log_beat() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO beat_log VALUES (NEW.pid, extract(epoch FROM NEW.last_seen), NEW.claims_share);
    RETURN NULL;
END $$;
CREATE TRIGGER log_beat AFTER INSERT OR UPDATE ON pgpool_hosts FOR EACH ROW
    EXECUTE FUNCTION log_beat();
"""


def host_share(db: psycopg.Connection, pid: int) -> float | None:
    row = one(db, "SELECT claims_share FROM pgpool_hosts WHERE pid = %s", pid)
    return row and row[0]


@pytest.mark.soak  # a big drain: `make soak-test`
def test_an_idle_host_leaves_the_busy_one_all_of_the_budget_but_its_floor(db, dsn):
    cap = 200
    # noop jobs run thousands a second on one worker: at 200/s the busy host is always held
    # back by its share, and 20,000 of them outlast the test.
    pgpool.enqueue_many(db, "noop", [{}] * 20_000)
    run = (*RUN, "--procs", "1", "--batch", "20", "--lease", "1",
           "--max-claims-per-sec", str(cap))
    idle = start_pgpool(dsn, *run, "--queue", "empty")
    busy = start_pgpool(dsn, *run)
    # The idle host asks for its floor (1% of the cap); the busy one, held back, for more,
    # and gets all the rest. (An equal split would give each 100.) A few beats of a third
    # of a second each once both run; the 60 s allow for two slow start-ups.
    wait_until(lambda: (host_share(db, busy.pid), host_share(db, idle.pid)) == (198, 2),
               "the busy host to hold all but the idle host's floor", timeout=60)
    report = status_json(dsn)
    hosts = {h["pid"]: h for h in report["hosts"]}
    assert [(hosts[p]["claims_share"], hosts[p]["claims_demand"], hosts[p]["wants_more"],
             hosts[p]["counted"]) for p in (busy.pid, idle.pid)] == [
        (198, None, True, True), (2, 2, False, True)]
    fleet = report["fleet"]
    assert (fleet["counted_hosts"], fleet["claims_share"], fleet["max_claims_per_sec"],
            fleet["warnings"]) == (2, cap, cap, [])
    for host in (busy, idle):
        assert host.stop() == 0, host.stderr


@pytest.mark.soak  # a big drain: `make soak-test`
@pytest.mark.own_schema
def test_a_crashed_hosts_share_goes_to_the_others_two_beats_after_its_last(db, dsn):
    cap, lease = 200, 3.0
    beat = lease / 3
    db.execute(BEAT_LOG)
    pgpool.enqueue_many(db, "noop", [{}] * 20_000)  # as above: both always want more
    run = (*RUN, "--procs", "1", "--batch", "20", "--lease", str(lease),
           "--max-claims-per-sec", str(cap))
    survivor, victim = start_pgpool(dsn, *run), start_pgpool(dsn, *run)
    wait_until(lambda: host_share(db, survivor.pid) == host_share(db, victim.pid) == cap / 2,
               "both hosts to hold half the budget", timeout=60)
    victim.kill()
    victim.wait()
    (last,) = one(db, "SELECT max(at) FROM beat_log WHERE pid = %s", victim.pid)
    took = wait_until(
        lambda: one(db, "SELECT min(at) FROM beat_log WHERE pid = %s AND share = %s "
                        "AND at > %s", survivor.pid, cap, last)[0],
        "the survivor to take the whole budget", timeout=30)
    assert survivor.stop() == 0, survivor.stderr
    # Both times are the database's. The survivor leaves the dead host its share while
    # that host could still be applying it (a share lapses 1.5 beats after its beat; the
    # others count a row for COUNTED_BEATS, 2), and takes it at its first beat after that:
    # within the three beat intervals the docs promise, plus 1 s for a beat delayed on
    # a loaded machine. (Under the old rule the dead host counted for three leases: nine
    # beats.)
    assert COUNTED_BEATS * beat <= took - last <= 3 * beat + 1.0, took - last


# --- pgpool budget: the fleet's budget in one row -----------------------------------------


def test_budget_set_reaches_running_hosts_at_their_next_beat_and_status_warns_of_others(
        db, dsn):
    shown = run_pgpool(dsn, "budget")
    assert (shown.returncode, shown.stdout) == (0, (
        "fleet budget: not set; each host uses its --max-claims-per-sec (default 10000 "
        "claims/s)\n")), shown.stderr
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--lease", "1",
                        "--max-claims-per-sec", "1000")
    wait_until(lambda: one(db, "SELECT max_claims_per_sec, claims_share FROM pgpool_hosts "
                               "WHERE pid = %s", host.pid) == (1000, 1000), "the host's row")

    done = run_pgpool(dsn, "budget", "set", "250")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("fleet budget: 250 claims/s, shared by demand (set ")
    # Its next beat (every third of a second here) takes the fleet's over its own.
    wait_until(lambda: one(db, "SELECT max_claims_per_sec, claims_share FROM pgpool_hosts "
                               "WHERE pid = %s", host.pid) == (250, 250), "the new budget")
    warned = host.event("budget_overridden")
    assert (warned["given"], warned["fleet"]) == (1000, 250)
    fleet = status_json(dsn)["fleet"]
    assert (fleet["fleet_budget"], fleet["max_claims_per_sec"], fleet["budgets"],
            fleet["warnings"]) == (250, 250, [250], [])

    # A live host still on a budget of its own (one not yet beaten since, or an older
    # pgpool): status says so, in text and JSON.
    db.execute("INSERT INTO pgpool_hosts (owner, hostname, pid, procs, queues, kinds, lease, "
               "max_claims_per_sec) VALUES ('old:1:aa', 'old', 1, 1, '{default}', '{noop}', "
               "30, 1000)")
    warning = ("live hosts run with 250, 1000 claims/s, but the fleet budget is 250: a host "
               "takes it at its next beat (one that does not runs a pgpool older than this "
               "one)")
    assert status_json(dsn)["fleet"]["warnings"] == [warning]
    text = run_pgpool(dsn, "status").stdout
    assert f"\nwarning: {warning}\n" in text, text

    unset = run_pgpool(dsn, "budget", "unset")
    assert unset.stdout.startswith("fleet budget: not set;"), unset.stderr
    wait_until(lambda: one(db, "SELECT max_claims_per_sec FROM pgpool_hosts WHERE pid = %s",
                           host.pid) == (1000,), "the host's own budget again")
    assert host.stop() == 0, host.stderr


@pytest.mark.parametrize("value", ["0", "-5", "abc", "inf", "nan"])
def test_budget_set_refuses_what_is_not_a_positive_rate(db, dsn, value):
    assert_user_error(run_pgpool(dsn, "budget", "set", value), repr(value),
                      "positive number of claims per second")
    assert one(db, "SELECT max_claims_per_sec FROM pgpool_fleet") == (None,)


def test_budget_takes_its_dsn_before_or_after_the_action():
    from pgpool.cli.command import build_parser

    for argv in (["budget", "--dsn", "x", "set", "5"], ["budget", "set", "5", "--dsn", "x"]):
        args = build_parser().parse_args(argv)
        assert (args.dsn, args.action, args.rate) == ("x", "set", 5), argv
    assert build_parser().parse_args(["budget"]).action is None  # show
