"""The handler module that runs Django tasks: ``pgpool run --handlers
pgpool.contrib.django.worker``, with ``DJANGO_SETTINGS_MODULE`` set as for ``manage.py``.

Importing it sets Django up (``django.setup()``), in the dispatcher and in each worker
process, and registers the handler of `pgpool.contrib.django.tasks.KIND`. A job calls its
task with its arguments (``context`` first for a task that takes it, whose ``attempt`` is
the job's), with Django's stale database connections closed before and after, as Django
does around a request. Its success is kept (`pgpool.contrib.django.tasks.keep_seconds`)
with the task's path, arguments and return value, from which ``get_result`` answers; a
return value that is not JSON fails the job. A task that raises fails the job's one
attempt, and the job becomes a dead letter.
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

from .tasks import (  # noqa: E402
    KIND,
    TaskContext,
    TaskResultStatus,
    keep_seconds,
    make_result,
    task_of,
)


@pgpool.handler(KIND, max_attempts=1, keep=keep_seconds())
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


def _context(task: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """The ``TaskContext`` of a task that takes it: its result, RUNNING, under the job's id
    and with one worker id per attempt so far."""
    job = pgpool.current_job()
    result = make_result(task, str(job.id), TaskResultStatus.RUNNING, args, kwargs, task.backend)
    result.worker_ids.extend([str(os.getpid())] * job.attempt)
    return TaskContext(task_result=result)
