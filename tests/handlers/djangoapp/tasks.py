"""The test project's tasks."""

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

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
