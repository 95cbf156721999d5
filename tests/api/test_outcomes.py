"""Outcomes (issue 24), on real PostgreSQL and real hosts: finished jobs kept with their
results, `pgpool.job_status` and `pgpool.wait`, follow-up jobs written with the ack, and
groups whose callback runs once after every member has finished."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import outcomejobs  # noqa: F401  (registers the handlers drain runs)
import psycopg
import pytest
from bench_scripts import BENCH_SCHEMAS, run_bench_script
from commands import JSON_LOGS, run_pgpool
from dbtools import explain_prepared, one
from jsonlogs import only_event
from processes import start_pgpool
from waits import wait_until

import pgpool
from pgpool import ops, testing
from pgpool.groups import group_params
from pgpool.host.attempt import Job
from pgpool.host.completer import Ack, ack_statement, follow_up_groups
from pgpool.host.parts.retention import BATCH
from pgpool.sql import jobs as sql
from pgpool.sql import ops as ops_sql
from pgpool.sql import outcomes as outcomes_sql

RUN = ("run", "--handlers", "outcomejobs", "--burst", "--procs", "2")


def statuses(db: psycopg.Connection, ids: list[int]) -> dict[int, str]:
    return {i: s.state for i, s in pgpool.job_statuses(db, ids).items()}


# --- results and status -------------------------------------------------------------------


def test_a_kept_kind_records_its_result_and_a_plain_one_records_nothing(db, dsn):
    kept = pgpool.enqueue(db, "out.square", {"n": 7})
    failing = pgpool.enqueue(db, "out.square", {"n": 1, "fail": True}, max_attempts=1)
    loose = pgpool.enqueue(db, "out.loose", {"n": 1})
    waiting = pgpool.enqueue(db, "out.square", {"n": 2}, delay=3600)
    assert pgpool.job_status(db, kept).state == "ready"
    result = run_pgpool(dsn, *RUN, **JSON_LOGS)
    assert result.returncode == 0, result.stderr
    done = pgpool.job_status(db, kept)
    assert (done.state, done.result, done.kind, done.queue, done.attempts) == (
        "done", {"square": 49}, "out.square", "default", 1)
    assert done.finished and done.finished_at is not None
    dead = pgpool.job_status(db, failing)
    assert dead.state == "dead" and "asked to fail" in dead.error
    assert pgpool.job_status(db, loose).state == "unknown"  # succeeded, kept by nothing
    assert pgpool.job_status(db, waiting).state == "scheduled"
    assert pgpool.job_status(db, 10**12).state == "unknown"
    # The dropped value is named once, by kind and never by value.
    dropped = only_event(result.stderr, "result_dropped")
    assert dropped["kind"] == "out.loose" and "'n'" not in result.stderr
    record = one(db, "SELECT keep_until - finished_at FROM pgpool_done WHERE id = %s", kept)
    assert record[0].total_seconds() == 3600


def test_keep_done_keeps_every_kind_and_a_handlers_keep_wins(db, dsn):
    loose = pgpool.enqueue(db, "out.loose", {"n": 3})
    square = pgpool.enqueue(db, "out.square", {"n": 3})
    assert run_pgpool(dsn, *RUN, "--keep-done", "10m").returncode == 0
    assert pgpool.job_status(db, loose).result == {"n": 3}
    seconds = dict(db.execute("SELECT id, extract(epoch FROM keep_until - finished_at) "
                              "FROM pgpool_done").fetchall())
    assert seconds == {loose: 600, square: 3600}


def test_a_result_that_cannot_be_stored_dead_letters_a_kept_job_only(db, dsn):
    kept = pgpool.enqueue(db, "out.huge", {"size": 2000})
    result = run_pgpool(dsn, *RUN, PGPOOL_MAX_RESULT_BYTES="1000")
    assert result.returncode == 0, result.stderr
    dead = pgpool.job_status(db, kept)
    assert dead.state == "dead"
    assert dead.error.startswith("succeeded, but its result cannot be stored: its handler "
                                 "returned 2,002 bytes of JSON, over the 1,000-byte limit")
    assert one(db, "SELECT reason FROM pgpool_dead WHERE id = %s", kept) == ("failed",)
    assert one(db, "SELECT count(*) FROM pgpool_done") == (0,)  # nothing half-written


def test_a_bad_result_limit_stops_the_host_at_its_start(db, dsn):
    result = run_pgpool(dsn, *RUN, PGPOOL_MAX_RESULT_BYTES="lots")
    assert result.returncode != 0
    assert "PGPOOL_MAX_RESULT_BYTES='lots' is not a positive integer" in result.stderr
    assert "Traceback" not in result.stderr


def test_keep_must_be_a_positive_duration():
    with pytest.raises(pgpool.HandlerError, match="keep must be a number of seconds above 0"):
        pgpool.handler("out.bad", keep=-1)
    with pytest.raises(pgpool.HandlerError, match="keep must be"):
        pgpool.handler("out.bad", keep="1h")  # type: ignore[arg-type]


# --- wait ---------------------------------------------------------------------------------


def test_wait_is_woken_by_the_ack_not_its_poll(db, dsn):
    ids = [pgpool.enqueue(db, "out.square", {"n": n}) for n in range(3)]
    host = start_pgpool(dsn, "run", "--handlers", "outcomejobs", "--procs", "1",
                        "--poll", "30")
    host.event("started")
    started = time.monotonic()
    # A poll of 60 s: returning well before it, wait was woken by the acks' notification.
    found = pgpool.wait(db, ids, timeout=50, poll=60)
    assert time.monotonic() - started < 20
    assert [found[i].result for i in ids] == [{"square": 0}, {"square": 1}, {"square": 4}]
    assert host.stop() == 0


def test_wait_polls_for_a_kind_that_keeps_nothing_and_times_out_naming_the_rest(db, dsn):
    loose = pgpool.enqueue(db, "out.loose", {"n": 1})
    never = pgpool.enqueue(db, "out.loose", {"n": 2}, queue="nobody")
    with pytest.raises(TimeoutError, match=rf"2 of 2 jobs not finished \(first: \[{loose}, "):
        pgpool.wait(db, [loose, never], timeout=0.2, poll=0.05)
    host = start_pgpool(dsn, "run", "--handlers", "outcomejobs", "--procs", "1")
    host.event("started")
    assert pgpool.wait(db, [loose], timeout=30, poll=0.2)[loose].state == "unknown"
    assert host.stop() == 0


def test_wait_async_and_its_arguments(db, dsn):
    job = pgpool.enqueue(db, "out.square", {"n": 5})
    assert run_pgpool(dsn, *RUN).returncode == 0

    async def main() -> pgpool.JobStatus:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return (await pgpool.wait_async(aconn, [job], timeout=5))[job]

    assert asyncio.run(main()).result == {"square": 25}
    with psycopg.connect(dsn) as manual, pytest.raises(pgpool.ConfigError,
                                                       match="autocommit mode"):
        pgpool.wait(manual, [job])
    with pytest.raises(pgpool.ConfigError, match="job ids are integers"):
        pgpool.wait(db, ["7"])  # type: ignore[list-item]


# --- follow-ups ---------------------------------------------------------------------------


@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_follow_ups_exist_only_with_their_parents_success(db, dsn):
    good = pgpool.enqueue(db, "out.parent", {"children": 3})
    bad = pgpool.enqueue(db, "out.parent", {"children": 2, "fail": True})
    killed = pgpool.enqueue(db, "out.parent", {"children": 2, "die_first": True})
    def children() -> list[tuple[int, int]]:
        return db.execute("SELECT (result->>'parent')::bigint, count(*) FROM pgpool_done "
                          "WHERE kind = 'out.child' GROUP BY 1 ORDER BY 1").fetchall()

    assert run_pgpool(dsn, *RUN, "--grace", "1").returncode == 0
    # The failed parent's attempts and the killed attempt left none.
    assert children() == [(good, 3)]
    assert statuses(db, [good, bad, killed]) == {good: "unknown", bad: "scheduled",
                                                 killed: "scheduled"}
    assert run_pgpool(dsn, "retry", str(bad), str(killed)).returncode == 0
    assert run_pgpool(dsn, *RUN).returncode == 0
    # The killed parent's second attempt succeeded and has its two, once.
    assert children() == [(good, 3), (killed, 2)]
    assert statuses(db, [bad, killed]) == {bad: "dead", killed: "unknown"}
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)


def test_a_stale_or_repeated_ack_adds_no_follow_ups(db):
    job_id = pgpool.enqueue(db, "out.parent", {"children": 0})
    db.execute("UPDATE pgpool_jobs SET state = 'running', attempts = 1, locked_by = 'me', "
               "lease_until = now() + interval '1 minute' WHERE id = %s", (job_id,))
    follow = ([{"queue": "default", "kind": "out.child", "payload": '{"n": 1}',
                "priority": 0, "run_at": None, "delay": 0.0, "max_attempts": None,
                "unique_key": None, "tenant": "", "concurrency_key": None}], [])
    job = Job(job_id, "out.parent", "default", 1, 0, 2, b"{}", None)
    ack = Ack.done(job, follow=follow)
    stale = Ack.done(Job(job_id, "out.parent", "default", 1, 0, 2, b"{}", None),
                     follow=follow)
    for a, owner in ((stale, "another host"), (ack, "me"), (ack, "me")):
        query, params = ack_statement([a], owner)
        assert query is sql.ACK_KEPT
        db.execute(query, params)
    assert one(db, "SELECT count(*) FROM pgpool_jobs WHERE kind = 'out.child'") == (1,)


def test_a_stale_ack_in_the_flush_of_the_next_attempt_records_nothing(db):
    # A host could not write its ack of attempt 1 (the database was away), lost the job's
    # lease, claimed the job again and ran attempt 2: both acks go in its next flush. Only
    # attempt 2's success is recorded: its result, its follow-up job and group, and none
    # of attempt 1's (the chaos soak found both attempts' follow-ups written, and attempt
    # 1's result kept).
    job_id = pgpool.enqueue(db, "out.parent", {"children": 0})
    db.execute("UPDATE pgpool_jobs SET state = 'running', attempts = 2, locked_by = 'me', "
               "lease_until = now() + interval '1 minute' WHERE id = %s", (job_id,))

    def ack(attempt: int) -> Ack:
        child = {"queue": "default", "kind": "out.child", "payload": f'{{"n": {attempt}}}',
                 "priority": 0, "run_at": None, "delay": 0.0, "max_attempts": None,
                 "unique_key": None, "tenant": "", "concurrency_key": None}
        group = group_params("out.score", [{"doc": attempt}], ("out.combine", {"n": attempt}))
        job = Job(job_id, "out.parent", "default", attempt, 0, 2, b"{}", None)
        return Ack.done(job, 60.0, f'{{"claim": {attempt}}}'.encode(), ([child], [group]))

    acks = [ack(1), ack(2)]
    query, params = ack_statement(acks, "me")
    with db.transaction():
        row = db.execute(query, params).fetchone()
        for group in follow_up_groups(acks, row[-1]):
            db.execute(sql.ENQUEUE_GROUP, group)
    assert one(db, "SELECT result FROM pgpool_done WHERE id = %s", job_id) == ({"claim": 2},)
    assert db.execute("SELECT kind, payload FROM pgpool_jobs WHERE state <> 'waiting' "
                      "ORDER BY id").fetchall() == [("out.child", {"n": 2}),
                                                    ("out.score", {"doc": 2})]
    assert db.execute("SELECT payload FROM pgpool_jobs WHERE state = 'waiting'").fetchall() \
        == [({"n": 2},)]


def test_a_plain_flush_still_writes_the_plain_statements():
    # What a kind that keeps nothing pays: today's statements, with no outcome arm.
    plain = Job(1, "k", "default", 1, 0, 3, b"{}", None)
    assert ack_statement([Ack.done(plain)], "me")[0] is sql.ACK_DONE
    assert ack_statement([Ack.done(plain), Ack.retry(plain, 1, "e")], "me")[0] is sql.ACK
    member = Job(2, "k", "default", 1, 0, 3, b"{}", None, group_id=9)
    assert ack_statement([Ack.retry(member, 1, "e")], "me")[0] is sql.ACK
    assert ack_statement([Ack.done(plain), Ack.done(member)], "me")[0] is sql.ACK_KEPT
    assert ack_statement([Ack.done(plain), Ack.dead(member, "e")], "me")[0] is \
        sql.ACK_OUTCOMES


def test_follow_ups_are_checked_in_the_handler(db):
    pgpool.enqueue(db, "out.badfollow", {})
    with pytest.raises(pgpool.PayloadError, match="NaN or Infinity"):
        testing.drain(db, "out.badfollow")
    assert one(db, "SELECT count(*) FROM pgpool_jobs WHERE kind = 'out.child'") == (0,)


def test_a_thread_a_handler_left_behind_cannot_enqueue_through_another_job(db, dsn):
    # While its job runs, the thread's follow-up is the job's. It calls again once its
    # job's handler has returned and the next job runs in the same worker: nothing it asks
    # for then may ride on that job's success, and each call says the job it was started
    # by has finished.
    left = pgpool.enqueue(db, "out.leaver", {})  # its success enqueues out.next
    done = run_pgpool(dsn, "run", "--handlers", "outcomejobs", "--burst", "--procs", "1")
    assert done.returncode == 0, done.stderr
    (following,) = one(db, "SELECT id FROM pgpool_done WHERE kind = 'out.next'")
    assert db.execute("SELECT kind, result FROM pgpool_done WHERE id <> %s ORDER BY id",
                      (following,)).fetchall() == [("out.child", {"from": "while it ran"})]
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)
    assert one(db, "SELECT count(*) FROM pgpool_groups") == (0,)
    ended = (f"RuntimeError: pgpool.current_job() is used outside a running job: the job "
             f"{left} that started this thread has finished")
    assert pgpool.job_status(db, following).result == {"job": following, "calls": [
        f"current_job() returned {left} while it ran",
        *(f"{call} raised {ended}" for call in (
            "current_job()", "held enqueue", "held group", "current_job().enqueue"))]}


# --- groups -------------------------------------------------------------------------------


def test_a_groups_callback_runs_once_with_every_members_outcome(db, dsn):
    docs = [{"doc": d} for d in range(10)] + [{"doc": -1}]
    group = pgpool.group(db, "out.score", docs, then=("out.combine", {"label": "first"}))
    assert group.size == 11
    assert pgpool.job_status(db, group.id).state == "waiting"
    progress = pgpool.group_status(db, group.id)
    assert (progress.total, progress.finished, progress.callback) == (11, 0, "waiting")
    result = run_pgpool(dsn, *RUN)
    assert result.returncode == 0, result.stderr
    callback = pgpool.job_status(db, group.id)
    assert callback.state == "done" and callback.attempts == 1
    assert callback.result == {"label": "first", "members": 11, "total": 22.5, "failed": 1}
    progress = pgpool.group_status(db, group.id)
    assert (progress.done, progress.dead, progress.callback) == (10, 1, "done")
    members = pgpool.group_members(db, group.id)
    assert [m.state for m in members] == ["done"] * 10 + ["dead"]
    assert members[-1].error.splitlines()[-1] == "ValueError: no such document"


@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_an_empty_group_and_a_nested_one(db, dsn):
    empty = pgpool.group(db, "out.score", [], then=("out.combine", {"label": "empty"}))
    assert pgpool.job_status(db, empty.id).state == "ready"
    chained = pgpool.group(db, "out.score", [{"doc": 1}],
                           then=("out.combine", {"label": "first", "then_group": True}))
    assert run_pgpool(dsn, *RUN).returncode == 0
    assert pgpool.job_status(db, empty.id).result["members"] == 0
    assert pgpool.job_status(db, chained.id).result["total"] == 0.5
    second = one(db, "SELECT id FROM pgpool_done WHERE kind = 'out.combine' "
                     "AND result->>'label' = 'second'")[0]
    assert pgpool.job_status(db, second).result == {"label": "second", "members": 3,
                                                    "total": 1.5, "failed": 0}
    # Complete from the start, so retention takes its row once its callback has run.
    assert pgpool.group_status(db, empty.id).completed_at is not None
    asyncio.run(_prune(dsn))
    assert one(db, "SELECT count(*) FROM pgpool_groups WHERE id = %s", empty.id) == (0,)


def test_a_cancelled_member_counts_as_finished(db, dsn):
    group = pgpool.group(db, "out.score", [{"doc": 1}, {"doc": 2}],
                         then=("out.combine", {}))
    _, second = [i for (i,) in db.execute(
        "SELECT id FROM pgpool_jobs WHERE group_id = %s ORDER BY id", (group.id,))]
    assert run_pgpool(dsn, "cancel", str(second)).returncode == 0
    assert pgpool.group_status(db, group.id).dead == 1
    assert run_pgpool(dsn, *RUN).returncode == 0
    assert pgpool.job_status(db, group.id).result["failed"] == 1
    assert [m.state for m in pgpool.group_members(db, group.id)] == ["done", "cancelled"]


def test_a_handler_starts_a_group_only_with_its_success(db):
    pgpool.enqueue(db, "out.fanout", {"fail": True}, max_attempts=1)
    pgpool.enqueue(db, "out.fanout", {})
    testing.drain(db, raise_errors=False)
    assert one(db, "SELECT count(*) FROM pgpool_groups") == (1,)
    assert one(db, "SELECT result FROM pgpool_done WHERE kind = 'out.combine'") == (
        {"label": "fanned", "members": 4, "total": 3.0, "failed": 0},)


@pytest.mark.parametrize("pgpool_dsn", ["unset", "another installation"])
def test_a_callback_under_drain_reads_its_members_in_the_tests_transaction(
        dsn, other_dsn, monkeypatch, pgpool_dsn):
    # The callback reads its group on the test's connection: PGPOOL_DSN unset does not
    # stop it, and one leading to another installation, with a group of the same id, is
    # not read instead.
    with psycopg.connect(dsn) as conn:  # not autocommit: one transaction, rolled back
        group = pgpool.group(conn, "out.score", [{"doc": d} for d in range(4)],
                             then=("out.combine", {"label": "mine"}))
        if pgpool_dsn == "unset":
            monkeypatch.delenv("PGPOOL_DSN", raising=False)
        else:
            with psycopg.connect(other_dsn, autocommit=True) as other:
                pgpool.migrate(other)
                other.execute("SELECT setval(pg_get_serial_sequence('pgpool_jobs', 'id'), "
                              "%s, false)", (group.id,))
                twin = pgpool.group(other, "out.score", [{"doc": 9}],
                                    then=("out.combine", {"label": "theirs"}))
                assert twin.id == group.id
                testing.drain(other, "out.score")  # its member done, its callback ready
            monkeypatch.setenv("PGPOOL_DSN", other_dsn)
        assert testing.drain(conn) == testing.Counts(done=5)
        assert pgpool.job_status(conn, group.id).result == {
            "label": "mine", "members": 4, "total": 3.0, "failed": 0}
        conn.rollback()


def test_the_members_of_an_id_that_is_no_group_are_an_error_not_none(db, dsn):
    plain = pgpool.enqueue(db, "out.square", {"n": 1})
    for call in (pgpool.group_members, pgpool.group_status):
        with pytest.raises(pgpool.GroupNotFound) as caught:
            call(db, plain)
        assert str(caught.value).startswith(f"no group has id {plain}: a group's id is its "
                                            "callback job's")

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            for call in (pgpool.group_members_async, pgpool.group_status_async):
                with pytest.raises(pgpool.GroupNotFound, match=f"no group has id {plain}:"):
                    await call(aconn, plain)

    asyncio.run(main())
    # A group with no member finished yet has none; an empty group too.
    waiting = pgpool.group(db, "out.score", [{"doc": 1}], then=("out.combine", {}))
    empty = pgpool.group(db, "out.score", [], then=("out.combine", {}))
    assert pgpool.group_members(db, waiting.id) == pgpool.group_members(db, empty.id) == []
    assert pgpool.group_status(db, empty.id).total == 0


def test_a_job_that_is_no_callback_cannot_read_its_group(db, dsn, monkeypatch):
    monkeypatch.setenv("PGPOOL_DSN", dsn)
    plain = pgpool.enqueue(db, "out.combine", {})  # the callback's kind, enqueued alone
    with pytest.raises(pgpool.GroupNotFound) as caught:
        testing.drain(db)
    assert str(caught.value) == (
        f"current_job().group_members(): job {plain} (out.combine) is not a group's "
        "callback: only the callback of pgpool.group(..., then=...) has members to read")
    status = pgpool.job_status(db, plain)  # a failed attempt, as any handler's error
    assert status.state == "scheduled" and status.error.endswith(f"GroupNotFound: {caught.value}\n")


def test_group_arguments_are_checked_before_anything_is_sent(db):
    with pytest.raises(pgpool.ConfigError, match=r"then must be a \(kind, payload\) pair"):
        pgpool.group(db, "out.score", [{"doc": 1}], then="out.combine")  # type: ignore[arg-type]
    with pytest.raises(pgpool.ConfigError, match="not unique_key"):
        pgpool.group(db, "out.score", [{"doc": 1}], then=("out.combine", {}),
                     then_options={"unique_key": "x"})
    with pytest.raises(pgpool.PayloadError, match="payload #1"):
        pgpool.group(db, "out.score", [{"doc": 1}, {"doc": float("inf")}],
                     then=("out.combine", {}))
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)


def test_members_finishing_at_once_on_two_connections_release_the_callback_once(db, dsn):
    # Both members acked by two hosts at the same moment, many times over: neither count is
    # lost, and the statement that counts the last makes the callback ready.
    for round_ in range(20):
        group = pgpool.group(db, "out.score", [{"doc": 1}, {"doc": 2}],
                             then=("out.combine", {}))
        members = [i for (i,) in db.execute(
            "SELECT id FROM pgpool_jobs WHERE group_id = %s ORDER BY id", (group.id,))]
        db.execute("UPDATE pgpool_jobs SET state = 'running', attempts = 1, "
                   "locked_by = 'host' || id, lease_until = now() + interval '1 minute' "
                   "WHERE group_id = %s", (group.id,))
        barrier = threading.Barrier(2)
        acked: list[int] = []
        threads = [threading.Thread(target=_ack_member,
                                    args=(dsn, m, group.id, barrier, acked))
                   for m in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert acked == [1, 1], f"round {round_}: each ack deletes its member"
        assert pgpool.job_status(db, group.id).state == "ready", f"round {round_}"
        assert pgpool.group_status(db, group.id).done == 2


def _ack_member(dsn: str, member: int, group_id: int, barrier: threading.Barrier,
                acked: list[int]) -> None:
    """Ack ``member``'s success as its host does, once ``barrier`` lets both go; how many
    jobs it deleted goes to ``acked`` (checked by the test's own thread: an assertion
    here could not fail it)."""
    job = Job(member, "out.score", "default", 1, 0, 1, b"{}", None, group_id=group_id)
    query, params = ack_statement([Ack.done(job, 0.0)], f"host{member}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        barrier.wait()
        acked.append(conn.execute(query, params).fetchone()[0])


def test_a_callback_is_released_by_key_however_the_jobs_table_grew(db, dsn):
    # A host's connection lives long: a plan of pgpool_release_callbacks cached while
    # pgpool_jobs was small would scan the whole table once it had grown.
    group = pgpool.group(db, "out.score", [{"doc": 1}], then=("out.combine", {}))
    release = "SELECT * FROM pgpool_release_callbacks(ARRAY[%s]::bigint[])"
    with psycopg.connect(dsn, autocommit=True) as host:
        for _ in range(10):  # the group is not complete: nothing to release
            assert host.execute(release, (group.id,)).fetchall() == []
        pgpool.enqueue_many(db, "k", ({"n": i} for i in range(20_000)))
        db.execute("UPDATE pgpool_groups SET completed_at = now() WHERE id = %s", (group.id,))
        # The fewest of three runs (rolled back): the function plans its statement at each
        # call, and planning after a cache invalidation (an autovacuum's ANALYZE of another
        # table, on a busy server) reads catalog pages too, which count. A scan of the
        # table would read its 200 pages in every run.
        touched = []
        for _ in range(3):
            with host.transaction(force_rollback=True):
                ((plan,),) = host.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + release,
                                          (group.id,)).fetchone()
            touched.append(_buffers(plan["Plan"]))
        host.execute(release, (group.id,))
    print(f"{touched} buffers to release a callback beside 20,000 jobs")
    assert min(touched) < 50, touched
    assert pgpool.job_status(db, group.id).state == "ready"


def test_retention_prunes_records_past_their_keep_but_not_a_pending_groups(db, dsn):
    group = pgpool.group(db, "out.score", [{"doc": 1}], then=("out.combine", {}))
    member = one(db, "SELECT id FROM pgpool_jobs WHERE group_id = %s", group.id)[0]
    db.execute("INSERT INTO pgpool_done (id, queue, kind, attempts, created_at, keep_until, "
               "group_id) VALUES (%s, 'default', 'out.score', 1, now(), now(), %s), "
               "(1000001, 'default', 'k', 1, now(), now(), NULL), "
               "(1000002, 'default', 'k', 1, now(), now() + interval '1 hour', NULL)",
               (member, group.id))
    db.execute("DELETE FROM pgpool_jobs WHERE id = %s", (member,))
    prune = asyncio.run(_prune(dsn))
    assert prune == 1  # only 1000001: the member's callback has not run yet
    assert [i for (i,) in db.execute("SELECT id FROM pgpool_done ORDER BY id")] == \
        [member, 1000002]
    db.execute("DELETE FROM pgpool_jobs WHERE id = %s", (group.id,))  # the callback ran
    db.execute("UPDATE pgpool_groups SET completed_at = now()")
    assert asyncio.run(_prune(dsn)) == 2  # the member's record, then the group
    assert one(db, "SELECT count(*) FROM pgpool_groups") == (0,)


def test_retention_keeps_a_groups_records_until_it_is_complete(db, dsn):
    # A callback cancelled while its group waits may be replayed, to wait again and then
    # read every member: its members' records stay until the group is complete.
    group = pgpool.group(db, "out.score", [{"doc": 1}, {"doc": 2}], then=("out.combine", {}))
    first, second = [i for (i,) in db.execute(
        "SELECT id FROM pgpool_jobs WHERE group_id = %s ORDER BY id", (group.id,))]
    ops.cancel(db, [group.id])
    db.execute("INSERT INTO pgpool_done (id, queue, kind, attempts, created_at, keep_until, "
               "group_id) VALUES (%s, 'default', 'out.score', 1, now(), now(), %s)",
               (first, group.id))
    db.execute("DELETE FROM pgpool_jobs WHERE id = %s", (first,))
    db.execute("UPDATE pgpool_groups SET done = 1 WHERE id = %s", (group.id,))
    assert asyncio.run(_prune(dsn)) == 0
    ops.cancel(db, [second])  # the last member: the group is complete
    assert pgpool.group_status(db, group.id).completed_at is not None
    assert asyncio.run(_prune(dsn)) == 1
    assert one(db, "SELECT count(*) FROM pgpool_done") == (0,)


def _buffers(node: dict) -> int:
    """Shared buffers a plan node (and all below it) hit or read."""
    return node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_a_retention_pass_never_reads_the_kept_records_of_a_waiting_group(db, dsn, mode):
    # Issue 31 S4: the records of a group whose callback waits are kept, all past their
    # keep_until (a member's is its finish). A pass that walked them to find the few it
    # deletes read every one of them, every minute, for as long as the group waited.
    members = 20_000
    group = pgpool.group(db, "out.score", [{"doc": 1}], then=("out.combine", {}))
    db.execute("INSERT INTO pgpool_done (id, queue, kind, attempts, created_at, keep_until, "
               "group_id) SELECT 1000000 + i, 'default', 'out.score', 1, now(), "
               "now() - interval '1 hour' + i * interval '1 ms', %s "
               "FROM generate_series(1, %s) AS i", (group.id, members))
    db.execute("INSERT INTO pgpool_done (id, queue, kind, attempts, created_at, keep_until) "
               "SELECT 2000000 + i, 'default', 'k', 1, now(), now() + CASE WHEN i <= 5 "
               "THEN interval '-1 hour' ELSE interval '1 hour' END "
               "FROM generate_series(1, 100) AS i")
    db.execute("ANALYZE pgpool_done")
    with db.transaction(force_rollback=True):
        plan = explain_prepared(db, outcomes_sql.PRUNE_DONE, {"limit": BATCH}, mode,
                                "ANALYZE, BUFFERS, FORMAT JSON")
    print(f"{mode}: {_buffers(plan)} buffers for a batch beside {members} kept records")
    assert _buffers(plan) < 100, plan
    assert asyncio.run(_prune(dsn)) == 5  # the expired records of no group only
    assert one(db, "SELECT count(*) FROM pgpool_done WHERE group_id = %s", group.id) == (
        members,)


def test_dead_letter_retention_keeps_the_members_whose_callback_has_not_run(db, dsn):
    group = pgpool.group(db, "out.score", [{"doc": 1}, {"doc": 2}], then=("out.combine", {}))
    member = one(db, "SELECT min(id) FROM pgpool_jobs WHERE group_id = %s", group.id)[0]
    loose = pgpool.enqueue(db, "out.square", {"n": 1})
    ops.cancel(db, [member, loose])
    db.execute("UPDATE pgpool_dead SET died_at = now() - interval '2 days'")
    assert asyncio.run(_prune(dsn, retention=86_400)) == 1  # the loose one only
    assert db.execute("SELECT id FROM pgpool_dead").fetchall() == [(member,)]
    # Once the callback has run (here: it is gone), nothing reads the member any more.
    db.execute("DELETE FROM pgpool_jobs WHERE id = %s", (group.id,))
    assert asyncio.run(_prune(dsn, retention=86_400)) == 1
    assert one(db, "SELECT count(*) FROM pgpool_dead") == (0,)


async def _prune(dsn: str, retention: float | None = None) -> int | None:
    from psycopg_pool import AsyncConnectionPool

    from pgpool.host.parts.retention import Retention

    async with AsyncConnectionPool(dsn, kwargs={"autocommit": True}, open=False) as pool:
        return await Retention(pool, retention).prune()


def test_wait_until_in_a_thread_ends_with_the_group(db, dsn):
    group = pgpool.group(db, "out.score", [{"doc": d, "sleep": 0.2} for d in range(4)],
                         then=("out.combine", {}))
    host = start_pgpool(dsn, "run", "--handlers", "outcomejobs", "--procs", "2")
    found = pgpool.wait(db, [group.id], timeout=60)
    assert found[group.id].result["members"] == 4
    wait_until(lambda: pgpool.group_status(db, group.id).callback == "done", "the callback")
    assert host.stop() == 0


@pytest.mark.soak  # two real drains: the soak tier, run by CI
def test_the_outcomes_cost_bench_measures_every_variant_and_leaves_nothing(db, dsn):
    result = run_bench_script("outcomes_cost.py", dsn, "--jobs", "1000", "--flushes", "10",
                              "--rounds", "1", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report["flush_us"]) == {"plain", "keep", "member"}
    assert all(f["median"] > 0 for f in report["flush_us"].values())
    assert [len(runs) for runs in report["drains"].values()] == [1, 1]
    assert db.execute(BENCH_SCHEMAS).fetchall() == []


def _scans(node: dict, relation: str) -> list[tuple[str, str | None]]:
    """(node type, index) of every scan of ``relation`` in a plan."""
    found = [(node["Node Type"], node.get("Index Name"))] if node.get(
        "Relation Name") == relation else []
    return found + [s for child in node.get("Plans", []) for s in _scans(child, relation)]


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_dead_letter_retention_probes_the_live_jobs_by_key_only(db, mode):
    # Its guard of members is an anti-join: a key probe per dead job, never a scan of every
    # live job (a hashed subplan would read them all at each batch).
    pgpool.enqueue_many(db, "k", ({"n": i} for i in range(5000)))
    db.execute("INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, "
               "created_at, died_at, group_id) SELECT 10000000 + g, 'default', 'k', '{}', 0, "
               "1, now(), now() - interval '40 days' + g * interval '1 s', "
               "CASE WHEN g % 100 = 0 THEN g % 50 + 1 END FROM generate_series(1, 20000) g")
    db.execute("ANALYZE pgpool_dead")
    db.execute("ANALYZE pgpool_jobs")
    params = {**ops.DeadFilter(older_than=30 * 86_400).params(), "keep_pending": True,
              "limit": 1000}
    with db.transaction(force_rollback=True):
        plan = explain_prepared(db, ops_sql.PURGE_DEAD, params, mode)
    assert {scan for scan in _scans(plan, "pgpool_jobs")} <= {
        ("Index Only Scan", "pgpool_jobs_pkey"), ("Index Scan", "pgpool_jobs_pkey")}, plan
    assert _scans(plan, "pgpool_jobs")
