"""`pgpool run` end to end: real dispatcher processes, real workers, real signals.

Handlers come from tests/handlers/testjobs.py and record every attempt they start and
finish, so each test can say exactly which attempt of which job ran, and how often.
"""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from commands import JSON_LOGS, MARKER, RUN, pgpool_cmd, run_pgpool
from dbtools import listeners, one
from jsonlogs import only_event
from processes import Pgpool, alive, start_pgpool
from prometheus_client.parser import text_string_to_metric_families
from records import read_records
from waits import wait_until

import pgpool
from pgpool.host.sizing import SHARED_MAX_BATCH
from pgpool.retry import FREE_INTERRUPTIONS


def starts(record_dir: Path) -> list[tuple[int, int, int, str]]:
    return [r for r in read_records(record_dir) if r[3] == "start"]


def make_due(db: psycopg.Connection) -> None:
    """Skip a retry's backoff instead of sleeping through it."""
    db.execute("UPDATE pgpool_jobs SET run_at = now(), state = 'ready' "
               "WHERE state IN ('ready', 'scheduled')")


def test_burst_runs_every_job_once_and_leaves_the_table_empty(db, dsn, record_dir,
                                                             host_path):
    pgpool.enqueue_many(db, "record", ({"n": i} for i in range(300)))
    done = run_pgpool(dsn, *RUN, "--procs", "2", "--burst", record_dir=record_dir,
                      **JSON_LOGS, **host_path)
    assert done.returncode == 0, done.stderr
    records = read_records(record_dir)
    ids = [r[0] for r in records if r[3] == "end"]
    assert len(ids) == 300 and len(set(ids)) == 300
    # Both workers ran jobs: the pool deals a backlog one job per idle worker per round.
    assert len({r[2] for r in records}) == 2
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)
    finished = only_event(done.stderr, "finished")
    assert {k: finished[k] for k in ("done", "retried", "dead", "released")} == {
        "done": 300, "retried": 0, "dead": 0, "released": 0}


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_batch_auto_takes_few_long_jobs_per_claim_and_does_not_hoard(db, dsn, record_dir):
    # 1 s jobs: a job or two per claim keeps a worker fed, so the rest stay claimable by
    # other hosts. The host never holds more than procs + 3 * batch jobs, and the first
    # claims, made before any job time is known, take one job per worker (batch 2). After
    # that the batch is the smallest whose claim round trip is 10% of the time 2 workers
    # take to run it: 2 x rtt / (0.1 x 1 s) = 20 x rtt, which stays at most 2 unless the
    # median of the recent claims' round trips exceeds 100 ms. A claim is one indexed
    # statement on a 10-row table (about 1 ms). With 0.2 s jobs the limit was 20 ms, and a
    # two-core machine running three busy loops beside the test passed it (batch 3); 100 ms
    # is far above that. So the host holds at most 2 + 3 * 2 jobs that have not ended
    # (a fixed batch of 50 would take all 10 at once). A job handed to a worker counts as
    # held until its handler ends, so a job on its way to a worker is not miscounted.
    pgpool.enqueue_many(db, "record", [{"sleep": 1.0}] * 10)
    host = start_pgpool(dsn, *RUN, "--procs", "2", "--burst", record_dir=record_dir)
    most_held = 0

    def sample_until_exit() -> bool:
        nonlocal most_held
        exited = host.poll() is not None
        running, left = one(db, "SELECT count(*) FILTER (WHERE state = 'running'), count(*) "
                                "FROM pgpool_jobs")
        # Held: running in the table, minus the ended jobs whose ack is not yet written
        # (ended, minus the deleted ones). Ends are read after the table, so this never
        # overstates it.
        ended = sum(1 for r in read_records(record_dir) if r[3] == "end")
        most_held = max(most_held, running - (ended - (10 - left)))
        return exited

    wait_until(sample_until_exit, "the burst host to finish", 120, interval=0.01)
    assert host.wait() == 0, host.stderr
    assert most_held <= 2 + 3 * 2
    finished = only_event(host.stderr, "finished")
    # Each claim takes at most a batch, or one job per idle worker (2): so at least 5 claims
    # for 10 jobs while the batch is 2 (above); 3 leaves room for a batch of 4.
    assert finished["claims"] >= 3, finished
    assert finished["batch_auto"] is True
    assert len(starts(record_dir)) == 10


def test_batch_auto_grows_for_short_jobs(db, dsn):
    pgpool.enqueue_many(db, "noop", [{}] * 3000)
    # One kind served: no prompt claim to keep the batch short for (the next test).
    done = run_pgpool(dsn, *RUN, "--procs", "2", "--burst", "--kinds", "noop", **JSON_LOGS)
    assert done.returncode == 0, done.stderr
    finished = only_event(done.stderr, "finished")
    assert finished["done"] == 3000 and finished["batch_auto"] is True
    # The batch grows at most 2x per claim, from one job per worker (2) towards what the
    # sizer asks for noop jobs: 2 workers x claim round trip / (10% x job time), which is
    # the cap of 1000 as long as a claim (milliseconds) takes 50x a noop (microseconds)
    # on average, and is still above 100 if load stretched that ratio to only 5x. Doubling
    # reaches 512 in 9 claims, a few big ones take the rest, and the two claim loops find
    # the queue empty a couple of times at the end (not once per outcome): about 20
    # claims. Under 40 leaves room for a preempted job to shrink the batch for a while
    # (it regrows in a few claims), and still needs the batch to have grown past about 85:
    # with a batch that stopped at 64, 3000 jobs take over 50 claims.
    assert finished["claims"] < 40, finished
    # The batch it ends with follows the last jobs' times; only a job time above 10 claim
    # round trips (not a noop's, however loaded the machine) would bring it back to 2.
    assert finished["batch"] > 2, finished
    assert one(db, "SELECT count(*) FROM pgpool_jobs")[0] == 0


def test_batch_auto_stays_short_while_a_kind_served_has_no_job_held(db, dsn):
    # The host serves the test modules' kinds and holds jobs of one: a job of any other
    # would get a prompt claim, which commits behind this host's claims and acks. Those
    # take 50 at most, where one kind's grow past that (above).
    pgpool.enqueue_many(db, "noop", [{}] * 3000)
    done = run_pgpool(dsn, *RUN, "--procs", "2", "--burst", **JSON_LOGS)
    assert done.returncode == 0, done.stderr
    finished = only_event(done.stderr, "finished")
    assert finished["done"] == 3000 and finished["batch"] <= SHARED_MAX_BATCH, finished
    # Doubling from 2 reaches 50 in 5 claims; then 50 a claim: 3000 jobs take 60 or more.
    assert finished["claims"] >= 3000 // SHARED_MAX_BATCH, finished
    assert one(db, "SELECT count(*) FROM pgpool_jobs")[0] == 0


@pytest.mark.soak  # a big drain: `make soak-test`
@pytest.mark.xdist_group("fleet")  # several hosts on the shared server: tests/conftest.py
def test_two_dispatchers_drain_10000_jobs_none_twice_none_lost_few_transactions(
        db, dsn, record_dir):
    hosts = [start_pgpool(dsn, *RUN, "--procs", "1", record_dir=record_dir)
             for _ in range(2)]
    # Both hosts are up and listening before the jobs arrive, so both take part.
    for h in hosts:
        h.event("started")
    wait_until(lambda: len(listeners(db)) == 2, "both LISTENs")
    db.execute("SELECT pg_stat_clear_snapshot()")
    before = one(db, "SELECT xact_commit FROM pg_stat_database "
                     "WHERE datname = current_database()")[0]
    began = time.monotonic()
    pgpool.enqueue_many(db, "record", ({"n": i} for i in range(10_000)))
    # Wait on the workers' record files, not on the table: polling the table would add a
    # transaction every poll to the database's count, which measures the dispatchers here.
    wait_until(lambda: ended_count(record_dir) == 10_000, "every job to run", 180,
               interval=0.1)
    for h in hosts:
        h.send_signal(signal.SIGTERM)
    for h in hosts:
        assert h.wait() == 0, h.stderr
    seconds = time.monotonic() - began
    db.execute("SELECT pg_stat_clear_snapshot()")
    after = one(db, "SELECT xact_commit FROM pg_stat_database "
                    "WHERE datname = current_database()")[0]

    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)  # every job acked
    runs = Counter(r[0] for r in starts(record_dir))
    assert len(runs) == 10_000  # none lost
    assert max(runs.values()) == 1  # none run twice
    assert one(db, "SELECT count(*) FROM pgpool_dead") == (0,)
    # Both hosts took part (each is a separate dispatcher with its own worker).
    per_host = Counter(r[2] for r in starts(record_dir))
    assert len(per_host) == 2 and min(per_host.values()) > 0, per_host
    # Grouped acks and batch claims: far fewer transactions than jobs. Claims take batches
    # of 50 of these short jobs (the hosts serve several kinds, and hold none of most:
    # `SHARED_MAX_BATCH`); acks are written when a batch is full or every 50 ms. The 50 ms
    # flushes are the part that grows with time rather than jobs: a machine loaded enough
    # that a batch of outcomes never fills within 50 ms flushes up to 20 times a second
    # per host, however few jobs each flush carries, so those are allowed on top of one
    # transaction per 10 jobs. (Here the drain takes about a second and a few hundred
    # transactions; at the wait's 180 s limit the bound is still below one transaction
    # per job.)
    transactions = after - before
    allowed = 10_000 / 10 + len(hosts) * 20 * seconds
    finished = [only_event(h.stderr, "finished") for h in hosts]
    assert transactions < allowed, (transactions, seconds, finished)


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_failures_back_off_then_dead_letter_with_the_error(db, dsn, record_dir):
    job = pgpool.enqueue(db, "fail", {"secret": MARKER})  # handler: max_attempts=3
    for attempt in (1, 2):
        (before,) = one(db, "SELECT now()")
        done = run_pgpool(dsn, *RUN, "--procs", "1", "--burst", record_dir=record_dir)
        assert done.returncode == 0, done.stderr
        assert MARKER not in done.stderr  # payloads are never logged
        attempts, run_at, after, error = one(
            db, "SELECT attempts, run_at, now(), last_error FROM pgpool_jobs WHERE id = %s",
            job)
        assert attempts == attempt
        # The retry is due a delay after the ack that scheduled it: nominal/2 to nominal
        # (base 1 s, doubling, equal jitter). The database's clock before and after the
        # run brackets the ack, so this holds however slowly the run went.
        nominal = 2 ** (attempt - 1)
        assert (run_at - before).total_seconds() >= nominal / 2
        assert (run_at - after).total_seconds() <= nominal
        assert "ValueError: this job always fails" in error
        make_due(db)
    done = run_pgpool(dsn, *RUN, "--procs", "1", "--burst", record_dir=record_dir,
                      **JSON_LOGS)
    assert done.returncode == 0
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)
    dead = one(db, "SELECT id, attempts, max_attempts, last_error FROM pgpool_dead")
    assert dead[:3] == (job, 3, 3)
    assert "ValueError: this job always fails" in dead[3]
    assert len(starts(record_dir)) == 3
    assert only_event(done.stderr, "finished")["dead"] == 1
    assert MARKER not in done.stderr  # nor in the JSON log


@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_a_job_that_fails_once_succeeds_on_retry(db, dsn, record_dir):
    pgpool.enqueue(db, "flaky", {"succeed_on": 2})
    assert run_pgpool(dsn, *RUN, "--burst", record_dir=record_dir).returncode == 0
    make_due(db)
    assert run_pgpool(dsn, *RUN, "--burst", record_dir=record_dir).returncode == 0
    assert [(r[1], r[3]) for r in sorted(read_records(record_dir), key=lambda r: r[1])] == [
        (1, "start"), (2, "start"), (2, "end")]
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)


@pytest.mark.parametrize(("how", "cause"), [
    ("kill", "worker died: signal 9 (SIGKILL)"),
    ("segfault", "worker died: signal 11 (SIGSEGV)"),
    ("exit", "worker died: exit code 7"),
])
def test_a_dying_worker_fails_only_its_job_and_is_replaced(db, dsn, record_dir, how, cause,
                                                           host_path):
    # One worker slot, and the crash job first (higher priority). The two claim loops may
    # still hand the worker a record job before it (whichever claim returns first), so the
    # crashed worker may have run jobs before the crash, but none after it. One attempt, so
    # the crash is final within the run: a retry's backoff (0.5 to 1 s) can come due before a
    # burst run on a loaded machine ends, and would run the crash job again in it.
    crash = pgpool.enqueue(db, "crash", {"how": how}, priority=1, max_attempts=1)
    pgpool.enqueue_many(db, "record", ({"n": i} for i in range(50)))
    done = run_pgpool(dsn, *RUN, "--procs", "1", "--burst", record_dir=record_dir,
                      **host_path)
    assert done.returncode == 0, done.stderr
    left = db.execute("SELECT id, kind, state, attempts, run_at - now(), lease_until - now()"
                      " FROM pgpool_jobs").fetchall()
    assert left == [], (left, done.stderr)
    # The crash counted as the job's one attempt (it is no free interruption).
    assert one(db, "SELECT id, attempts, last_error FROM pgpool_dead") == (crash, 1, cause)
    (crashed,) = [r[2] for r in read_records(record_dir) if r[0] == crash]
    ends = [r for r in read_records(record_dir) if r[3] == "end"]
    # Every other job ran once, on its first attempt (none was blamed for the crash), and
    # on a replacement worker.
    assert len(ends) == 50 and len({r[0] for r in ends}) == 50
    assert {r[1] for r in ends} == {1}
    # A worker's records are in the order it ran them: the crash was its last, and the
    # rest ran on the worker that replaced it (the only other pid, with one slot).
    assert [r[0] for r in read_records(record_dir) if r[2] == crashed][-1] == crash
    assert any(r[2] != crashed for r in ends)


def test_hard_timeout_kills_a_spinning_handler(db, dsn, record_dir, host_path):
    spin = pgpool.enqueue(db, "spin", {})  # handler: timeout=1, max_attempts=1
    pgpool.enqueue_many(db, "record", ({"n": i} for i in range(20)))
    done = run_pgpool(dsn, *RUN, "--procs", "2", "--burst", record_dir=record_dir,
                      **host_path)
    assert done.returncode == 0, done.stderr
    assert one(db, "SELECT id, last_error FROM pgpool_dead") == (
        spin, "timeout: killed after 1s")
    assert len([r for r in read_records(record_dir) if r[3] == "end"]) == 20


def test_sigterm_finishes_running_job_and_hands_back_the_rest(db, dsn, record_dir,
                                                              host_path):
    ids = [pgpool.enqueue(db, "record", {"sleep": 1.0, "n": i}) for i in range(6)]
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--batch", "6", record_dir=record_dir,
                        **host_path)
    job_id, _, worker_pid, _ = wait_until(lambda: starts(record_dir), "the first job")[0]
    # Process titles show each process's role and the job it runs.
    title = Path(f"/proc/{worker_pid}/cmdline").read_bytes().rstrip(b"\0").decode()
    assert title == f"pgpool worker 0: record#{job_id}"
    assert Path(f"/proc/{host.pid}/cmdline").read_bytes().startswith(b"pgpool dispatcher: ")
    assert host.stop() == 0, host.stderr
    (started,) = starts(record_dir)
    assert [r[3] for r in read_records(record_dir)] == ["start", "end"]
    # The finished job was acked; every other job is ready again, with no attempt spent
    # (its claim kept as the ownership token, not counted).
    left = db.execute("SELECT id, state, attempts, interruptions, locked_by FROM pgpool_jobs "
                      "ORDER BY id").fetchall()
    assert left == [(i, "ready", 1, 1, None) for i in ids if i != started[0]]
    assert only_event(host.stderr, "stopping")["signal"] == "SIGTERM"
    finished = only_event(host.stderr, "finished")
    assert (finished["done"], finished["released"]) == (1, 5), finished


@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_grace_expiry_kills_the_job_and_returns_it_without_counting_the_attempt(
        db, dsn, record_dir, host_path):
    # Its only attempt: were the cut-off counted, a deploy would dead-letter it.
    job = pgpool.enqueue(db, "record", {"sleep": 600}, max_attempts=1)
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--grace", "0.5", record_dir=record_dir,
                        **host_path)
    wait_until(lambda: starts(record_dir), "the job to start")
    assert host.stop() == 0, host.stderr
    assert not alive(starts(record_dir)[0][2])
    state = one(db, "SELECT state, attempts, interruptions, locked_by, last_error "
                    "FROM pgpool_jobs WHERE id = %s", job)
    assert state == ("ready", 1, 1, None, "shutdown grace period (0.5s) expired")
    assert only_event(host.stderr, "finished")["interrupted"] == 1
    # The bound: once FREE_INTERRUPTIONS cut-offs went uncounted, the next one counts,
    # and on its last attempt that is the end of it.
    db.execute("UPDATE pgpool_jobs SET attempts = %s, interruptions = %s",
               (FREE_INTERRUPTIONS, FREE_INTERRUPTIONS))
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--grace", "0.5", record_dir=record_dir,
                        **host_path)
    wait_until(lambda: len(starts(record_dir)) == 2, "the job to start again")
    assert host.stop() == 0, host.stderr
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)
    assert one(db, "SELECT attempts, interruptions, last_error FROM pgpool_dead") == (
        FREE_INTERRUPTIONS + 1, FREE_INTERRUPTIONS, "shutdown grace period (0.5s) expired")


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_a_dead_hosts_unstarted_jobs_come_back_without_counting_an_attempt(
        db, dsn, record_dir):
    # One worker, four max_attempts=1 jobs claimed in one batch: one runs, three wait.
    ids = [pgpool.enqueue(db, "record", {"sleep": 600}, max_attempts=1) for _ in range(4)]
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--batch", "4", "--lease", "1",
                        record_dir=record_dir)
    ran = wait_until(lambda: starts(record_dir), "the first job to start")[0][0]
    wait_until(lambda: one(db, "SELECT started FROM pgpool_jobs WHERE id = %s", ran)[0],
               "a heartbeat to record that it started", 10)
    assert one(db, "SELECT count(*) FILTER (WHERE state = 'running'), "
                   "count(*) FILTER (WHERE started) FROM pgpool_jobs") == (4, 1)
    host.kill()
    host.wait()
    wait_until(lambda: one(db, "SELECT bool_and(lease_until < now()) FROM pgpool_jobs")[0],
               "the leases to expire", 10)
    db.execute("UPDATE pgpool_jobs SET payload = '{}'")
    done = run_pgpool(dsn, *RUN, "--procs", "2", "--burst", record_dir=record_dir)
    assert done.returncode == 0, done.stderr
    # The one that ran used its only attempt; the three that never started ran now, as
    # their first counted attempt (their second claim).
    assert one(db, "SELECT id, attempts, interruptions FROM pgpool_dead") == (ran, 1, 0)
    ends = sorted((r[0], r[1]) for r in read_records(record_dir) if r[3] == "end")
    assert ends == [(i, 2) for i in ids if i != ran]
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_second_signal_stops_at_once_and_the_lease_brings_the_job_back(db, dsn, record_dir):
    job = pgpool.enqueue(db, "record", {"sleep": 600})
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--lease", "1", record_dir=record_dir)
    wait_until(lambda: starts(record_dir), "the job to start")
    host.send_signal(signal.SIGTERM)
    assert host.event("stopping")["signal"] == "SIGTERM"
    assert host.stop(signal.SIGINT) == 128 + signal.SIGINT, host.stderr
    wait_until(lambda: not alive(starts(record_dir)[0][2]), "the worker to be gone", 10)
    assert one(db, "SELECT state FROM pgpool_jobs WHERE id = %s", job) == ("running",)
    # Nobody acked it; once the lease runs out, any host's reaper returns it.
    wait_until(lambda: one(db, "SELECT lease_until < now() FROM pgpool_jobs")[0],
               "the lease to expire", 10)
    db.execute("UPDATE pgpool_jobs SET payload = '{}'")  # the rerun should be quick
    done = run_pgpool(dsn, *RUN, "--procs", "1", "--burst", record_dir=record_dir)
    assert done.returncode == 0, done.stderr
    assert [(r[1], r[3]) for r in read_records(record_dir) if r[3] == "end"] == [(2, "end")]
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)


@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_killed_dispatcher_takes_its_workers_down_and_the_jobs_come_back(
        db, dsn, record_dir, host_path):
    pgpool.enqueue_many(db, "record", ({"sleep": 600} for _ in range(2)))
    host = start_pgpool(dsn, *RUN, "--procs", "2", "--lease", "1", record_dir=record_dir,
                        **host_path)
    wait_until(lambda: len(starts(record_dir)) == 2, "both jobs to start")
    host.kill()
    host.wait()
    for _, _, pid, _ in starts(record_dir):
        wait_until(lambda pid=pid: not alive(pid), f"orphaned worker {pid} to exit", 10)
    wait_until(lambda: one(db, "SELECT bool_and(lease_until < now()) FROM pgpool_jobs")[0],
               "the leases to expire", 10)
    db.execute("UPDATE pgpool_jobs SET payload = '{}'")
    done = run_pgpool(dsn, *RUN, "--procs", "2", "--burst", record_dir=record_dir)
    assert done.returncode == 0, done.stderr
    assert sorted(r[1] for r in read_records(record_dir) if r[3] == "end") == [2, 2]
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_burst_waits_for_the_jobs_a_killed_host_still_holds(db, dsn, record_dir):
    pgpool.enqueue_many(db, "record", [{"sleep": 600}] * 2)
    host = start_pgpool(dsn, *RUN, "--procs", "2", "--lease", "5", record_dir=record_dir)
    wait_until(lambda: len(starts(record_dir)) == 2, "both jobs to start")
    host.kill()
    host.wait()
    db.execute("UPDATE pgpool_jobs SET payload = '{}'")  # their next attempts are quick
    # Heartbeats came every 5/3 s, so each lease still has at least 3 s to run: the burst
    # host starts while the dead host holds both jobs, and must not call that drained.
    assert one(db, "SELECT bool_and(lease_until > now() + interval '1 second') "
                   "FROM pgpool_jobs") == (True,)
    done = run_pgpool(dsn, *RUN, "--procs", "2", "--burst", record_dir=record_dir)
    assert done.returncode == 0, done.stderr
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)
    assert sorted(r[1] for r in ended(record_dir)) == [2, 2]


@contextmanager
def serving(dsn: str, record_dir: Path, *args: str, **env: str) -> Iterator[Pgpool]:
    """A dispatcher that has started up; stopped with SIGTERM afterwards (must exit 0)."""
    host = start_pgpool(dsn, *RUN, *args, record_dir=record_dir, **env)
    try:
        host.event("started")
        yield host
    finally:
        status = host.stop()
    assert status == 0, host.stderr


def ended_count(record_dir: Path) -> int:
    """Jobs recorded as ended, counted without parsing (cheap enough to poll 10,000)."""
    return sum(f.read_bytes().count(b" end\n") for f in record_dir.glob("*.log"))


def ended(record_dir: Path) -> list[tuple[int, int, int, str]]:
    return [r for r in read_records(record_dir) if r[3] == "end"]


def test_notify_wakes_an_idle_dispatcher_without_waiting_for_the_poll(db, dsn, record_dir):
    with serving(dsn, record_dir, "--procs", "1", "--poll", "600"):
        # The claim loop may still be in its first empty claim: enqueue after LISTEN is up.
        wait_until(lambda: listeners(db), "LISTEN")
        pgpool.enqueue(db, "record", {})
        # The poll interval is 10 minutes: only the notification can explain a pickup.
        wait_until(lambda: ended(record_dir), "the job to run", 20)


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_each_notification_costs_one_claim_not_one_per_claim_loop(db, dsn, record_dir):
    # A notification is usually one job: it wakes one of the two claim loops, whose claim
    # takes it; waking both would add an empty claim per job. A fixed batch of 2 makes a
    # one-job claim a short one, after which the loop waits for work: with --batch auto a
    # batch of 1 (before the first job time is known, or for as long as the measured job
    # time stays above 10 claim round trips, which preemption on a loaded machine can
    # cause) makes every claim a full one, followed by more, whatever the wake-up policy.
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--batch", "2", "--poll", "600",
                        "--metrics-port", "0", "--metrics-host", "127.0.0.1",
                        record_dir=record_dir)
    port = host.event("metrics")["port"]
    wait_until(lambda: listeners(db), "LISTEN")
    claims_after_first = None
    for n in range(1, 21):
        pgpool.enqueue(db, "record", {})
        wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_jobs") == (0,),
                   f"job {n} to be acked", 20)
        if n == 1:
            claims_after_first = claims_sent(port)
    assert len(ended(record_dir)) == 20
    # Counted wake-ups, not timing: job n+1 is enqueued only once job n is acked, so its
    # worker slot is free again and both loops wait for work (nothing else wakes them: no
    # poll for 10 minutes), and its notification wakes one loop for one claim, a short one.
    # Waking both loops on every notification would make it 38. (Until job 1 is acked, each
    # loop's first claim, the listener's wake as it connects and the first notification
    # race on a loaded machine: not counted here.)
    assert claims_sent(port) - claims_after_first == 19, host.stderr
    assert host.stop() == 0, host.stderr


def claims_sent(port: int) -> float:
    """A dispatcher's ``pgpool_claims_total``, read from its metrics port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    (total,) = [sample.value for family in text_string_to_metric_families(text)
                for sample in family.samples if sample.name == "pgpool_claims_total"]
    return total


def test_polling_is_the_backstop_for_a_lost_notification(db, dsn, record_dir):
    # An idle host (its listener connected, nothing ready) polls every --idle-poll.
    with serving(dsn, record_dir, "--procs", "1", "--poll", "0.2", "--idle-poll", "0.5"):
        # A plain INSERT sends no notification, like one lost while disconnected.
        db.execute("INSERT INTO pgpool_jobs (kind, payload) VALUES ('record', '{}')")
        wait_until(lambda: ended(record_dir), "the polled job to run", 20)


def test_async_handlers_run_to_completion(db, dsn, record_dir):
    pgpool.enqueue_many(db, "async_record", [{}] * 5)
    done = run_pgpool(dsn, *RUN, "--burst", record_dir=record_dir)
    assert done.returncode == 0, done.stderr
    assert len(ended(record_dir)) == 5


def test_jobs_of_kinds_without_a_handler_stay_ready(db, dsn, record_dir):
    orphan = pgpool.enqueue(db, "nobody-handles-this", {})
    pgpool.enqueue(db, "record", {})
    done = run_pgpool(dsn, *RUN, "--burst", record_dir=record_dir)
    assert done.returncode == 0, done.stderr
    assert db.execute("SELECT id, state, attempts FROM pgpool_jobs").fetchall() == [
        (orphan, "ready", 0)]


def test_queue_option_limits_what_a_host_claims(db, dsn, record_dir):
    pgpool.enqueue(db, "record", {}, queue="a")
    other = pgpool.enqueue(db, "record", {}, queue="b")
    pgpool.enqueue(db, "record", {}, queue="c")
    done = run_pgpool(dsn, *RUN, "--queue", "a", "--queue", "c", "--burst",
                      record_dir=record_dir)
    assert done.returncode == 0, done.stderr
    assert db.execute("SELECT id FROM pgpool_jobs").fetchall() == [(other,)]


def test_subprocess_helpers_really_run_the_cli():
    # Guards the harness itself: a bogus subcommand must fail through the real CLI.
    result = subprocess.run(pgpool_cmd("bogus"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_resource_limits_recycle_workers_and_fail_only_the_runaway_job(db, dsn, record_dir):
    hog = pgpool.enqueue(db, "hog", {"mib": 2048})  # handler: max_attempts=1
    pgpool.enqueue_many(db, "record", ({"n": i} for i in range(12)))
    done = run_pgpool(dsn, *RUN, "--procs", "1", "--burst", "--max-tasks-per-child", "4",
                      "--max-memory", "512", record_dir=record_dir)
    assert done.returncode == 0, done.stderr
    assert one(db, "SELECT id FROM pgpool_dead WHERE last_error LIKE '%%MemoryError%%'") == (
        hog,)
    records = read_records(record_dir)
    assert len([r for r in records if r[3] == "end" and r[0] != hog]) == 12
    # 13 jobs on one process slot: recycled every 4 jobs and after the MemoryError, so no
    # worker process ran more than 4 jobs, and at least 4 processes took turns.
    jobs_per_worker = Counter(pid for _, pid in {(r[0], r[2]) for r in records})
    assert max(jobs_per_worker.values()) <= 4, jobs_per_worker
    assert len(jobs_per_worker) >= 4, jobs_per_worker


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_procs_far_above_the_cpu_count_warns_but_runs(db, dsn):
    from pgpool.host.config import usable_cpus

    procs = 4 * usable_cpus() + 1
    pgpool.enqueue(db, "noop", {})
    done = run_pgpool(dsn, *RUN, "--procs", str(procs), "--burst")
    assert done.returncode == 0, done.stderr
    assert f"--procs {procs} is more than 4x the {usable_cpus()} usable CPUs" in done.stderr
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(") ", 1)[1].split()
            if int(fields[1]) == pid:
                out.append((int(entry.name), fields[0]))
    return out


def test_dead_workers_are_reaped_and_replaced_while_the_dispatcher_runs(db, dsn, record_dir,
                                                                        host_path):
    with serving(dsn, record_dir, "--procs", "2", **host_path) as host:
        # One attempt each: a retry's backoff (0.5 to 1 s) would come due during the checks
        # below and crash a replacement worker, whose zombie the last check could then see
        # in the moment before the dispatcher reaps it.
        pgpool.enqueue_many(db, "crash", [{"how": "kill"}, {"how": "exit"}], max_attempts=1)
        wait_until(lambda: one(db, "SELECT count(*) = 2 FROM pgpool_dead WHERE attempts = 1")[0],
                   "both crashes to be recorded")
        crashed = {r[2] for r in starts(record_dir)}
        # Two live workers again, none of them a crashed one, and no zombie left behind.
        wait_until(lambda: len(workers(host.pid)) == 2, "two replacement workers")
        assert not set(workers(host.pid)) & crashed
        assert not [c for c in children(host.pid) if c[1] == "Z"]


def workers(pid: int) -> list[int]:
    """Live worker processes of dispatcher ``pid``, known by their process titles."""
    found = []
    for child, state in children(pid):
        try:
            title = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if state != "Z" and title.startswith(b"pgpool worker"):
            found.append(child)
    return found


def test_listen_is_re_established_after_its_connection_is_killed(db, dsn, record_dir):
    with serving(dsn, record_dir, "--procs", "1", "--poll", "600"):
        old = wait_until(lambda: listeners(db), "LISTEN")[0]
        db.execute("SELECT pg_terminate_backend(%s)", (old,))
        wait_until(lambda: (listeners(db) or [old])[0] != old, "a new LISTEN")
        pgpool.enqueue(db, "record", {})
        # Polling is 10 minutes away: only the re-established LISTEN can explain a pickup.
        wait_until(lambda: ended(record_dir), "the job to run", 20)


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_sigterm_during_start_up_is_a_graceful_stop(db, dsn, tmp_path):
    marker = tmp_path / "importing"
    (tmp_path / "slowimport.py").write_text(
        "import pathlib, time\n"
        f"pathlib.Path({str(marker)!r}).touch()\n"
        "time.sleep(3)  # a heavy import, e.g. a model or a big library\n"
        "import pgpool\n"
        "@pgpool.handler('slow-import-kind')\n"
        "def handle(payload): pass\n")
    host = start_pgpool(dsn, "run", "--handlers", "slowimport", PYTHONPATH=str(tmp_path))
    wait_until(marker.exists, "the handler module to start importing")
    assert host.stop() == 0, host.stderr
    assert "Traceback" not in host.stderr
