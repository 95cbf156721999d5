"""The handler module that runs Django tasks: ``pgpool run --handlers
pgpool.contrib.django.worker``, with ``DJANGO_SETTINGS_MODULE`` set as for ``manage.py``.

Importing it sets Django up (``django.setup()``), in the dispatcher and in each worker
process, imports each installed app's ``tasks`` module (as Django's admin finds the
``admin`` modules), and registers a handler for each task defined by then on a pgpool
backend (`pgpool.contrib.django.tasks.defined`), under the task's own kind (``django:``
and its import path): one attempt, as Django's, or the retry policy the task opted into
(`pgpool.contrib.django.tasks.retry`). A task defined in another module is served when a
module imported by then (its app's ``tasks`` module, say) imports it. The same handler
serves `pgpool.contrib.django.tasks.LEGACY_KIND`, the one kind of the jobs enqueued
before each task had its own.

A job calls its task with its arguments (``context`` first for a task that takes it, whose
``attempt`` is the job's), with Django's stale database connections closed before and
after, as Django does around a request. Its success is kept
(`pgpool.contrib.django.tasks.keep_seconds`) with the task's path, arguments and return
value, from which ``get_result`` answers; a return value that is not JSON fails the job. A
task that raises fails the job's attempt; after its last one (its only one, unless the
task opted into a retry policy) the job becomes a dead letter.
"""

from __future__ import annotations

import os
from typing import Any

import django

import pgpool

from ...errors import ConfigError

if not os.environ.get("DJANGO_SETTINGS_MODULE"):
    raise ConfigError("DJANGO_SETTINGS_MODULE is not set: set it to your settings module "
                      "(as for manage.py) before running pgpool.contrib.django.worker")
django.setup()

from django.db import close_old_connections  # noqa: E402 (needs the settings)
from django.utils.module_loading import autodiscover_modules  # noqa: E402

from .tasks import (  # noqa: E402
    LEGACY_KIND,
    TaskContext,
    TaskResultStatus,
    defined,
    keep_seconds,
    kind_of,
    make_result,
    retry_of,
    task_of,
)

_keep = keep_seconds()


@pgpool.handler(LEGACY_KIND, max_attempts=1, keep=_keep)
def run_task(payload: dict[str, Any]) -> dict[str, Any]:
    """Run the task the payload names with its arguments; the payload with the task's
    return value, which is kept for ``get_result``."""
    task = task_of(payload.get("task"))
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    close_old_connections()
    try:
        if task.takes_context:
            value = task.call(_context(task, args, kwargs), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
    finally:
        close_old_connections()
    return {**payload, "return_value": value}


def _register_tasks() -> None:
    """Import the apps' ``tasks`` modules, and register `run_task` for each task's kind."""
    autodiscover_modules("tasks")
    for task in defined():
        policy = retry_of(task)
        # Django's one attempt, unless the task opted into a policy (whose attempts, if it
        # gives none, are pgpool's default).
        pgpool.handler(kind_of(task), max_attempts=None if policy else 1, retry=policy,
                       keep=_keep)(run_task)


_register_tasks()


def _context(task: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The ``TaskContext`` of a task that takes it: its result, RUNNING, under the job's id
    and with one worker id per attempt so far."""
    job = pgpool.current_job()
    result = make_result(task, str(job.id), TaskResultStatus.RUNNING, args, kwargs, task.backend)
    result.worker_ids.extend([str(os.getpid())] * job.attempt)
    return TaskContext(task_result=result)
