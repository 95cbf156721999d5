"""Per-kind routing: a host claims the kinds it serves at a cost that other kinds' backlog
and jobs not yet due do not change, in priority order, and ``pgpool run --kinds`` picks
which of its modules' kinds a host serves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from commands import JSON_LOGS, RUN, assert_user_error, run_pgpool
from dbtools import GRANT_PARAMS, buffers, explain_prepared
from jsonlogs import only_event

import pgpool
from pgpool.sql import jobs as sql
from pgpool.sql.jobs import SWEEP

#: What every claim below sends but its kinds and limit: one queue.
CLAIM_PARAMS = {"queues": ["default"], "owner": "h", "lease": 30, "after": "", **SWEEP,
                "tenant_cap": None}


#: The claims a host sends for jobs without a tenant or a concurrency key (`sql.CLAIM`
#: finds them too, and is what claims the rest).
CLAIMS = ["CLAIM_PLAIN", "CLAIM_PLAIN_ONE", "CLAIM", "CLAIM_SLOTS", "CLAIM_SLOTS_PLAIN",
          "CLAIM_LIMITED", "CLAIM_LIMITED_PLAIN", "CLAIM_GRANTED"]


def claim_buffers(db: psycopg.Connection, *kinds: str, limit: int = 10,
                  mode: str = "force_custom_plan", statement: str = "CLAIM_PLAIN"
                  ) -> tuple[int, set[int]]:
    """Shared buffers the real claim ``statement`` (`sql.CLAIM_PLAIN`, `sql.CLAIM`,
    `sql.CLAIM_SLOTS` with ``kinds`` limited to 1,000 at once, none running, or
    `sql.CLAIM_LIMITED` with them also limited to 100,000 a second, or their plain twins)
    touches when it runs as a prepared statement with a plan of ``mode``
    (`explain_prepared`), and the ids it claimed; rolled back, so the jobs stay ready.
    Buffers, not time: the same rows and plan touch the same pages on every run, on any
    machine. The fewest of three runs: a catalog reload or a concurrent snapshot can only
    add buffers."""
    params = {**CLAIM_PARAMS, "kinds": list(kinds), "kind_max_attempts": [20] * len(kinds),
              "limit": limit, "limited_kinds": list(kinds),
              "limited_concurrency": [1000] * len(kinds),
              "limited_rate": [100_000] * len(kinds), "limited_per": [1.0] * len(kinds),
              "limited_max_attempts": [20] * len(kinds), **GRANT_PARAMS}
    runs = []
    for _ in range(3):
        with db.transaction(force_rollback=True):
            if statement.startswith("CLAIM_LIMITED"):  # the rate's ring, as a host makes it
                db.execute(sql.ENSURE_TICKS, {"rate_kinds": list(kinds),
                                              "rates": [100_000] * len(kinds)})
            top = explain_prepared(db, getattr(sql, statement), params, mode,
                                   "ANALYZE, BUFFERS, FORMAT JSON")
            runs.append((buffers(top), frozenset(
                r[0] for r in db.execute("SELECT id FROM pgpool_jobs WHERE state = 'running'"))))
    assert len({claimed for _, claimed in runs}) == 1, runs  # the same jobs every time
    return min(pages for pages, _ in runs), set(runs[0][1])


@pytest.mark.soak  # a big drain: `make soak-test`
# Pages counted: a table of its own, whose free space no earlier test left (a claim's
# update stays on its page, or writes index entries, by what space the page has).
@pytest.mark.own_schema
# The custom plan is a claim's first few; the generic one, which a long-running dispatcher's
# prepared claim switches to, must be as good (joining the picked rows to a scan of the
# whole table took 2 s a claim with a million jobs).
@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
@pytest.mark.parametrize("statement", CLAIMS)
def test_claim_cost_ignores_other_kinds_backlog_and_jobs_not_yet_due(db: psycopg.Connection,
                                                                    mode: str,
                                                                    statement: str) -> None:
    # Its own backlog: 2,000 due jobs (enough for the planner to read the index, as it
    # does under the flood: the same plan on both sides).
    pgpool.enqueue_many(db, "fast", ({"n": i} for i in range(2000)))
    mine = [i for (i,) in db.execute("SELECT id FROM pgpool_jobs ORDER BY id LIMIT 10")]
    db.execute("VACUUM ANALYZE pgpool_jobs")
    baseline, claimed = claim_buffers(db, "fast", mode=mode, statement=statement)
    assert claimed == set(mine)
    # The flood: 20,000 due jobs of a kind this host does not serve, all due before its
    # own (same priority, earlier run_at: ahead of them in one per-queue index), and 20,000
    # of its own kind at a higher priority that are not due for an hour.
    # Inserted due (an enqueue of a past run_at schedules it), not updated to it: an update
    # leaves 20,000 dead rows, which a snapshot held elsewhere in the database (an
    # autovacuum's ANALYZE of another test's table) keeps through the VACUUM below.
    db.execute("INSERT INTO pgpool_jobs (kind, payload, run_at) SELECT 'bulk', '{}', "
               "now() - interval '5 minutes' FROM generate_series(1, 20000)")
    pgpool.enqueue_many(db, "fast", ({"n": i} for i in range(20_000)), priority=10,
                        run_at=datetime.now(UTC) + timedelta(hours=1))
    db.execute("VACUUM ANALYZE pgpool_jobs")
    flooded, claimed = claim_buffers(db, "fast", mode=mode, statement=statement)
    assert claimed == set(mine)  # the flood changed nothing it claims...
    # ...nor what that costs: the claim touches about one extra page per claimed job (an
    # index a level deeper to read, and each job's index entries written one level
    # deeper), and a few more as pages fall: the fair claim read 91 then 97 in runs of its
    # own, 91 then 101 to 113 beside the soak tier's other tests when the flood was made
    # by an update. Reading past the flood's rows costs hundreds of pages: about 1,400
    # with the claim of before the per-kind index and the scheduled state.
    assert flooded <= baseline + 25, (baseline, flooded)


@pytest.mark.soak  # a million rows: `make soak-test`
@pytest.mark.own_schema
def test_a_kind_with_one_ready_job_is_claimed_past_a_million_of_another_kind(
        db: psycopg.Connection) -> None:
    # Seed 004's incident: the urgent kind has one job, another kind floods the table. Its
    # claim, plain and fair, must read what it reads on an empty table, in the plan a
    # long-running host's prepared claim ends up with (generic) as in its first (custom).
    urgent = pgpool.enqueue(db, "urgent", {})
    db.execute("VACUUM ANALYZE pgpool_jobs")
    plans = [(mode, statement) for mode in ("force_custom_plan", "force_generic_plan")
             for statement in CLAIMS]
    alone = {}
    for mode, statement in plans:
        alone[mode, statement], claimed = claim_buffers(db, "urgent", mode=mode,
                                                        statement=statement)
        assert claimed == {urgent}
    db.execute("INSERT INTO pgpool_jobs (kind, payload, run_at) SELECT 'bulk', '{}', "
               "now() - interval '1 hour' FROM generate_series(1, 1000000)")
    db.execute("VACUUM ANALYZE pgpool_jobs")
    for mode, statement in plans:
        flooded, claimed = claim_buffers(db, "urgent", mode=mode, statement=statement)
        assert claimed == {urgent}
        # Each index descent reads two levels more through a million more entries (the
        # plain claim descends about five times, the fair one about ten: plain 12 -> 23,
        # fair 14 -> 34 here); reading the flood's entries would cost about 2,500 pages
        # (some 400 a leaf).
        assert flooded <= alone[mode, statement] + 25, (mode, statement, alone, flooded)


@pytest.mark.parametrize("statement", CLAIMS)
def test_claim_merges_the_kinds_it_serves_in_priority_order(db: psycopg.Connection,
                                                           statement: str) -> None:
    ids = {(kind, prio): pgpool.enqueue(db, kind, {}, priority=prio)
           for kind, prio in (("a", 1), ("b", 5), ("a", 3), ("b", 0), ("c", 9))}
    # Highest priority first across the kinds served; c is not served, whatever its priority.
    for limit, taken in ((1, [("b", 5)]), (3, [("b", 5), ("a", 3), ("a", 1)]),
                         (9, [("b", 5), ("a", 3), ("a", 1), ("b", 0)])):
        assert claim_buffers(db, "a", "b", limit=limit, statement=statement)[1] == {
            ids[k] for k in taken}


def started_kinds(result: Any) -> list[str]:
    assert result.returncode == 0, result.stderr
    return only_event(result.stderr, "started")["kinds"]


@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_run_kinds_serves_only_those_kinds(dsn: str, db: psycopg.Connection) -> None:
    served = [pgpool.enqueue(db, "noop", {"n": i}) for i in range(5)]
    left = [pgpool.enqueue(db, "record", {"n": i}) for i in range(5)]
    # Burst: runs what it serves until none is left, then exits.
    done = run_pgpool(dsn, *RUN, "--kinds", "noop,whoami", **JSON_LOGS, PGPOOL_BURST="1")
    assert started_kinds(done) == ["noop", "whoami"]
    waiting = db.execute("SELECT id, state, attempts FROM pgpool_jobs ORDER BY id").fetchall()
    assert waiting == [(i, "ready", 0) for i in left]
    assert not set(served) & {i for i, _, _ in waiting}
    # The same from the environment, and the other kinds run once a host serves them.
    done = run_pgpool(dsn, *RUN, **JSON_LOGS, PGPOOL_BURST="1", PGPOOL_KINDS="record")
    assert started_kinds(done) == ["record"]
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0


def test_run_kinds_refuses_a_kind_no_module_registers_in_one_line(dsn: str) -> None:
    line = assert_user_error(run_pgpool(dsn, *RUN, "--kinds", "noop,nope"), "'nope'")
    assert "registered kinds are " in line and "noop" in line and "record" in line
