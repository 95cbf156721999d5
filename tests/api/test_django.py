"""pgpool.contrib.django in a real Django project (tests/handlers/djangoapp) on the test's
schema: enqueue inside ``transaction.atomic()``, ``manage.py migrate`` installing pgpool,
and tasks enqueued through the tasks backend run by a real ``pgpool run``.

Django keeps its settings for the life of a process, so each step runs in a Python
process of its own (`django_run`), as a management command or a view's code would.
Tested with Django 5.2 and the django-tasks package; Django 6's built-in ``django.tasks``
is the same API but is not run here (it needs Python 3.12).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import psycopg
import pytest
from commands import pgpool_env, run_pgpool
from dbtools import one
from places import HANDLERS
from processes import start_pgpool
from waits import wait_until

import pgpool
from pgpool.db.schema import schema_version

pytestmark = pytest.mark.own_schema  # Django's tables and the app's go in the schema


def django_env(dsn: str) -> dict[str, str]:
    """What a process of the test project needs: its settings, and the test's DSN."""
    return {"DJANGO_SETTINGS_MODULE": "djangoapp.settings", "DJANGOAPP_DSN": dsn}


def django_run(dsn: str, code: str, *, migrate: bool = False) -> str:
    """Run ``code`` in a new Python process with the test project set up (from tests/handlers/,
    so ``djangoapp`` imports), after ``manage.py migrate`` with ``migrate``; its standard
    output. A failure shows its standard error."""
    script = "import django\ndjango.setup()\n" + (MIGRATE if migrate else "")
    script += textwrap.dedent(code)
    result = subprocess.run([sys.executable, "-c", script], cwd=HANDLERS,
                            env=pgpool_env(dsn, **django_env(dsn)), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


MIGRATE = """
from django.core.management import call_command
call_command("migrate", verbosity=0)
"""


@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_manage_py_migrate_installs_pgpool_and_reversing_it_leaves_the_tables(dsn: str
                                                                              ) -> None:
    django_run(dsn, "", migrate=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert schema_version(conn) == pgpool.SCHEMA_VERSION
        assert one(conn, "SELECT name FROM django_migrations WHERE app = 'pgpool'") == (
            "0001_pgpool",)
        assert one(conn, "SELECT count(*) FROM djangoapp_effect") == (0,)
    django_run(dsn, """
        from django.core.management import call_command
        call_command("migrate", "pgpool", "zero", verbosity=0)
        """)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert one(conn, "SELECT count(*) FROM django_migrations WHERE app = 'pgpool'") == (0,)
        assert schema_version(conn) == pgpool.SCHEMA_VERSION  # a no-op: the jobs stay


def test_enqueue_commits_with_the_transaction_or_not_at_all(dsn: str) -> None:
    out = django_run(dsn, migrate=True, code="""
        from django.db import transaction
        from pgpool.contrib.django import enqueue, enqueue_many
        from djangoapp.models import Effect

        try:
            with transaction.atomic():
                Effect.objects.create(note="rolled back")
                enqueue("record", {"note": "rolled back"})
                enqueue_many("record", [{"note": "rolled back too"}])
                raise RuntimeError("the view failed")
        except RuntimeError:
            pass
        with transaction.atomic():
            Effect.objects.create(note="committed")
            print(enqueue("record", {"note": "committed"}, queue="mail", priority=3))
            print(enqueue_many("record", [{"note": "many 1"}, {"note": "many 2"}]))
        print(enqueue("record", {"note": "autocommit"}))
        """)
    job_id, count, autocommitted = map(int, out.split())
    assert count == 2
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT note FROM djangoapp_effect").fetchall() == [("committed",)]
        jobs = conn.execute("SELECT id, queue, priority, payload->>'note' FROM pgpool_jobs "
                            "ORDER BY id").fetchall()
    assert jobs[0] == (job_id, "mail", 3, "committed")
    assert [j[3] for j in jobs] == ["committed", "many 1", "many 2", "autocommit"]
    assert jobs[-1][0] == autocommitted


def test_enqueue_takes_a_handler_with_its_defaults_and_its_payload_type(dsn: str) -> None:
    out = django_run(dsn, migrate=True, code="""
        from django.db import transaction
        from pgpool import PayloadError
        from pgpool.contrib.django import enqueue, enqueue_many
        from typedjobs import Size, Thumb, report, thumb

        with transaction.atomic():
            print(enqueue(thumb, Thumb(7, Size.LARGE)))
            print(enqueue(thumb, {"image_id": 8, "size": Size.SMALL}, priority=1))
            print(enqueue_many(thumb, [Thumb(9, Size.SMALL)], concurrency_key="batch"))
            print(enqueue(report, {"report_id": 3, "pages": []}))
            print(enqueue(report, {"report_id": 3, "pages": [1]}))  # its unique_key: a dup
        for bad in (lambda: enqueue(thumb, {"image_id": "x", "size": 64}),
                    lambda: enqueue_many(thumb, [{"size": 64}], concurrency_key="k"),
                    lambda: enqueue("typed.thumb", Thumb(1, Size.SMALL))):
            try:
                bad()
            except PayloadError as exc:
                print(exc)
        """)
    lines = out.splitlines()
    first, second, count, third, duplicate = lines[:5]
    assert (count, duplicate) == ("1", "None")
    assert lines[5:7] == [
        "payload for 'typed.thumb': field 'image_id': expected int, got str",
        "payload #0 (0-based): payload for 'typed.thumb': field 'image_id': missing (required "
        "by Thumb)"]
    assert lines[7].startswith("payload must be a dict (a JSON object), not Thumb: it is the "
                               "payload type of handler 'typed.thumb' (typedjobs.thumb)")
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, kind, queue, priority, tenant, concurrency_key, unique_key, "
            "payload->'image_id' FROM pgpool_jobs ORDER BY id").fetchall()
    assert [row[1:] for row in rows] == [
        ("typed.thumb", "thumbs", 5, "acme", "image-7", None, 7),
        ("typed.thumb", "thumbs", 1, "acme", "image-8", None, 8),
        ("typed.thumb", "thumbs", 5, "acme", "batch", None, 9),
        ("typed.report", "default", 0, "", None, "report-3", None)]
    assert [rows[i][0] for i in (0, 1, 3)] == [int(first), int(second), int(third)]


def test_a_database_that_is_not_postgresql_on_psycopg_3_is_refused_in_one_line(dsn: str
                                                                               ) -> None:
    out = django_run(dsn, """
        from pgpool import ConfigError
        from pgpool.contrib.django import enqueue
        try:
            enqueue("record", {}, using="other")
        except ConfigError as exc:
            print(exc)
        """)
    assert out.strip() == ("Django database 'other' is sqlite, not PostgreSQL: pgpool's jobs "
                           "live in PostgreSQL; pass using= a PostgreSQL alias")


def test_task_options_become_the_jobs(dsn: str, db: psycopg.Connection) -> None:
    out = django_run(dsn, migrate=True, code="""
        from datetime import timedelta
        from django.utils import timezone
        from djangoapp.tasks import write_note
        from pgpool.contrib.django.tasks import InvalidTask

        later = write_note.using(priority=-40, queue_name="emails",
                                 run_after=timezone.now() + timedelta(hours=1))
        result = later.enqueue("later", extra=[1, 2])
        print(result.id, result.status)
        found = write_note.get_result(result.id)
        print(found.status, found.task.queue_name, found.task.priority, found.args,
              found.kwargs["extra"])
        try:
            write_note.using(queue_name="no spaces").enqueue("x")
        except InvalidTask as exc:
            print("refused:", exc)
        """).splitlines()
    job_id, status = out[0].split()
    assert status == "READY"
    assert out[1] == "READY emails -40 ['later'] [1, 2]"
    assert out[2].startswith("refused: invalid queue 'no spaces'")
    row = one(db, "SELECT kind, queue, priority, state, run_at > now() + interval '59 min', "
                  "payload FROM pgpool_jobs WHERE id = %s", int(job_id))
    assert row == ("django:djangoapp.tasks.write_note", "emails", -40, "scheduled", True,
                   {"task": "djangoapp.tasks.write_note", "args": ["later"],
                    "kwargs": {"extra": [1, 2]}})


@pytest.mark.soak  # a Django project and a real host, over 10 s: `make soak-test`
def test_tasks_run_on_a_pgpool_host_and_their_results_read_from_pgpool(dsn: str,
                                                                       db: psycopg.Connection
                                                                       ) -> None:
    out = django_run(dsn, migrate=True, code="""
        from django.db import transaction
        from djangoapp.tasks import explode, write_attempt, write_note

        try:
            with transaction.atomic():
                gone = write_note.enqueue("rolled back")
                raise RuntimeError("the view failed")
        except RuntimeError:
            pass
        with transaction.atomic():
            ok = write_note.enqueue("from a task")
            write_attempt.enqueue("with context")
            bad = explode.enqueue()
        print(ok.id, bad.id, gone.id, write_note.get_result(ok.id).status)
        """)
    ok, bad, gone, status = out.split()
    assert status == "READY"
    assert one(db, "SELECT count(*) FROM pgpool_jobs WHERE id = %s", int(gone)) == (0,)
    # A job enqueued before each task had a kind of its own, under the one kind of then.
    legacy = pgpool.enqueue(db, "pgpool.django", {"task": "djangoapp.tasks.write_note",
                                                  "args": ["legacy"], "kwargs": {}})

    done = run_pgpool(dsn, "run", "--burst", "--procs", "1", "--handlers",
                      "pgpool.contrib.django.worker", **django_env(dsn))
    assert done.returncode == 0, done.stderr
    assert sorted(db.execute("SELECT note FROM djangoapp_effect").fetchall()) == [
        ("from a task",), ("legacy",), ("with context attempt 1",)]
    # Each task's jobs are of its own kind (the legacy job's stays what it was).
    kinds = dict(db.execute("SELECT id, kind FROM pgpool_done UNION ALL "
                            "SELECT id, kind FROM pgpool_dead").fetchall())
    assert (kinds.pop(int(ok)), kinds.pop(int(bad)), kinds.pop(legacy)) == (
        "django:djangoapp.tasks.write_note", "django:djangoapp.tasks.explode", "pgpool.django")
    assert list(kinds.values()) == ["django:djangoapp.tasks.write_attempt"]

    out = django_run(dsn, f"""
        from djangoapp.tasks import explode, write_note
        from pgpool.contrib.django.tasks import TaskResultDoesNotExist

        failed = explode.get_result("{bad}")
        print(failed.status, failed.errors[0].exception_class_path, failed.attempts,
              failed.is_finished)
        print(failed.errors[0].traceback.splitlines()[-1])
        succeeded = write_note.get_result("{ok}")
        print(succeeded.status, succeeded.return_value, succeeded.args,
              succeeded.finished_at is not None)
        print(write_note.get_result("{legacy}").return_value)
        try:
            write_note.get_result("{gone}")
        except TaskResultDoesNotExist:
            print("rolled back: no such job")
        for not_an_id in ("abc", "-1", str(2**64)):
            try:
                write_note.get_result(not_an_id)
            except TaskResultDoesNotExist as exc:
                print(exc)
        """).splitlines()
    note_id = one(db, "SELECT id FROM djangoapp_effect WHERE note = 'from a task'")[0]
    assert out[0] == "FAILED builtins.ValueError 1 True"
    assert out[1] == "ValueError: this task always fails"
    assert out[2] == f"SUCCESSFUL {note_id} ['from a task'] True"
    assert out[3] == str(one(db, "SELECT id FROM djangoapp_effect WHERE note = 'legacy'")[0])
    assert out[4] == "rolled back: no such job"
    assert out[5:] == [f"{i!r} is not a pgpool job's id" for i in ("abc", "-1", str(2**64))]
    kept = one(db, "SELECT extract(epoch FROM keep_until - finished_at) FROM pgpool_done "
                   "WHERE id = %s", int(ok))
    assert kept == (7 * 86400,)  # the default OPTIONS["KEEP"]


@pytest.mark.soak  # a Django project and a real host, over 10 s: `make soak-test`
def test_a_task_opts_into_pgpools_retry_policy_and_the_others_keep_one_attempt(
        dsn: str, db: psycopg.Connection) -> None:
    out = django_run(dsn, migrate=True, code="""
        import pgpool
        from djangoapp.tasks import explode, flaky, write_note
        from pgpool.contrib.django.tasks import retry

        print(flaky.enqueue("flaky").id, explode.enqueue().id)
        for wrong in (lambda: retry(3), lambda: retry(pgpool.Retry())(print)):
            try:
                wrong()
            except pgpool.ConfigError as exc:
                print(exc)
        """).splitlines()
    flaky, explode = map(int, out[0].split())
    assert out[1:] == ["retry() takes a pgpool.Retry(...), got a int",
                       "@retry(...) decorates a Django task: put it above @task, not on a "
                       "builtin_function_or_method"]
    # Not --burst: a burst host would end while the retries wait out their backoff.
    host = start_pgpool(dsn, "run", "--procs", "1", "--handlers",
                        "pgpool.contrib.django.worker", **django_env(dsn))
    wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_done WHERE id = %s", flaky)
               == (1,), "the flaky task to succeed")
    assert host.stop() == 0
    assert one(db, "SELECT kind, attempts FROM pgpool_done WHERE id = %s", flaky) == (
        "django:djangoapp.tasks.flaky", 3)
    assert one(db, "SELECT note FROM djangoapp_effect") == ("flaky on attempt 3",)
    assert one(db, "SELECT attempts FROM pgpool_dead WHERE id = %s", explode) == (1,)
    out = django_run(dsn, f"""
        from djangoapp.tasks import flaky
        result = flaky.get_result("{flaky}")
        print(result.status, result.attempts)
        """)
    assert out == "SUCCESSFUL 3\n"


def test_the_worker_module_needs_the_settings_module(dsn: str) -> None:
    env = {k: v for k, v in django_env(dsn).items() if k != "DJANGO_SETTINGS_MODULE"}
    result = run_pgpool(dsn, "run", "--burst", "--handlers", "pgpool.contrib.django.worker",
                        **env)
    assert result.returncode != 0
    assert "DJANGO_SETTINGS_MODULE is not set" in result.stderr
    assert "Traceback" not in result.stderr
