"""Faults from outside pgpool: PostgreSQL restarted and connections killed mid-drain, and the
chaos soak (bench/chaos.py) at a small size.

Jobs are `bench/chaosjobs.py` ``chaos.record`` jobs: each attempt durably records its job,
attempt, worker pid, start and end (monotonic ns), so a test can prove that no job was lost
and no two attempts of one job ran at the same time, with the checker the soak uses.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import clean_env, pgpool_cmd, pgpool_env, wait_until
from psycopg.conninfo import make_conninfo

import pgpool

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import chaos  # noqa: E402
from chaos import KIND, RECORD_ENV  # noqa: E402

LEASE = 2
PROCS = 2
BATCH = 50
RUN = ("run", "--handlers", "chaosjobs", "--lease", str(LEASE))



def lines(records: Path) -> list[str]:
    """Every complete record line written so far."""
    return [line for f in records.glob("*.log") for line in f.read_text().splitlines()]


def ended(records: Path) -> int:
    """How many attempts have recorded their end so far."""
    return sum(1 for line in lines(records) if not line.endswith(" -"))


def started_pids(records: Path) -> list[int]:
    """The worker pid of every attempt that recorded its start so far."""
    return [int(line.split()[2]) for line in lines(records) if line.endswith(" -")]


class Host:
    """One real dispatcher running chaos jobs, its output in a file (a pipe nobody reads
    could fill up and stall it)."""

    def __init__(self, dsn: str, records: Path, log: Path, *args: str) -> None:
        env = pgpool_env(dsn, PYTHONPATH=str(BENCH), **{RECORD_ENV: str(records)})
        self.log = log
        args = args or ("--procs", str(PROCS), "--batch", str(BATCH))
        with log.open("wb") as out:
            self.proc = subprocess.Popen(pgpool_cmd(*RUN, *args), cwd=BENCH, env=env,
                                         stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM, and the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


@pytest.fixture
def records(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "records"
    path.mkdir()
    yield path


@pytest.fixture
def watcher(records: Path) -> Iterator[chaos.Watcher]:
    """Notes when each worker that recorded an attempt exited (for the overlap check)."""
    w = chaos.Watcher(records)
    w.start()
    yield w
    w.stop()


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Callable[..., Host]]:
    """``hosts(dsn, records, *args)`` starts a dispatcher (default ``--procs 2 --batch 50``);
    any still running after the test is killed."""
    started: list[Host] = []

    def start(dsn: str, records: Path, *args: str) -> Host:
        host = Host(dsn, records, tmp_path / f"dispatcher-{len(started)}.log", *args)
        started.append(host)
        return host

    yield start
    for host in started:
        if host.proc.poll() is None:
            host.proc.kill()
            host.proc.wait(timeout=30)


@pytest.fixture
def own_server() -> Iterator[chaos.Postgres]:
    """A dedicated PostgreSQL: restarting the session's server would break other fixtures."""
    pg = chaos.Postgres.start()
    yield pg
    pg.stop()


def check_run(ids: set[int], records: Path, watcher: chaos.Watcher,
              faults: list[chaos.Fault]) -> dict[int, list[chaos.Attempt]]:
    """Every job completed, no two attempts of a job overlapped, and every re-run is
    explained by one of ``faults`` and within what they could have interrupted."""
    assert watcher.settle() == [], "workers still running after their dispatcher exited"
    attempts = chaos.read_attempts(records)
    completed = {job for job, runs in attempts.items() if any(a.end is not None for a in runs)}
    assert completed == ids, f"lost: {sorted(ids - completed)[:10]}"
    assert chaos.find_overlaps(attempts, watcher.died) == []
    assert chaos.duplicate_attempts(attempts) == []
    _, unexplained = chaos.explain_reruns(attempts, faults, lease=LEASE)
    assert unexplained == []
    reruns = sum(len(runs) - 1 for runs in attempts.values())
    assert reruns <= sum(f.cap for f in faults)
    return attempts


def running(conn: psycopg.Connection) -> int:
    """Jobs claimed and not yet acked: what a fault right now could interrupt."""
    return conn.execute("SELECT count(*) FROM pgpool_jobs WHERE state = 'running'").fetchone()[0]


def test_postgres_restarted_mid_drain_the_dispatcher_carries_on(
        own_server, records, watcher, hosts):
    """``pg_ctl restart`` mid-drain: the dispatcher stays up, reconnects by itself and
    drains the queue; every job completes, and a job runs twice only if the restart could
    have interrupted it."""
    pg = own_server
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        pgpool.migrate(conn)
        pgpool.enqueue_many(conn, KIND, [{"ms": 2}] * 1000)
        ids = {row[0] for row in conn.execute("SELECT id FROM pgpool_jobs")}
        host = hosts(pg.dsn, records)
        wait_until(lambda: ended(records) >= 200, "a fifth of the jobs to finish")
        in_flight = running(conn)
    t0 = chaos.now_ns()
    pg.restart()
    restart = chaos.Fault("postgres restart", t0, chaos.now_ns(),
                          cap=in_flight + PROCS + 3 * BATCH)
    db = chaos.Db(pg.dsn)
    wait_until(lambda: db.query("SELECT count(*) FROM pgpool_jobs") == 0,
               "the queue to drain after the restart", 60)
    assert db.query("SELECT count(*) FROM pgpool_dead") == 0
    db.close()
    assert host.proc.poll() is None, f"the dispatcher died:\n{host.output()}"
    assert host.stop() == 0, host.output()
    attempts = check_run(ids, records, watcher, [restart])
    # It kept going: jobs started after the server came back.
    assert any(a.start > restart.t1 for runs in attempts.values() for a in runs)
    assert "listener reconnected" in host.output()


def test_connections_terminated_mid_drain_nothing_is_lost(dsn, db, records, watcher, hosts):
    """pg_terminate_backend on all of a dispatcher's connections, twice mid-drain: it
    reconnects and drains the queue; nothing is lost, no attempts overlap, and re-runs are
    only of jobs the terminations could have interrupted."""
    # application_name marks this dispatcher's connections, so only they are terminated
    # even on a server other tests (or other people) use.
    app = f"pgpool-test-{uuid.uuid4().hex[:8]}"
    pgpool.enqueue_many(db, KIND, [{"ms": 2}] * 1000)
    ids = {row[0] for row in db.execute("SELECT id FROM pgpool_jobs")}
    host = hosts(make_conninfo(dsn, application_name=app), records)
    faults = []
    for round_ in (1, 2):
        wait_until(lambda n=round_: ended(records) >= 250 * n, f"{250 * round_} jobs to end")
        in_flight = running(db)
        t0 = chaos.now_ns()
        killed = db.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND application_name = %s", (app,)).fetchone()[0]
        faults.append(chaos.Fault("backends terminated", t0, chaos.now_ns(),
                                  cap=in_flight + PROCS + 3 * BATCH))
        assert killed >= 2  # its pooled connections and its listener, at least
    wait_until(lambda: db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0,
               "the queue to drain", 60)
    assert db.execute("SELECT count(*) FROM pgpool_dead").fetchone()[0] == 0
    assert host.proc.poll() is None, f"the dispatcher died:\n{host.output()}"
    assert host.stop() == 0, host.output()
    check_run(ids, records, watcher, faults)
    assert "listener reconnected" in host.output()


def test_postgres_down_longer_than_a_lease_the_cut_off_host_stops_its_jobs(
        own_server, records, watcher, hosts):
    """A host that cannot reach the database for a whole lease must give its jobs up: kill
    the workers running them and start none of them again. Otherwise another host, which
    re-claims those jobs once their leases expire, runs them at the same time."""
    pg = own_server
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        pgpool.migrate(conn)
        pgpool.enqueue_many(conn, KIND, [{"sleep": 2.5}] * 4)
        ids = {row[0] for row in conn.execute("SELECT id FROM pgpool_jobs")}
    # The cut-off host claims all four: one runs, one waits in its worker, two in its backlog.
    first = hosts(pg.dsn, records, "--procs", "1", "--batch", "4")
    (worker,) = wait_until(lambda: started_pids(records), "the first job to start")
    t0 = chaos.now_ns()
    pg.stop()
    # Within a lease (plus a heartbeat interval) of its last heartbeat it must kill the
    # worker running a job it can no longer vouch for. Poll up to three leases for that.
    deadline = time.monotonic() + 3 * LEASE
    while watcher.died(worker) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    gave_up = watcher.died(worker)
    pg.start_again()
    outage = chaos.Fault("postgres restart", t0, chaos.now_ns(), cap=len(ids))
    # A second host with an idle worker per job re-claims the expired jobs at once.
    second = hosts(pg.dsn, records, "--procs", "4", "--batch", "4")
    db = chaos.Db(pg.dsn)
    wait_until(lambda: db.query("SELECT count(*) FROM pgpool_jobs") == 0,
               "the queue to drain after the outage", 60)
    db.close()
    assert first.stop() == 0, first.output()
    assert second.stop() == 0, second.output()
    assert watcher.settle() == []
    attempts = chaos.read_attempts(records)
    overlaps = [
        f"job {a.job}: attempt {a.attempt} (pid {a.pid}) ran {(a.start - t0) / 1e9:.2f}s.."
        f"{((a.end or watcher.died(a.pid) or 0) - t0) / 1e9:.2f}s after the server went away, "
        f"attempt {b.attempt} (pid {b.pid}) started at {(b.start - t0) / 1e9:.2f}s"
        for a, b in chaos.find_overlaps(attempts, watcher.died)]
    assert gave_up is not None, (
        f"the cut-off host kept running its job for {3 * LEASE}s without the database; "
        f"overlapping attempts: {overlaps}; its log:\n{first.output()}")
    # Once it gave its jobs up it must not start any of them (all held at attempt 1) again.
    restarted = [(a.job, round((a.start - t0) / 1e9, 2)) for runs in attempts.values()
                 for a in runs if a.ppid == first.proc.pid and a.attempt == 1
                 and a.start > gave_up]
    assert not restarted, (
        f"(job, seconds after the server went away) started by the cut-off host after it "
        f"gave them up at {(gave_up - t0) / 1e9:.2f}s: {restarted}; overlapping attempts: "
        f"{overlaps}; its log:\n{first.output()}")
    assert not overlaps, f"{overlaps}; first host's log:\n{first.output()}"
    check_run(ids, records, watcher, [outage])


FIGURE = re.compile(r"^([a-z][a-z -]*[a-z]):\s+(\d+)", re.MULTILINE)


def test_chaos_soak_small():
    """bench/chaos.py at CI size: two dispatchers, random kills and restarts, and its own
    checker; it must pass and report the figures."""
    done = subprocess.run(
        [sys.executable, str(BENCH / "chaos.py"), "--jobs", "1500", "--seconds", "60",
         "--interval", "0.2,0.8"],
        cwd=BENCH.parent, env=clean_env(), capture_output=True, text=True, timeout=180,
    )
    figures = {name: int(value) for name, value in FIGURE.findall(done.stdout)}
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    assert figures["jobs"] == 1500
    assert figures["faults"] >= 4
    assert figures["lost"] == 0
    assert figures["overlapping"] == 0
    assert figures["unexplained re-runs"] == 0
    assert figures["not drained"] == 0
    assert figures["completed"] + figures["dead"] >= 1500
