"""A backend for Django's tasks framework that runs tasks as pgpool jobs.

::

    TASKS = {"default": {"BACKEND": "pgpool.contrib.django.tasks.PgpoolBackend",
                         "QUEUES": [],  # any queue name; or the list of those allowed
                         "OPTIONS": {"DATABASE": "default"}}}

Each task is a kind of job of its own, ``django:`` and its import path (`kind_of`: logs,
dead letters, metrics and ``keep`` tell one task from another), whose payload names the
task with its arguments; ``pgpool run --handlers pgpool.contrib.django.worker`` runs them
(it registers the kind of every task defined here, see `defined`). The task's
``queue_name`` is the job's queue, its ``priority`` the job's (both are "higher runs
first", so Django's -100..100 is used as it is), its ``run_after`` the job's ``run_at``.
``.enqueue()`` inserts the job on Django's connection to ``OPTIONS["DATABASE"]`` inside
the caller's ``transaction.atomic()``: it commits with the application's rows, or not at
all (stronger than enqueueing on commit, which loses the job if the process dies between
the commit and the enqueue; ``transaction.on_commit(partial(task.enqueue, ...))`` works
too). A task that raises is not retried, as in Django's own backends: the job gets one
attempt (the handler's ``max_attempts=1``) and is then a dead letter; unless the task opts
into a pgpool retry policy with `retry` (``@retry(pgpool.Retry(attempts=5))`` above
``@task``).

The result id is the job's id. ``get_result`` reads the job: ready or scheduled is READY,
running RUNNING, a dead letter FAILED (its error as the one `TaskError`), a success
SUCCESSFUL with the task's return value: the worker keeps each task's outcome in
``pgpool_done`` (``OPTIONS["KEEP"]`` seconds, 7 days by default; `keep_seconds`). Once that
record is pruned, ``get_result`` raises ``TaskResultDoesNotExist``, as for an id that
never committed.

Imports ``django.tasks`` (Django 6) when present, else the django-tasks package's
``django_tasks``; tested with Django 5.2 and django-tasks 0.12.
"""

from __future__ import annotations

from typing import Any, Final

import orjson
from django.utils import timezone
from django.utils.module_loading import import_string

from ...errors import ConfigError
from ...names import check_name
from ...retry import Retry
from ...sql import tasks as sql
from . import connection_for, enqueue

try:  # Django 6 and later
    from django.tasks import TaskContext, TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued
except ImportError:  # the django-tasks package (its reference implementation)
    from django_tasks import TaskContext, TaskResult, TaskResultStatus  # type: ignore
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
    from django_tasks.base import Task, TaskError  # type: ignore[no-redef]
    from django_tasks.exceptions import InvalidTaskError as InvalidTask  # type: ignore[no-redef]
    from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef]
    from django_tasks.signals import task_enqueued  # type: ignore[no-redef]

__all__ = ["KIND_PREFIX", "LEGACY_KIND", "InvalidTask", "PgpoolBackend", "Task", "TaskContext",
           "TaskResult", "TaskResultDoesNotExist", "TaskResultStatus", "defined", "kind_of",
           "make_result", "retry", "retry_of", "task_of"]

#: What a task's kind starts with; its import path follows (`kind_of`).
KIND_PREFIX: Final = "django:"
#: The one kind of every task's job before each task had its own: the worker still runs
#: the jobs enqueued so, and ``get_result`` reads them.
LEGACY_KIND: Final = "pgpool.django"
#: How long a task's success is kept by default (``OPTIONS["KEEP"]``): Django's result API
#: answers from it.
DEFAULT_KEEP: Final = 7 * 86400.0

#: A job's state as a task's status. ``parked`` waits for an operator, ``done`` succeeded
#: (kept only because the database refused to delete it).
_STATUS: Final = {
    "ready": TaskResultStatus.READY,
    "scheduled": TaskResultStatus.READY,
    "parked": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
}


#: The tasks of pgpool's backends defined in this process, by import path (`defined`).
_defined: dict[str, Task] = {}
#: The retry policies tasks opted into with `retry`, by import path.
_retries: dict[str, Retry] = {}


def kind_of(task: Task) -> str:
    """The kind of ``task``'s jobs: ``django:`` and its import path."""
    return KIND_PREFIX + task.module_path


def defined() -> list[Task]:
    """The tasks on a pgpool backend that this process has defined (imported), each once:
    the worker registers their kinds."""
    return list(_defined.values())


def retry(policy: Retry) -> Any:
    """Give a task pgpool's retry policy ``policy`` instead of Django's one attempt: a
    decorator, above ``@task``. The worker then registers the task's kind with it (as
    ``@pgpool.handler(kind, retry=policy)``): a failed attempt runs again after its backoff,
    until ``policy.attempts`` are used (pgpool's default, 20, when it gives none)."""
    if not isinstance(policy, Retry):
        raise ConfigError(f"retry() takes a pgpool.Retry(...), got a {type(policy).__name__}")

    def opt_in(task: Task) -> Task:
        if not isinstance(task, Task):
            raise ConfigError(f"@retry(...) decorates a Django task: put it above @task, "
                              f"not on a {type(task).__name__}")
        _retries[task.module_path] = policy
        return task

    return opt_in


def retry_of(task: Task) -> Retry | None:
    """The retry policy ``task`` opted into with `retry`; None: one attempt, as Django's."""
    return _retries.get(task.module_path)


def task_of(path: object) -> Task:
    """The task a payload names by its import path (the `Task` the ``@task`` decorator
    left in its module); `ConfigError` naming it when there is none."""
    try:
        found = import_string(path) if isinstance(path, str) else None
    except ImportError:
        found = None
    if not isinstance(found, Task):
        raise ConfigError(f"no Django task {path!r}: a task is a module-level function "
                          "decorated with @task, under its own name")
    return found


def keep_seconds() -> float:
    """How long the worker keeps a task's success: the largest ``OPTIONS["KEEP"]`` (in
    seconds) of the ``TASKS`` backends that are pgpool's, else `DEFAULT_KEEP`."""
    from django.conf import settings

    keeps = [float(config.get("OPTIONS", {}).get("KEEP", DEFAULT_KEEP))
             for config in getattr(settings, "TASKS", {}).values()
             if config.get("BACKEND") == f"{__name__}.PgpoolBackend"]
    return max(keeps, default=DEFAULT_KEEP)


class PgpoolBackend(BaseTaskBackend):
    """Django tasks as pgpool jobs (see the module's docstring). ``OPTIONS``: ``DATABASE``,
    the alias of the Django database holding pgpool's tables (``"default"``), and ``KEEP``,
    the seconds a task's success is kept for `get_result` (7 days)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.database: str = self.options.get("DATABASE", "default")

    def validate_task(self, task: Task) -> None:
        """Django's checks, and that the queue name and the task's kind are names pgpool
        takes. Django validates each task as it is defined: the task is then recorded for
        the worker (`defined`)."""
        super().validate_task(task)
        try:
            check_name("queue", task.queue_name)
            check_name("kind", kind_of(task))
        except ConfigError as exc:
            raise InvalidTask(str(exc)) from None
        _defined.setdefault(task.module_path, task)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Insert the task's job in the current transaction of Django's connection; its
        result, READY, with the job's id."""
        self.validate_task(task)
        run_at = task.run_after
        if run_at is not None and timezone.is_naive(run_at):  # settings.USE_TZ = False
            run_at = timezone.make_aware(run_at)
        result = make_result(task, "", TaskResultStatus.READY, args, kwargs, self.alias)
        payload = {"task": task.module_path, "args": result.args, "kwargs": result.kwargs}
        job_id = enqueue(kind_of(task), payload, using=self.database, queue=task.queue_name,
                         priority=task.priority, run_at=run_at)
        object.__setattr__(result, "id", str(job_id))
        object.__setattr__(result, "enqueued_at", timezone.now())
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's status as its job's state says (see the module's docstring); raises
        ``TaskResultDoesNotExist`` when there is no such job (any more)."""
        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            job_id = 0
        if not 0 < job_id < 2**63:  # a job's id is a positive bigint
            raise TaskResultDoesNotExist(f"{result_id!r} is not a pgpool job's id")
        row = connection_for(self.database).execute(
            sql.TASK_JOB, {"id": job_id, "legacy": LEGACY_KIND, "prefix": KIND_PREFIX}
        ).fetchone()
        if row is None:
            raise TaskResultDoesNotExist(
                f"{result_id}: no such job waiting, running, kept as done or dead")
        (state, payload_text, queue, priority, run_at, attempts, locked_by, claimed_at,
         created_at, finished_at, last_error) = row
        payload = orjson.loads(payload_text or "{}")  # a success's: what the worker returned
        task = task_of(payload.get("task")).using(
            queue_name=queue, priority=priority,
            run_after=run_at if state == "scheduled" else None)
        status = _STATUS.get(state, TaskResultStatus.READY)
        result = make_result(task, result_id, status, payload.get("args", []),
                             payload.get("kwargs", {}), self.alias)
        started = claimed_at if state == "running" else None
        for name, value in (("enqueued_at", created_at), ("started_at", started),
                            ("last_attempted_at", started), ("finished_at", finished_at),
                            ("worker_ids", [locked_by or "pgpool"] * attempts)):
            object.__setattr__(result, name, value)
        if state == "done":
            object.__setattr__(result, "_return_value", payload.get("return_value"))
        if state == "dead" and last_error:
            result.errors.append(TaskError(exception_class_path=_error_class(last_error),
                                           traceback=last_error))
        return result


def make_result(task: Task, result_id: str, status: TaskResultStatus, args: Any, kwargs: Any,
                backend: str) -> TaskResult:
    """A task's result with nothing recorded yet (args and kwargs as JSON makes them)."""
    return TaskResult(task=task, id=result_id, status=status, enqueued_at=None,
                      started_at=None, finished_at=None, last_attempted_at=None, args=args,
                      kwargs=kwargs, backend=backend, errors=[], worker_ids=[])


def _error_class(error: str) -> str:
    """The exception's class path from a stored error, whose last line is Python's
    ``module.Class: message`` (no module for a built-in one)."""
    lines = error.rstrip().splitlines()
    name = lines[-1].split(":", 1)[0].strip() if lines else ""
    return name if "." in name else f"builtins.{name or 'Exception'}"
