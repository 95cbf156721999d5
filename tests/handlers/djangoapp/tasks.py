"""The test project's tasks."""

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

import pgpool
from pgpool.contrib.django.tasks import retry

from .models import Effect


@task
def write_note(note: str) -> int:
    return Effect.objects.create(note=note).id


@task(takes_context=True)
def write_attempt(context, note: str) -> None:
    Effect.objects.create(note=f"{note} attempt {context.attempt}")


@task
def explode() -> None:
    raise ValueError("this task always fails")


@retry(pgpool.Retry(attempts=3, base=0.05, cap=0.05, jitter=False))
@task(takes_context=True)
def flaky(context, note: str) -> int:
    """Fails its first two attempts: it opted into pgpool's retry policy."""
    if context.attempt < 3:
        raise ConnectionError(f"attempt {context.attempt} failed")
    return Effect.objects.create(note=f"{note} on attempt {context.attempt}").id
