"""The view a fleet that sizes itself reads (pgpool_hosts_wanted, migration 0022): per queue,
its ready and running jobs, its lag, and the hosts it wants for the fleet's target lag,
from the job time and --procs the live hosts measured and their claims per second."""

from __future__ import annotations

import psycopg

import pgpool

#: What KEDA's PostgreSQL trigger runs (deploy/kubernetes/keda-scaledobject.yaml): always
#: one row, 0 for a queue with no job.
KEDA_QUERY = ("SELECT coalesce(max(hosts_wanted), 0) FROM pgpool_hosts_wanted "
              "WHERE queue = %s")


def add_host(db: psycopg.Connection, owner: str, *, procs: int, job_seconds: float | None,
             claims_per_sec: float | None, queues: tuple[str, ...] = ("default",),
             seen_ago: float = 0.0, lease: float = 30.0) -> None:
    db.execute(
        "INSERT INTO pgpool_hosts (owner, hostname, pid, procs, queues, kinds, lease, "
        "last_seen, job_seconds, claims_per_sec) VALUES (%s, 'h', 1, %s, %s, '{k}', %s, "
        "now() - make_interval(secs => %s), %s, %s)",
        (owner, procs, list(queues), lease, seen_ago, job_seconds, claims_per_sec))


def wanted(db: psycopg.Connection, queue: str = "default") -> dict[str, object]:
    cur = db.execute("SELECT * FROM pgpool_hosts_wanted WHERE queue = %s", (queue,))
    row = cur.fetchone()
    assert cur.description is not None
    return dict(zip([c.name for c in cur.description], row, strict=True)) if row else {}


def keda(db: psycopg.Connection, queue: str = "default") -> int:
    return db.execute(KEDA_QUERY, (queue,)).fetchone()[0]


def test_a_queue_with_no_job_wants_no_host(db):
    add_host(db, "a", procs=4, job_seconds=0.5, claims_per_sec=10)
    assert wanted(db) == {}
    assert keda(db) == 0


def test_work_and_no_host_wants_one_which_measures_the_job_time(db):
    pgpool.enqueue_many(db, "k", [{} for _ in range(600)])
    row = wanted(db)
    assert (row["ready"], row["running"], row["hosts"], row["job_seconds"]) == (600, 0, 0, None)
    assert row["hosts_wanted"] == 1
    assert keda(db) == 1


def test_hosts_wanted_keep_up_with_arrivals_and_start_the_backlog_within_the_target(db):
    pgpool.enqueue_many(db, "k", [{} for _ in range(600)])
    db.execute("UPDATE pgpool_jobs SET run_at = now() - interval '42 seconds'")
    # Two live hosts of 4 workers, 0.5 s a job, claiming 10 jobs/s each; one stale host
    # (beaten a lease ago) and one serving another queue, neither counted.
    add_host(db, "a", procs=4, job_seconds=0.5, claims_per_sec=10)
    add_host(db, "b", procs=4, job_seconds=0.5, claims_per_sec=10)
    add_host(db, "gone", procs=64, job_seconds=9.0, claims_per_sec=100, seen_ago=30)
    add_host(db, "other", procs=64, job_seconds=9.0, claims_per_sec=100, queues=("other",))
    row = wanted(db)
    assert row["hosts"] == 2 and row["procs"] == 4 and row["job_seconds"] == 0.5
    assert row["claims_per_sec"] == 20
    assert 42 <= row["lag_seconds"] < 52
    # Keeping up: 20 jobs/s x 0.5 s = 10 busy workers; the backlog: 600 x 0.5 s of work
    # to start within 60 s = 5 workers; 15 workers / 4 per host = 3.75: 4 hosts.
    assert row["target_lag_seconds"] == 60
    assert row["hosts_wanted"] == 4 == keda(db)
    # Half the target lag: twice the backlog's workers: (10 + 10) / 4 = 5 hosts.
    db.execute("UPDATE pgpool_fleet SET target_lag_seconds = 30")
    assert wanted(db)["hosts_wanted"] == 5
    # Running jobs count as work in progress, not as backlog: all of them claimed, the
    # fleet only needs to keep up: 10 / 4 = 2.5: 3 hosts.
    db.execute("UPDATE pgpool_jobs SET state = 'running', locked_by = 'a', "
               "lease_until = now() + interval '30 seconds', attempts = 1")
    row = wanted(db)
    assert (row["ready"], row["running"], row["hosts_wanted"]) == (0, 600, 3)


def test_a_target_lag_that_is_not_positive_is_refused(db):
    for bad in ("0", "-1", "'Infinity'"):
        try:
            with db.transaction():
                db.execute(f"UPDATE pgpool_fleet SET target_lag_seconds = {bad}")
        except psycopg.errors.CheckViolation:
            continue
        raise AssertionError(f"target_lag_seconds = {bad} was accepted")
