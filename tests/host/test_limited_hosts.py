"""A kind's fleet-wide concurrency limit (`pgpool.Limit`) on real hosts: three hosts of four
workers run a kind limited to 3, and never more than 3 of its jobs run at once, judged from
the jobs' own start and end times, across a SIGKILL of a host holding slots and a SIGSTOP
of another past its lease (its jobs are reaped and run again elsewhere while it is frozen);
every job finishes. An operator's override (`pgpool.ops.set_limit`) limits a kind without a
limit in its code on a running host, and its reset lifts it. And a kind limited to 20
starts a second: never more than 20 claimed in
any second, on the server's clock (what the limit holds; a trigger notes each claim's
``claimed_at``), the 100 jobs spread over 4 s at least, and every one done; the same at 640
a second, where the hosts spend grants of the rate's tokens between claims from its ring,
also across a SIGKILL of a host and a SIGSTOP of another past its lease.
A kind limited
to 2 per tenant never runs 3 of one tenant's jobs at once, across a SIGKILL of a host
holding slots, while the three tenants run side by side; and a kind limited to 10 starts
a second per tenant never claims 11 of one tenant's jobs in a second, on three hosts.

Jobs are `tests/handlers/chaosjobs.py` ``chaos.limited`` jobs: each attempt durably records
its start and end (monotonic ns); an attempt killed while it ran (its host's workers die
with it; the frozen host's worker is ended by its fence) has no end record, and is taken to
have run until its worker was seen gone by a pidfd watcher (`chaos_cluster.Watcher`): an
upper bound, so the count below can only overstate what ran at once.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from chaos_checks import most_at_once, most_in_window, read_attempts
from chaos_cluster import RECORD_ENV, Watcher, now_ns, workers_of
from commands import pgpool_cmd, pgpool_env
from places import HANDLERS, ROOT
from psycopg import sql as pgsql
from waits import wait_until

import pgpool
import pgpool.ops

#: Three hosts of eleven connections each: one fleet test at a time on the shared server
#: (its max_connections is PostgreSQL's default, 100; see tests/conftest.py).
pytestmark = pytest.mark.xdist_group("fleet")

LEASE = 2
LIMIT = 3  # chaosjobs.LIMITED_CONCURRENCY
KIND = "chaos.limited"
JOBS = 60
#: How long the 60 jobs (0.3 s each, 3 at a time: 6 s of work) may take after the faults:
#: the SIGKILLed host's slots wait out its lease and a reaper pass (about 3 s), and two
#: cores run three hosts of four workers each: 120 s is many times that.
DRAIN = 120
RATED = "chaos.rated"
RATE = 20  # chaosjobs.RATED_PER_SECOND
PER_TENANT = "chaos.per_tenant"
PER_TENANT_LIMIT = 2  # chaosjobs.PER_TENANT_CONCURRENCY
TENANT_RATED = "chaos.tenant_rated"
TENANT_RATE = 10  # chaosjobs.TENANT_RATED_PER_SECOND
RATED_JOBS = 100
FAST_RATED = "chaos.fast_rated"
FAST_RATE = 640  # chaosjobs.FAST_RATED_PER_SECOND
FAST_RATED_JOBS = 2000


class Host:
    """One real dispatcher of four workers, its output in a file."""

    def __init__(self, dsn: str, records: Path, log: Path, *args: str) -> None:
        env = pgpool_env(dsn, PYTHONPATH=f"{HANDLERS}:{ROOT}", **{RECORD_ENV: str(records)})
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                pgpool_cmd("run", "--handlers", "chaosjobs", "--lease", str(LEASE),
                           "--procs", "4", *args),
                cwd=HANDLERS, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def records(tmp_path: Path) -> Path:
    path = tmp_path / "records"
    path.mkdir()
    return path


@pytest.fixture
def watcher(records: Path) -> Iterator[Watcher]:
    w = Watcher(records)
    w.start()
    yield w
    w.stop()


@pytest.fixture
def start(dsn: str, records: Path, tmp_path: Path) -> Iterator[Callable[..., Host]]:
    """Start one more host (``pgpool run`` given more ``args``), and wait until its four
    workers are up; each is killed at the end if still running."""
    started: list[Host] = []

    def one(*args: str) -> Host:
        host = Host(dsn, records, tmp_path / f"host-{len(started)}.log", *args)
        started.append(host)
        wait_until(lambda: len(workers_of(host.pid, ready=True)) == 4,
                   f"host {len(started)}'s workers up")
        return host

    yield one
    for host in started:
        if host.proc.poll() is None:
            host.proc.kill()
            host.proc.wait(timeout=30)


@pytest.fixture
def hosts(start: Callable[..., Host]) -> list[Host]:
    """Three hosts, all up before the test enqueues: a host still starting would claim
    late, and be no competitor."""
    return [start() for _ in range(3)]


@pytest.fixture
def host(start: Callable[..., Host]) -> Host:
    return start()


def in_progress(records: Path, host: Host) -> bool:
    """Whether an attempt run by ``host``'s workers recorded its start and not its end."""
    return any(a.ppid == host.pid and a.end is None
               for runs in read_attempts(records).values() for a in runs)


@pytest.mark.soak  # three hosts, one killed and one frozen past its lease: `make soak-test`
def test_never_more_than_the_limit_run_across_a_killed_and_a_frozen_host(
        dsn: str, db: psycopg.Connection, records: Path, watcher: Watcher,
        start: Callable[..., Host]) -> None:
    """The hosts start in turn, each once the one before holds slots: three started at
    once, one host can keep every slot (the host that frees a slot claims the next job;
    the others wait for their poll), and the one to be killed may never hold any."""
    pgpool.enqueue_many(db, KIND, [{"ms": 1, "sleep": 0.3} for _ in range(JOBS)])
    ids = {row[0] for row in db.execute("SELECT id FROM pgpool_jobs WHERE kind = %s",
                                        (KIND,))}
    killed = start()

    wait_until(lambda: in_progress(records, killed), "a job running on the first host")
    killed.proc.kill()
    killed.proc.wait(timeout=30)
    frozen = start()

    owner = f"%:{frozen.pid}:%"

    def holds_a_started_job() -> bool:
        """Whether the (stopped) second host still holds a job its workers started: one
        that can only run again elsewhere. Its running job may have ended and been acked
        between being seen and the stop: then it is let go on, and stopped again."""
        started = [job for job, runs in read_attempts(records).items()
                   if any(a.ppid == frozen.pid for a in runs)]
        row = db.execute("SELECT count(*) FROM pgpool_jobs WHERE locked_by LIKE %s "
                         "AND id = ANY(%s)", (owner, started)).fetchone()
        db.commit()
        return row[0] > 0

    for _ in range(20):
        wait_until(lambda: in_progress(records, frozen), "a job running on the second host",
                   timeout=60)
        frozen.proc.send_signal(signal.SIGSTOP)
        stopped_at = now_ns()
        if holds_a_started_job():
            break
        frozen.proc.send_signal(signal.SIGCONT)
    else:
        raise AssertionError("the second host never held a started job when stopped")
    rest = start()  # it reaps the frozen host's jobs, and runs them

    def its_jobs_returned() -> bool:
        row = db.execute("SELECT count(*) FROM pgpool_jobs WHERE locked_by LIKE %s",
                         (owner,)).fetchone()
        db.commit()
        return row[0] == 0 and now_ns() - stopped_at > LEASE * 1e9

    wait_until(its_jobs_returned, "the frozen host's jobs reaped", timeout=60)
    frozen.proc.send_signal(signal.SIGCONT)

    def drained() -> bool:
        left = db.execute("SELECT count(*) FROM pgpool_jobs WHERE kind = %s",
                          (KIND,)).fetchone()[0]
        db.commit()
        return left == 0

    wait_until(drained, "every limited job done", timeout=DRAIN, interval=0.2)
    for host in (frozen, rest):
        host.proc.send_signal(signal.SIGTERM)
        assert host.proc.wait(timeout=60) == 0
    assert watcher.settle() == [], "workers still running after their dispatcher exited"

    attempts = read_attempts(records)
    assert db.execute("SELECT count(*) FROM pgpool_dead").fetchone()[0] == 0
    assert {job for job, runs in attempts.items() if any(a.end for a in runs)} == ids
    # Both faults hit a host holding slots: the killed host left an attempt without an
    # end, and a job the frozen host held was claimed again once its lease ran out (by
    # another host, or by the frozen one once thawed: a new claim either way).
    assert any(a.ppid == killed.pid and a.end is None
               for runs in attempts.values() for a in runs)
    assert any(a.ppid == frozen.pid and any(b.attempt > a.attempt for b in runs[i + 1:])
               for runs in attempts.values() for i, a in enumerate(runs))
    # The limit was reached (the check can see more than it), and never passed.
    assert most_at_once(attempts, watcher.died) == LIMIT


@pytest.mark.soak  # three hosts, one killed: `make soak-test`
def test_never_more_than_the_limit_of_one_tenant_run_across_a_killed_host(
        dsn: str, db: psycopg.Connection, records: Path, watcher: Watcher,
        start: Callable[..., Host]) -> None:
    """The host to be killed starts alone, so that it holds slots (as in the test above);
    the other two once it is killed."""
    tenants = ("acme", "globex", "initech")
    for tenant in tenants:
        pgpool.enqueue_many(db, PER_TENANT, [{"ms": 1, "sleep": 0.3} for _ in range(12)],
                            tenant=tenant)
    of_tenant = {tenant: {row[0] for row in db.execute(
        "SELECT id FROM pgpool_jobs WHERE tenant = %s", (tenant,))} for tenant in tenants}
    killed = start()

    wait_until(lambda: in_progress(records, killed), "a job running on the first host")
    killed.proc.kill()
    killed.proc.wait(timeout=30)
    rest = [start(), start()]

    def drained() -> bool:
        return db.execute("SELECT count(*) FROM pgpool_jobs WHERE kind = %s",
                          (PER_TENANT,)).fetchone()[0] == 0

    wait_until(drained, "every job done", timeout=DRAIN, interval=0.2)
    for host in rest:
        host.proc.send_signal(signal.SIGTERM)
        assert host.proc.wait(timeout=60) == 0
    assert watcher.settle() == [], "workers still running after their dispatcher exited"

    attempts = read_attempts(records)
    assert db.execute("SELECT count(*) FROM pgpool_dead").fetchone()[0] == 0
    assert {job for job, runs in attempts.items() if any(a.end for a in runs)} == set().union(
        *of_tenant.values())
    assert any(a.ppid == killed.pid and a.end is None
               for runs in attempts.values() for a in runs)
    # Each tenant's limit was reached (the check can see more than it), and never passed;
    # all three at once, more than one tenant's limit: the tenants ran side by side.
    assert [most_at_once({job: attempts[job] for job in ids}, watcher.died)
            for ids in of_tenant.values()] == [PER_TENANT_LIMIT] * 3
    assert most_at_once(attempts, watcher.died) > PER_TENANT_LIMIT


def note_claims(db: psycopg.Connection, kind: str) -> None:
    """Note each claim of a ``kind`` job (its tenant, and ``claimed_at``: the server's
    clock, which a rate holds) in the table claims_seen, with a trigger (an own_schema
    test's)."""
    db.execute("""
        CREATE TABLE claims_seen (id bigint, tenant text, at timestamptz);
        CREATE FUNCTION note_claim() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO claims_seen VALUES (NEW.id, NEW.tenant, NEW.claimed_at);
            RETURN NULL;
        END $$;""")
    db.execute(pgsql.SQL("""
        CREATE TRIGGER note_claim AFTER UPDATE OF state ON pgpool_jobs FOR EACH ROW
            WHEN (NEW.state = 'running' AND NEW.kind = {kind})
            EXECUTE FUNCTION note_claim()""").format(kind=pgsql.Literal(kind)))


def claims_seen(db: psycopg.Connection, kind: str) -> dict[str, list[float]]:
    """Once every ``kind`` job is done: the claims noted, per tenant, in order (seconds)."""
    wait_until(lambda: db.execute("SELECT count(*) FROM pgpool_jobs WHERE kind = %s",
                                  (kind,)).fetchone()[0] == 0,
               f"every {kind} job done", timeout=DRAIN, interval=0.2)
    seen: dict[str, list[float]] = {}
    for tenant, at in db.execute("SELECT tenant, extract(epoch FROM at)::float8 "
                                 "FROM claims_seen ORDER BY at"):
        seen.setdefault(tenant, []).append(at)
    return seen


@pytest.mark.soak  # three hosts drained at a rate, 5 s or more: `make soak-test`
@pytest.mark.own_schema  # a trigger on pgpool_jobs
def test_a_rate_holds_across_three_hosts(dsn: str, db: psycopg.Connection, records: Path,
                                         hosts: list[Host]) -> None:
    note_claims(db, RATED)
    pgpool.enqueue_many(db, RATED, [{"ms": 1} for _ in range(RATED_JOBS)])
    (claimed,) = claims_seen(db, RATED).values()
    assert len(claimed) == RATED_JOBS  # one claim each: nothing failed or was lost
    assert db.execute("SELECT count(*) FROM pgpool_dead").fetchone()[0] == 0
    # In any window [t, t + 1 s): at most RATE, the rate reached, and the claims spread
    # over (RATED_JOBS / RATE - 1) seconds at least.
    assert most_in_window(claimed, 1.0) == RATE
    assert claimed[-1] - claimed[0] >= RATED_JOBS / RATE - 1
    ended = {a.job for runs in read_attempts(records).values() for a in runs if a.end}
    assert len(ended) == RATED_JOBS


@pytest.mark.soak  # three hosts drained at a rate, 3 s or more: `make soak-test`
@pytest.mark.own_schema  # a trigger on pgpool_jobs
def test_a_rate_whose_claims_are_granted_holds_across_three_hosts(
        dsn: str, db: psycopg.Connection, records: Path,
        start: Callable[..., Host]) -> None:
    """640 a second, rows of 10: three hosts serving only that kind, claiming 4 at a time,
    are granted the rest of a row by a claim from the ring and spend it in their next
    claims (`pgpool.host.grant`). Never more than 640 claimed in any second, on the
    server's clock, and every job done once."""
    for _ in range(3):
        start("--kinds", FAST_RATED, "--batch", "4")
    note_claims(db, FAST_RATED)
    pgpool.enqueue_many(db, FAST_RATED, [{"ms": 0} for _ in range(FAST_RATED_JOBS)])
    (claimed,) = claims_seen(db, FAST_RATED).values()
    assert len(claimed) == FAST_RATED_JOBS  # one claim each: nothing failed or was lost
    assert db.execute("SELECT count(*) FROM pgpool_dead").fetchone()[0] == 0
    assert most_in_window(claimed, 1.0) <= FAST_RATE
    assert claimed[-1] - claimed[0] >= FAST_RATED_JOBS / FAST_RATE - 1
    ended = {a.job for runs in read_attempts(records).values() for a in runs if a.end}
    assert len(ended) == FAST_RATED_JOBS


@pytest.mark.soak  # three hosts, one killed and one frozen past its lease: `make soak-test`
@pytest.mark.own_schema  # a trigger on pgpool_jobs
def test_a_granted_rate_holds_across_a_killed_and_a_frozen_host(
        dsn: str, db: psycopg.Connection, records: Path, start: Callable[..., Host]) -> None:
    """As above, but one host is SIGKILLed and another SIGSTOPped past its lease while they
    claim (each may hold a grant's tokens then): their jobs are claimed again elsewhere,
    and the frozen host, thawed, spends nothing of a grant that is over. Never more than
    640 claims in any second, re-claims included, and every job done."""
    killed, frozen, rest = (start("--kinds", FAST_RATED, "--batch", "4") for _ in range(3))
    note_claims(db, FAST_RATED)
    pgpool.enqueue_many(db, FAST_RATED, [{"ms": 0} for _ in range(FAST_RATED_JOBS)])
    ids = {row[0] for row in db.execute("SELECT id FROM pgpool_jobs WHERE kind = %s",
                                        (FAST_RATED,))}

    def claims_by(host: Host) -> int:
        row = db.execute("SELECT count(*) FROM pgpool_jobs WHERE locked_by LIKE %s",
                         (f"%:{host.pid}:%",)).fetchone()
        db.commit()
        return row[0]

    wait_until(lambda: claims_by(killed) > 0, "the first host holding jobs", interval=0.01)
    killed.proc.kill()
    killed.proc.wait(timeout=30)
    wait_until(lambda: claims_by(frozen) > 0, "the second host holding jobs", interval=0.01)
    frozen.proc.send_signal(signal.SIGSTOP)
    stopped_at = now_ns()
    wait_until(lambda: claims_by(frozen) == 0 and now_ns() - stopped_at > LEASE * 1e9,
               "the frozen host's jobs reaped", timeout=60)
    frozen.proc.send_signal(signal.SIGCONT)
    (claimed,) = claims_seen(db, FAST_RATED).values()
    assert len(claimed) > FAST_RATED_JOBS  # the faulted hosts' jobs were claimed again
    assert db.execute("SELECT count(*) FROM pgpool_dead").fetchone()[0] == 0
    assert most_in_window(claimed, 1.0) <= FAST_RATE
    ended = {a.job for runs in read_attempts(records).values() for a in runs if a.end}
    assert ended == ids
    for host in (frozen, rest):
        host.proc.send_signal(signal.SIGTERM)
        assert host.proc.wait(timeout=60) == 0


@pytest.mark.soak  # three hosts drained at a rate per tenant, 3 s or more: `make soak-test`
@pytest.mark.own_schema  # a trigger on pgpool_jobs
def test_a_rate_per_tenant_holds_across_three_hosts(dsn: str, db: psycopg.Connection,
                                                    records: Path, hosts: list[Host]) -> None:
    """Three tenants at 10 a second each, claimed by three hosts at once: never 11 of one
    tenant in any second, each tenant's jobs spread over its own windows, and the three
    served side by side (a tenant at its rate holds no other back)."""
    note_claims(db, TENANT_RATED)
    for tenant, jobs in (("acme", 40), ("globex", 30), ("initech", 30)):
        pgpool.enqueue_many(db, TENANT_RATED, [{"ms": 1} for _ in range(jobs)], tenant=tenant)
    seen = claims_seen(db, TENANT_RATED)
    assert {tenant: len(at) for tenant, at in seen.items()} == {
        "acme": 40, "globex": 30, "initech": 30}  # one claim each: nothing failed or lost
    assert db.execute("SELECT count(*) FROM pgpool_dead").fetchone()[0] == 0
    assert [most_in_window(at, 1.0) for at in seen.values()] == [TENANT_RATE] * 3
    assert [at[-1] - at[0] >= len(at) / TENANT_RATE - 1 for at in seen.values()] == [True] * 3
    # Side by side: every tenant's first ten claimed within the first second of all.
    first = min(at[0] for at in seen.values())
    assert [at[TENANT_RATE - 1] < first + 1 for at in seen.values()] == [True] * 3


@pytest.mark.soak  # a real host (6 s): `make soak-test`
def test_an_override_limits_a_running_host_and_its_reset_lifts_it(
        dsn: str, db: psycopg.Connection, records: Path, watcher: Watcher,
        host: Host) -> None:
    def batch(ids_before: set[int]) -> int:
        pgpool.enqueue_many(db, "chaos.record", [{"ms": 1, "sleep": 0.2} for _ in range(8)])
        wait_until(lambda: db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0,
                   "the batch done", timeout=DRAIN, interval=0.1)
        wait_until(lambda: len(read_attempts(records)) == len(ids_before) + 8,
                   "every attempt recorded")
        return most_at_once({job: runs for job, runs in read_attempts(records).items()
                             if job not in ids_before}, watcher.died)

    pgpool.ops.set_limit(db, "chaos.record", concurrency=1)
    wait_until(lambda: "limit of kind chaos.record: concurrency 1, set by" in host.output(),
               "the host applying the override")
    assert batch(set()) == 1
    pgpool.ops.reset_limit(db, "chaos.record")
    wait_until(lambda: "limit of kind chaos.record: reset" in host.output(),
               "the host applying the reset")
    assert batch(set(read_attempts(records))) > 1  # four workers, eight jobs of 0.2 s


@pytest.mark.soak  # a real host drained at a rate (5 s): `make soak-test`
def test_a_burst_host_waits_for_jobs_held_back_by_a_rate(
        dsn: str, db: psycopg.Connection, records: Path) -> None:
    """A burst host is not drained while ready jobs wait on their kind's rate: it takes
    the 45 jobs at 20 a second, in three windows, then exits."""
    pgpool.enqueue_many(db, RATED, [{"ms": 1} for _ in range(45)])
    env = pgpool_env(dsn, PYTHONPATH=f"{HANDLERS}:{ROOT}", **{RECORD_ENV: str(records)})
    done = subprocess.run(
        pgpool_cmd("run", "--handlers", "chaosjobs", "--procs", "2", "--burst"),
        cwd=HANDLERS, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=DRAIN)
    assert done.returncode == 0, done.stderr
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0
    assert len({a.job for runs in read_attempts(records).values() for a in runs if a.end}) == 45
