"""The fleet claim budget: a token bucket per host, shared by the live hosts."""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest
from conftest import (
    JSON_LOGS,
    RUN,
    in_registry,
    only_event,
    run_pgpool,
    start_pgpool,
    status_json,
    wait_until,
)
from psycopg_pool import AsyncConnectionPool

import pgpool
from pgpool.budget import ClaimBudget
from pgpool.hosts import HostRegistry
from pgpool.lease import Lease


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_bucket_refills_at_the_hosts_share_and_caps_bursts_at_one_second():
    clock = Clock()
    budget = ClaimBudget(1000, lambda: 1, clock=clock)
    assert budget.available() == 1000  # a full second's worth to start
    budget.spend(1000)
    assert budget.available() == 0
    assert budget.wait_for(50) == 0.05
    clock.now += 0.05
    assert budget.available() == 50
    clock.now += 60  # idle for a minute: still only one second's worth
    assert budget.available() == 1000


def test_live_hosts_split_the_fleet_rate():
    clock = Clock()
    hosts = [1]
    budget = ClaimBudget(1000, lambda: hosts[0], clock=clock)
    hosts[0] = 4
    assert budget.rate == 250
    assert budget.available() == 250  # the burst shrinks with the share
    budget.spend(250)
    clock.now += 0.2
    assert budget.available() == 50
    hosts[0] = 0  # never divides by zero: this host always counts
    assert budget.rate == 1000


def test_registered_hosts_are_counted_for_the_share(db, dsn):
    async def work(pool: AsyncConnectionPool) -> list[int]:
        hosts = [HostRegistry(pool, f"host-{i}", procs=1, queues=["default"], kinds=["k"],
                              lease=Lease(30), max_claims_per_sec=1000, counters=lambda: (0, 0, 0))
                 for i in range(3)]
        for h in hosts:
            await h.register()
        await hosts[0].beat()
        seen = [hosts[0].live_hosts]
        await hosts[1].deregister()
        await hosts[0].beat()
        return [*seen, hosts[0].live_hosts]

    assert in_registry(dsn, work) == [3, 2]


def test_a_dispatcher_claims_no_faster_than_its_budget(db, dsn, record_dir):
    pgpool.enqueue_many(db, "noop", [{}] * 900)
    done = run_pgpool(dsn, *RUN, "--burst", "--max-claims-per-sec", "300",
                      record_dir=record_dir, **JSON_LOGS)
    assert done.returncode == 0, done.stderr
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0
    finished = only_event(done.stderr, "finished")
    assert finished["done"] == 900
    # 300 jobs may go at once (the bucket starts with one second's worth, and holds no
    # more); the other 600 wait for the bucket to refill at 300/s: at least 2 s after the
    # first claim. A lower bound, so load only makes it easier to meet (a slower machine
    # takes longer); the 0.2 s spare keeps it from hinging on exactly when the bucket and
    # the run's clock start.
    assert finished["seconds"] >= 1.8, finished


# --- two hosts on one database --------------------------------------------------------------

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


def test_two_hosts_on_one_database_together_stay_under_the_fleet_cap(db, dsn):
    cap, lease, jobs = 400, 1.0, 2400
    db.execute(CLAIM_LOG)
    run = (*RUN, "--procs", "1", "--batch", "20", "--lease", str(lease),
           "--max-claims-per-sec", str(cap))
    first = start_pgpool(dsn, *run)
    wait_until(lambda: registered_at(db, first.pid), "the first host to register")
    pgpool.enqueue_many(db, "noop", [{}] * jobs)
    ids = {r[0] for r in db.execute("SELECT id FROM pgpool_jobs").fetchall()}
    # The second host joins while the first drains at the whole fleet's rate.
    second = start_pgpool(dsn, *run)
    (joined,) = wait_until(lambda: registered_at(db, second.pid), "the second host")
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
    assert {job for job, _, _ in claims} == ids
    assert db.execute("SELECT (SELECT count(*) FROM pgpool_jobs), "
                      "(SELECT count(*) FROM pgpool_dead)").fetchone() == (0, 0)
    # Both hosts claimed, sharing the cap once both ran: neither took it all. Each claims at
    # its share, cap/2 = 200 jobs/s, far below what one worker runs of noop jobs (thousands
    # a second; still many hundreds on a loaded machine), so neither falls behind its
    # share; the first host's head start (its stale share until its next beat) is under
    # 100 of the ~2000 jobs claimed after the join. An even split is 0.5.
    after_join = Counter(owner for _, owner, at in claims if at >= joined)
    assert len(per_host) == 2, per_host
    assert min(after_join.values()) >= 0.3 * sum(after_join.values()), after_join
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
    # in any window a host claims at most share x window plus one share-second. Time
    # enters only through `latency`: how long a claim statement or a beat may take from
    # the moment the dispatcher decides to send it until PostgreSQL stamps it (a pooled
    # connection, then a core for the backend). That is milliseconds, tens on a loaded
    # two-core machine; 0.25 s is ten times that. (Measured: an excess about 16 claims
    # over the bursts; a limiter giving each host the whole cap exceeds both bounds by
    # hundreds.) Here:
    beat, latency = lease / 3, 0.25
    # the first host ran alone (its second's worth: cap), the second started full (cap/2);
    bursts = cap + cap / 2
    # the first host kept the whole cap as its share, cap/2 too much, until its first beat
    # after the second registered: at most one beat interval, plus that beat's round trips;
    stale_share = cap / 2 * (beat + latency)
    # and a claim is stamped when its statement starts, a moment after its bucket allowed
    # it (at most 1.5 x cap is being allowed while the first host's share is stale).
    in_flight = 1.5 * cap * latency
    times = [at for _, _, at in claims]
    excess = max_excess(times, cap)
    assert excess <= bursts + stale_share + in_flight, excess
    # Once both hosts know of each other, each holds cap/2: one second of the cap in all.
    excess = max_excess([t for t in times if t >= joined + beat + latency], cap)
    assert excess <= cap + cap * latency, excess
