"""`--metrics-port`: Prometheus metrics read back with prometheus-client's own parser and
checked against the database, and `/healthz` and `pgpool health` through a real outage."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from commands import RUN, assert_user_error, run_pgpool
from dbtools import one
from scraping import scrape, value, with_metrics
from waits import wait_until

import pgpool
from pgpool import ops


def healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_metrics_count_what_the_database_shows(db, dsn):
    pgpool.enqueue_many(db, "record", [{}] * 30)
    pgpool.enqueue_many(db, "fail", [{}] * 5, max_attempts=1)
    pgpool.enqueue(db, "crash", {"how": "exit"}, max_attempts=1)
    pgpool.enqueue(db, "spin", {})
    host, port = with_metrics(dsn, "--procs", "2")
    wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_jobs")[0] == 0, "the queue to drain")
    scheduled = 7
    for _ in range(scheduled):
        pgpool.enqueue(db, "record", {}, delay=3600)
    # As pgpool.host.isolate leaves a refused ack; enqueued not due, or the host would run it.
    parked = pgpool.enqueue(db, "record", {}, delay=3600)
    db.execute("UPDATE pgpool_jobs SET state = 'parked' WHERE id = %s", (parked,))
    ops.pause(db, "other", force=True)
    m = scrape(port)
    # Outcomes by kind, against what the database kept: every dead letter, every success.
    dead = dict(db.execute("SELECT kind, count(*) FROM pgpool_dead GROUP BY kind").fetchall())
    assert dead == {"fail": 5, "crash": 1, "spin": 1}
    for kind, count in dead.items():
        assert value(m, "pgpool_jobs_finished_total", kind=kind, outcome="dead") == count
    assert value(m, "pgpool_jobs_finished_total", kind="record", outcome="succeeded") == 30
    assert value(m, "pgpool_job_run_seconds_count", kind="record") == 30
    assert value(m, "pgpool_job_queue_lag_seconds_count", kind="record") == 30
    assert value(m, "pgpool_claimed_jobs_total") == 37
    assert value(m, "pgpool_claims_total") == value(m, "pgpool_claim_duration_seconds_count")
    assert value(m, "pgpool_ack_flush_jobs_sum") == 37  # every outcome acked exactly once
    assert value(m, "pgpool_worker_restarts_total", reason="crash") == 1
    assert value(m, "pgpool_worker_restarts_total", reason="timeout") == 1
    assert value(m, "pgpool_worker_processes") == 2
    # The queue's figures, from the database, on the one reporting host.
    assert value(m, "pgpool_queue_metrics_reporter") == 1
    assert value(m, "pgpool_queue_dead_jobs", queue="default", reason="failed") == 7
    assert value(m, "pgpool_queue_dead_jobs", queue="default", reason="discarded") == 0
    assert value(m, "pgpool_queue_jobs", queue="default", state="scheduled") == scheduled
    assert value(m, "pgpool_queue_jobs", queue="default", state="ready") == 0
    assert value(m, "pgpool_queue_jobs", queue="default", state="parked") == 1
    assert value(m, "pgpool_queue_paused", queue="other") == 1
    assert value(m, "pgpool_queue_paused", queue="default") == 0
    assert value(m, "pgpool_fleet_hosts") == 1
    # A second host: still exactly one reports the queue, so a fleet sum counts each job once.
    other, other_port = with_metrics(dsn, "--procs", "1")
    both = [scrape(port), scrape(other_port)]
    assert [value(s, "pgpool_queue_metrics_reporter") for s in both] == [1, 0]
    assert sum(value(s, "pgpool_queue_jobs", queue="default", state="scheduled")
               for s in both) == scheduled
    # The reporter goes; the other takes over at its next scrape.
    assert host.stop() == 0, host.stderr
    taken = scrape(other_port)
    assert value(taken, "pgpool_queue_metrics_reporter") == 1
    assert value(taken, "pgpool_queue_jobs", queue="default", state="scheduled") == scheduled
    assert other.stop() == 0, other.stderr


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_healthz_and_pgpool_health_follow_a_real_database_outage(own_server):
    pg = own_server
    migrated = run_pgpool(pg.dsn, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    host, port = with_metrics(pg.dsn, "--procs", "1", "--lease", "2")

    def health() -> int:
        return run_pgpool(pg.dsn, "health", "--port", str(port), timeout=30).returncode

    assert healthz(port) == 200
    assert health() == 0
    pg.stop()
    # Unhealthy once the database was out of reach for a lease (2 s) and a registry beat.
    wait_until(lambda: healthz(port) == 503, "/healthz to report the outage", 30)
    answered = run_pgpool(pg.dsn, "health", "--port", str(port), timeout=30)
    assert answered.returncode == 1
    assert "database was last reached" in answered.stdout, answered.stdout
    pg.start_again()
    wait_until(lambda: health() == 0, "health to come back with the database", 30)
    assert host.stop() == 0, host.stderr


def test_pgpool_health_with_no_dispatcher_listening_is_unhealthy(dsn):
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    answered = run_pgpool(dsn, "health", "--port", str(port))
    assert answered.returncode == 1
    assert f"no dispatcher answered on 127.0.0.1:{port}" in answered.stdout


@pytest.mark.parametrize(("args", "env", "needles"), [
    (["--metrics-port", "70000"], {}, ["--metrics-port", "a TCP port from 0 to 65535"]),
    ([], {"PGPOOL_METRICS_PORT": "nine"}, ["PGPOOL_METRICS_PORT", "a TCP port"]),
])
def test_bad_metrics_ports_get_one_line_errors(dsn, args: list[str], env: dict[str, str],
                                               needles: list[str]):
    assert_user_error(run_pgpool(dsn, *RUN, *args, **env), *needles)


def test_a_metrics_port_in_use_is_refused_before_anything_starts(dsn):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_pgpool(dsn, *RUN, "--metrics-port", str(port), "--metrics-host",
                            "127.0.0.1")
    assert_user_error(result, f"cannot serve metrics on 127.0.0.1:{port}", "--metrics-port")


def test_pgpool_health_needs_a_port(dsn):
    # run_pgpool's environment has no PGPOOL_METRICS_PORT either.
    assert_user_error(run_pgpool(dsn, "health"), "--port", "PGPOOL_METRICS_PORT")


def test_the_use_of_limits_is_exported(db, dsn):
    """A kind with an operator's override: its slots held and the ready jobs waiting on it,
    as the database shows them (a claim by hand, as a host whose claims are limited would
    leave it), apart from the queue's lag."""
    pgpool.enqueue_many(db, "capped", [{}] * 5)
    ops.set_limit(db, "capped", concurrency=2)
    db.execute("UPDATE pgpool_jobs SET state = 'running', attempts = 1, locked_by = 'h', "
               "lease_until = now() + interval '1 hour', limit_slot = slot, "
               "limit_attempt = 1 FROM (SELECT id AS i, row_number() OVER (ORDER BY id) "
               "AS slot FROM pgpool_jobs LIMIT 2) AS s WHERE id = s.i")
    db.execute("UPDATE pgpool_jobs SET run_at = now() - interval '5 minutes' "
               "WHERE state = 'ready'")
    # A kind limited per tenant: tenant a holds two slots, b one; b's ring used once in
    # the override's hour.
    ops.set_limit(db, "per.tenant", rate=5, per=3600, by="tenant")
    pgpool.enqueue_many(db, "per.tenant", [{}] * 2, tenant="a")
    pgpool.enqueue_many(db, "per.tenant", [{}], tenant="b")
    db.execute("UPDATE pgpool_jobs SET state = 'running', attempts = 1, locked_by = 'h', "
               "lease_until = now() + interval '1 hour', limit_attempt = 1, "
               "limit_scope = 'tenant:' || tenant, limit_slot = s.slot "
               "FROM (SELECT id AS i, row_number() OVER (PARTITION BY tenant ORDER BY id) "
               "AS slot FROM pgpool_jobs WHERE kind = 'per.tenant') AS s WHERE id = s.i")
    db.execute("INSERT INTO pgpool_limit_ticks (kind, scope, slot, used_at, n) "
               "VALUES ('per.tenant', 'tenant:b', 1, now(), 1)")
    host, port = with_metrics(dsn, "--procs", "1")
    m = scrape(port)
    assert value(m, "pgpool_limit_in_use", kind="capped", limit="concurrency") == 2
    assert value(m, "pgpool_limit_in_use", kind="capped", limit="rate") == 0
    # Both slots held: the 3 ready jobs wait on the limit, and are not the queue's lag.
    assert value(m, "pgpool_limit_waiting", kind="capped") == 3
    assert value(m, "pgpool_queue_waiting_on_limits", queue="default") == 3
    assert value(m, "pgpool_queue_oldest_ready_age_seconds", queue="default") == 0
    assert value(m, "pgpool_limit_scopes", kind="per.tenant") == 2
    assert value(m, "pgpool_limit_scope_busiest", kind="per.tenant", limit="concurrency") == 2
    assert value(m, "pgpool_limit_scope_busiest", kind="per.tenant", limit="rate") == 1
    assert value(m, "pgpool_limit_in_use", kind="per.tenant", limit="concurrency") == 3
    assert host.stop() == 0, host.stderr
