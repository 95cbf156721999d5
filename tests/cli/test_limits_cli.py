"""Operators' overrides of limits (`pgpool.ops.set_limit`, `pgpool limits`): stored, listed
with their use, refused with a one-line error when bad, reset."""

from __future__ import annotations

import json

import psycopg
import pytest
from commands import run_pgpool

import pgpool
from pgpool import ops
from pgpool.errors import ConfigError


def test_an_override_is_stored_listed_and_reset(db: psycopg.Connection, dsn: str) -> None:
    pgpool.enqueue_many(db, "sync", [{"n": n} for n in range(3)])
    done = run_pgpool(dsn, "limits", "set", "sync", "--concurrency", "2", "--rate", "50/1m")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pgpool: limit of kind sync set to concurrency 2, rate "
                                  "50/60s on every host")
    row = db.execute("SELECT concurrency, rate, per, set_by = session_user FROM pgpool_limits "
                     "WHERE kind = 'sync'").fetchone()
    assert row == (2, 50, 60.0, True)
    (use,) = ops.limits(db)
    assert (use.kind, use.override.describe(), use.running, use.ready) == (
        "sync", "concurrency 2, rate 50/60s", 0, 3)
    listed = run_pgpool(dsn, "limits")
    assert listed.stdout.splitlines()[1].split()[:4] == ["sync", "concurrency", "2,", "rate"]
    # A set replaces the kind's override whole: --rate alone leaves the code's concurrency.
    assert ops.set_limit(db, "sync", rate=5).describe() == "rate 5/1s"
    assert db.execute("SELECT concurrency, rate, per FROM pgpool_limits").fetchone() == (
        None, 5, None)
    assert run_pgpool(dsn, "limits", "reset", "sync").stdout == (
        "pgpool: limit of kind sync reset: the code's limit holds again\n")
    assert ops.reset_limit(db, "sync") is False
    assert ops.limits(db) == []


@pytest.mark.parametrize(("args", "error"), [
    (("--concurrency", "0"), "argument --concurrency: '0' is not a positive integer"),
    (("--rate", "5/x"), "argument --rate: '5/x' is not a rate: give R/PERIOD"),
    (("--by", "colour"), "argument --by: invalid choice: 'colour'"),
    ((), "limit of kind sync: give concurrency=N"),
])
def test_a_bad_override_is_refused_in_one_line(db: psycopg.Connection, dsn: str,
                                               args: tuple[str, ...], error: str) -> None:
    done = run_pgpool(dsn, "limits", "set", "sync", *args)
    assert done.returncode == 2
    assert done.stderr.startswith(f"pgpool: error: {error}"), done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert db.execute("SELECT count(*) FROM pgpool_limits").fetchone()[0] == 0


def test_status_shows_each_limit_and_its_use(db: psycopg.Connection, dsn: str) -> None:
    # None in use: no section. (Not the word alone: a vacuum debt warning says "cost
    # limits" when earlier tests' jobs left dead rows and autovacuum has not run yet.)
    assert "limits (`pgpool limits`):" not in run_pgpool(dsn, "status").stdout
    pgpool.enqueue_many(db, "sync", [{"n": n} for n in range(12)])
    ops.set_limit(db, "sync", rate=10, per=60)
    text = run_pgpool(dsn, "status").stdout
    section = text[text.index("limits (`pgpool limits`):"):].splitlines()
    assert section[1].split() == ["KIND", "LIMIT", "OVERRIDE", "RUNNING", "RATE", "USED",
                                  "READY", "WAITING", "SCOPES"]
    # 10 a minute starts 10 of the 12 within the fleet's target lag (60 s): 2 wait on it.
    assert section[2].split() == ["sync", "rate", "10/60s", "rate", "10/60s", "0", "0", "12",
                                  "2", "-"]
    assert "note: 2 of default's ready jobs wait on their kinds' limits" in text
    (limit,) = json.loads(run_pgpool(dsn, "status", "--json").stdout)["limits"]
    set_at = limit["override"].pop("set_at")
    assert set_at.startswith(str(db.execute("SELECT current_date").fetchone()[0]))
    assert limit == {"kind": "sync", "override": {
        "concurrency": None, "rate": 10, "per": 60.0, "by": None,
        "set_by": db.execute("SELECT session_user").fetchone()[0]},
        "running": 0, "rate_used": 0, "ready": 12,
        "in_force": {"concurrency": None, "rate": 10, "per": 60.0}, "waiting": 2,
        "scopes": 0, "top": []}


def test_a_limit_by_tenant_is_set_and_its_busiest_tenants_listed(db: psycopg.Connection,
                                                                 dsn: str) -> None:
    """`--by` alone changes what the code's limit is counted per; the use of a limit by
    tenant is listed per kind as the number of tenants in use and the busiest three, each
    with its running jobs holding slots and its ring's rows used (as its claims leave
    them: written here by hand)."""
    done = run_pgpool(dsn, "limits", "set", "sync", "--by", "tenant")
    assert done.stdout.startswith("pgpool: limit of kind sync set to per tenant on every "
                                  "host"), done.stderr
    with pytest.raises(ConfigError) as refused:
        ops.set_limit(db, "sync", rate=5, by="colour")
    assert str(refused.value) == ("limit of kind sync: by must be one of kind, tenant, "
                                  "concurrency_key, got 'colour'")
    for tenant, running in (("acme", 3), ("globex", 1), ("initech", 2), ("umbrella", 1)):
        pgpool.enqueue_many(db, "sync", [{"n": n} for n in range(running + 1)], tenant=tenant)
        db.execute("UPDATE pgpool_jobs SET state = 'running', attempts = 1, locked_by = 'h', "
                   "limit_attempt = 1, limit_scope = 'tenant:' || tenant, limit_slot = s.n "
                   "FROM (SELECT id AS i, row_number() OVER (ORDER BY id) AS n FROM pgpool_jobs "
                   "WHERE tenant = %s LIMIT %s) AS s WHERE id = s.i", (tenant, running))
    db.execute("INSERT INTO pgpool_limit_ticks (kind, scope, slot, used_at, n) "
               "VALUES ('sync', 'tenant:umbrella', 1, now(), 1), ('sync', 'tenant:umbrella', "
               "2, now(), 1), ('sync', 'tenant:umbrella', 3, now() - interval '1 hour', 1)")
    (use,) = ops.limits(db)
    assert (use.override.describe(), use.running, use.rate_used, use.scopes) == (
        "per tenant", 7, 2, 4)
    assert use.top == (ops.ScopeUse("tenant:acme", 3, 0), ops.ScopeUse("tenant:umbrella", 1, 2),
                       ops.ScopeUse("tenant:initech", 2, 0))
    lines = run_pgpool(dsn, "limits").stdout.splitlines()
    # Running 7, rate used 2, ready 4 (one per tenant), none waiting (a limit by tenant
    # bounds no fleet-wide start), 4 scopes.
    assert lines[1].split()[-5:] == ["7", "2", "4", "0", "4"]
    assert lines[2] == ("sync, busiest of 4 scopes: tenant:acme (3 running, 0 started), "
                        "tenant:umbrella (1 running, 2 started), tenant:initech (2 running, "
                        "0 started)")
    assert len(lines) == 3
