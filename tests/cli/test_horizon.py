"""Why the queue slowed down (issue 32): what holds back vacuum of pgpool's tables, shown by
``pgpool status`` (text and ``--json``), ``/metrics``, ``pgpool health`` and the dashboard's
snapshot, against real holders on a real PostgreSQL: a session idle in a transaction that
wrote, a REPEATABLE READ snapshot, a prepared transaction and a logical replication slot
(on a server of the test's own, set up for them), and a standby's feedback and slot (in
the soak tier). Each statement the warning gives is run,
and must end the hold; a VACUUM shows that what pgpool blames did hold the rows."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import psycopg
import pytest
from commands import MARKER, RUN, run_pgpool
from horizon_holds import PILED, dead_rows, hold_horizon, pile_dead_rows
from processes import start_pgpool
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql as pgsql
from waits import wait_until

from pgpool.horizon import DeadRowsTrend
from pgpool.sql import observe


def horizon(dsn: str, *args: str) -> dict[str, Any]:
    """``pgpool status --json``'s ``horizon``, with ``args`` (``--horizon-warn 1s``)."""
    done = run_pgpool(dsn, "status", "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["horizon"]


def warned(dsn: str, *args: str) -> dict[str, Any]:
    """The horizon once status warns of it (its holder is past the threshold given)."""
    return wait_until(lambda: (h := horizon(dsn, *args))["warning"] and h,
                      "status to warn of the held horizon")


def pid_of(conn: psycopg.Connection) -> int:
    return conn.info.backend_pid


@pytest.mark.parametrize("how", ["write", "snapshot"])
def test_status_names_the_session_that_holds_the_horizon_and_how_to_end_it(db, dsn, how):
    holder = hold_horizon(dsn, how)
    pile_dead_rows(db)
    # Past the default threshold (5 minutes) it would warn; not yet.
    quiet = horizon(dsn)
    assert quiet["warning"] is None and quiet["piling_up"] is True
    assert quiet["holders"][0]["pid"] == pid_of(holder)

    # Warned once the transaction is 1 s old; its query started a moment after its BEGIN
    # (the snapshot's), so wait for that one to be 1 s old too.
    h = wait_until(lambda: (h := warned(dsn, "--horizon-warn", "1s"))["holders"][0][
        "query_seconds"] >= 1 and h, "the holder's query to have run for 1 s")
    first = h["holders"][0]
    pid = pid_of(holder)
    assert first["kind"] == "backend" and first["pid"] == pid
    assert first["state"] == "idle in transaction"
    assert first["application_name"] == "report-tool"
    assert first["user"] == db.info.user
    assert first["age_seconds"] >= 1 and first["query_seconds"] >= 1
    # The query's first line only: the second one (a comment with the marker) stays out.
    assert first["query"].startswith("SELECT ") and MARKER not in first["query"]
    assert first["end"] == f"SELECT pg_terminate_backend({pid})"
    assert h["age_transactions"] == first["age_transactions"]
    assert h["piling_up"] and h["tables"][0]["table"] == "pgpool_jobs"
    assert h["tables"][0]["dead_tuples"] >= PILED
    warning = h["warning"]
    assert f"held by backend pid {pid} (user " in warning
    assert f"SELECT pg_terminate_backend({pid})" in warning
    assert "pgpool_jobs has " in warning and MARKER not in warning

    text = run_pgpool(dsn, "status", "--horizon-warn", "1s").stdout
    assert "\nxmin horizon: " in text and f"held by backend pid {pid} " in text
    assert "\nwarning: the xmin horizon of pgpool's tables is " in text
    assert first["query"] in text and MARKER not in text  # the operator's own command
    assert horizon(dsn, "--horizon-warn", "off")["warning"] is None

    # What pgpool blames is what holds the rows: a vacuum leaves them while it lives...
    db.execute("VACUUM pgpool_jobs")
    assert dead_rows(db) >= PILED
    # ...and its own statement ends it, after which a vacuum removes them.
    assert db.execute(first["end"]).fetchone() == (True,)
    wait_until(lambda: all(x["pid"] != pid for x in horizon(dsn)["holders"]),
               "the holder to be gone")
    db.execute("VACUUM pgpool_jobs")
    assert dead_rows(db) < PILED
    assert horizon(dsn, "--horizon-warn", "1s")["warning"] is None
    holder.close()


def test_no_warning_while_the_dead_rows_do_not_pile_up(db, dsn):
    holder = hold_horizon(dsn, "write")
    h = wait_until(lambda: (h := horizon(dsn, "--horizon-warn", "1s"))["holders"]
                   and h["holders"][0]["age_seconds"] >= 1 and h,
                   "the holder to be a second old")
    assert h["holders"][0]["pid"] == pid_of(holder)
    assert not h["piling_up"] and h["pile_at"] == 20_000 and h["warning"] is None
    holder.close()


def test_a_bad_horizon_warn_is_one_line(dsn):
    done = run_pgpool(dsn, "status", "--horizon-warn", "soon")
    assert done.returncode == 2 and "--horizon-warn" in done.stderr
    assert "is not a duration" in done.stderr and done.stderr.count("\n") == 1
    done = run_pgpool(dsn, "status", PGPOOL_HORIZON_WARN="5 minutes")
    assert done.returncode == 2
    assert done.stderr.startswith("pgpool: error: PGPOOL_HORIZON_WARN: ")


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_a_prepared_transaction_and_a_logical_slot_on_a_server_set_up_for_them(own_server):
    pg = own_server
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET wal_level = logical")
        conn.execute("ALTER SYSTEM SET max_prepared_transactions = 2")
    pg.restart()
    assert run_pgpool(pg.dsn, "migrate").returncode == 0
    db = psycopg.connect(pg.dsn, autocommit=True)
    # A logical slot holds back vacuum of the catalogs only (its catalog_xmin), never of
    # pgpool's tables: listed apart, and not blamed.
    db.execute("SELECT pg_create_logical_replication_slot('cdc_feed', 'pgoutput')")
    pile_dead_rows(db)
    h = horizon(pg.dsn, "--horizon-warn", "1s")
    assert [(c["kind"], c["name"], c["slot_type"], c["state"]) for c in h["catalog_holders"]
            ] == [("slot", "cdc_feed", "logical", "inactive")]
    assert all(x["kind"] != "slot" for x in h["holders"]) and h["warning"] is None
    assert db.execute(observe.HORIZON_XID).fetchone() is None  # what the vacuum keeper reads
    assert ('not holding pgpool\'s tables: logical replication slot "cdc_feed" (inactive'
            in run_pgpool(pg.dsn, "status").stdout)
    db.execute("VACUUM pgpool_jobs")
    assert dead_rows(db) < PILED
    db.execute(h["catalog_holders"][0]["end"])  # it drops the slot
    assert horizon(pg.dsn)["catalog_holders"] == []

    # A prepared transaction nobody finished holds it, whoever looks; its gid is quoted in
    # the statement that ends it.
    gid = "order 7's payment"
    with psycopg.connect(pg.dsn, autocommit=True) as prepared:
        prepared.execute("BEGIN")
        prepared.execute("SELECT txid_current()")
        prepared.execute(pgsql.SQL("PREPARE TRANSACTION {}").format(pgsql.Literal(gid)))
    pile_dead_rows(db)
    h = warned(pg.dsn, "--horizon-warn", "1s")
    first = h["holders"][0]
    assert (first["kind"], first["name"], first["user"]) == ("prepared", gid, "postgres")
    assert first["end"] == "ROLLBACK PREPARED 'order 7''s payment'"
    assert f"held by prepared transaction {gid!r}" in h["warning"]
    assert db.execute(observe.HORIZON_XID).fetchone() == db.execute(
        "SELECT transaction::text FROM pg_prepared_xacts").fetchone()
    assert first["end"] in h["warning"]
    db.execute("VACUUM pgpool_jobs")
    assert dead_rows(db) >= PILED
    db.execute(first["end"])
    assert db.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() == (0,)
    db.execute("VACUUM pgpool_jobs")
    assert dead_rows(db) < PILED
    db.close()


def scrape(url: str) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """/metrics at ``url``: its text, and every sample parsed by prometheus-client."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return text, {(s.name, tuple(sorted(s.labels.items()))): s.value
                  for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_metrics_carry_the_horizon_as_figures_and_bounded_labels(db, dsn, web):
    _, base = web()
    with hold_horizon(dsn, "write", application_name=f"app-{MARKER}") as holder:
        pile_dead_rows(db)
        db.execute("VACUUM pgpool_jobs")

        def held() -> Any:
            text, m = scrape(base + "/metrics")
            return m.get(("pgpool_xmin_horizon_holder", (("kind", "backend"),))) == 1 and (
                text, m)

        text, m = wait_until(held, "the metrics to show the held horizon")
        assert MARKER not in text and str(pid_of(holder)) not in text
        for kind in ("prepared", "slot", "standby"):
            assert m[("pgpool_xmin_horizon_holder", (("kind", kind),))] == 0
        assert m[("pgpool_xmin_horizon_age_transactions", ())] >= 1
        assert m[("pgpool_xmin_horizon_age_seconds", ())] > 0
        assert m[("pgpool_xmin_horizon_hidden_sessions", ())] == 0
        jobs = (("table", "pgpool_jobs"),)
        assert m[("pgpool_table_dead_tuples", jobs)] >= PILED
        by_vacuum = (("by", "vacuum"), *jobs)
        assert m[("pgpool_table_vacuums_total", by_vacuum)] >= 1
        assert m[("pgpool_table_last_vacuum_seconds_ago", by_vacuum)] >= 0
        assert ("pgpool_table_live_tuples", (("table", "pgpool_hosts"),)) in m
    wait_until(lambda: scrape(base + "/metrics")[1][
        ("pgpool_xmin_horizon_holder", (("kind", "backend"),))] == 0,
        "the metrics to show the horizon let go")


def test_the_dashboard_snapshot_has_no_query_or_client_without_payloads_allowed(db, dsn, web):
    # (With --allow-payloads it has them: the browser test shows the query's first line.)
    with hold_horizon(dsn, "write") as holder:
        pile_dead_rows(db)
        _, base = web("--horizon-warn", "1s")

        def warning() -> Any:
            with urllib.request.urlopen(base + "/api/snapshot", timeout=10) as answer:
                h = json.load(answer)["horizon"]
            return h["warning"] and h

        h = wait_until(warning, "the snapshot to warn of the held horizon")
        first = h["holders"][0]
        assert first["pid"] == pid_of(holder)
        assert f"SELECT pg_terminate_backend({pid_of(holder)})" in h["warning"]
        assert first["query"] is None and first["client_addr"] is None
        assert MARKER not in json.dumps(h) and "txid_current" not in json.dumps(h)


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_health_prints_the_warning_stays_healthy_and_the_keeper_says_who_held_its_vacuum(
        db, dsn):
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--metrics-port", "0",
                        "--metrics-host", "127.0.0.1")
    port = host.event("metrics")["port"]
    with hold_horizon(dsn, "write") as holder:
        pid = pid_of(holder)
        pile_dead_rows(db)
        # The keeper vacuums (the rows are due), cannot remove them, and says why.
        held = host.event("vacuum_held")
        assert (held["holder"], held["holder_pid"]) == ("backend", pid)
        assert held["dead_left"] >= PILED and MARKER not in host.stderr
        assert f"SELECT pg_terminate_backend({pid})" in held["message"]
        _, m = scrape(f"http://127.0.0.1:{port}/metrics")
        assert m[("pgpool_vacuum_keeper_vacuums_total", ())] >= 1
        assert m[("pgpool_vacuum_keeper_dead_rows_left", ())] >= PILED

        def health(*args: str) -> Any:
            return run_pgpool(dsn, "health", "--port", str(port), *args)

        answered = wait_until(lambda: (a := health("--horizon-warn", "1s")).stdout.count(
            "\n") == 2 and a, "health to warn of the held horizon")
        assert answered.returncode == 0  # a held horizon never fails the probe
        healthy, warning = answered.stdout.splitlines()
        assert healthy.startswith("pgpool: healthy: ")
        assert warning.startswith("pgpool: warning: the xmin horizon of pgpool's tables is ")
        assert f"SELECT pg_terminate_backend({pid})" in warning and MARKER not in warning
        assert health("--horizon-warn", "off").stdout.count("\n") == 1
        assert health().stdout.count("\n") == 1  # the default, 5 minutes: not yet
    assert host.stop() == 0, host.stderr


def test_the_dead_rows_trend_is_per_minute_over_the_last_minute_of_reports():
    trend = DeadRowsTrend()

    def report(dead: int, at: float) -> Any:
        r = {"tables": [{"table": "pgpool_jobs", "dead_tuples": dead}]}
        trend.add(r, at)
        return r["dead_rows_per_min"]

    assert report(1000, 100.0) is None
    assert report(1100, 102.0) is None  # two seconds: too short to tell
    assert report(1500, 110.0) == 3000.0  # 500 in 10 s
    assert report(1500, 165.0) == 0.0  # only the last minute counts: 1500 then and now


@pytest.mark.soak  # a second server, from a base backup of the first
def test_a_standbys_feedback_then_its_slot_hold_the_horizon(own_server):
    pg = own_server
    assert run_pgpool(pg.dsn, "migrate").returncode == 0
    db = psycopg.connect(pg.dsn, autocommit=True)
    standby = pg.start_standby("hot_standby_feedback=on", "wal_receiver_status_interval=1s")
    try:
        replica = psycopg.connect(standby.dsn, autocommit=True)
        wait_until(lambda: replica.execute("SELECT to_regclass('pgpool_jobs')").fetchone()[0],
                   "the standby to replay the migration")
        # A report on the standby, in one snapshot: its feedback holds the primary back.
        replica.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        replica.execute("SELECT count(*) FROM pgpool_jobs")
        pile_dead_rows(db)
        h = wait_until(lambda: (h := horizon(pg.dsn, "--horizon-warn", "1s"))["warning"]
                       and h["holders"][0]["kind"] == "standby" and h,
                       "the standby's feedback to hold the horizon")
        first = h["holders"][0]
        assert first["age_seconds"] is None and first["end"] is None  # no clock, no statement
        assert "hot_standby_feedback = off" in h["warning"]
        assert "transactions old (the server keeps no clock for it)" in h["warning"]
        db.execute("VACUUM pgpool_jobs")
        assert dead_rows(db) >= PILED

        # Through a slot, the slot holds it: active while the standby streams...
        db.execute("SELECT pg_create_physical_replication_slot('replica_b')")
        with psycopg.connect(standby.dsn, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM SET primary_slot_name = 'replica_b'")
            admin.execute("SELECT pg_reload_conf()")
        h = wait_until(lambda: (h := horizon(pg.dsn, "--horizon-warn", "1s"))["holders"]
                       and h["holders"][0]["kind"] == "slot" and h,
                       "the slot to hold the horizon")
        assert (h["holders"][0]["name"], h["holders"][0]["state"]) == ("replica_b", "active")
        assert "hot_standby_feedback" in h["holders"][0]["advice"]
        # ...and where its standby left it once the standby is gone, until it is dropped.
        replica.close()
        standby.stop()
        h = wait_until(lambda: (h := horizon(pg.dsn, "--horizon-warn", "1s"))["warning"]
                       and h["holders"][0]["state"] == "inactive" and h,
                       "the slot to hold the horizon without its standby")
        first = h["holders"][0]
        assert first["end"] == "SELECT pg_drop_replication_slot('replica_b')"
        assert first["end"] in h["warning"]
        db.execute(first["end"])
        db.execute("VACUUM pgpool_jobs")
        assert dead_rows(db) < PILED
        assert all(x["kind"] == "backend" for x in horizon(pg.dsn)["holders"])
    finally:
        standby.stop()
        db.close()
