"""Django for the pages of docs/ that show it (tests/api/test_doc_examples.py runs their
examples).

Django keeps its settings for the life of a process, and the pages of one test process each
have a schema of their own: the first page configures Django, and each later one leads the
``default`` database to its own schema before its examples run.
"""

from __future__ import annotations

from typing import Any

import django
from django.conf import settings
from django.db import connections
from psycopg.conninfo import conninfo_to_dict

_NAMED = {"dbname": "NAME", "user": "USER", "password": "PASSWORD", "host": "HOST",
          "port": "PORT"}


def use_database(dsn: str) -> None:
    """Django set up (once per process) with its ``default`` database at ``dsn``, the
    pgpool app, django-tasks and the pgpool tasks backend installed."""
    params = conninfo_to_dict(dsn)
    database: dict[str, Any] = {
        "ENGINE": "django.db.backends.postgresql",
        **{_NAMED[k]: str(v) for k, v in params.items() if k in _NAMED},
        "OPTIONS": {k: v for k, v in params.items() if k not in _NAMED},
    }
    if not settings.configured:
        settings.configure(
            USE_TZ=True,
            INSTALLED_APPS=["pgpool.contrib.django", "django_tasks"],
            DATABASES={"default": database},
            TASKS={"default": {"BACKEND": "pgpool.contrib.django.tasks.PgpoolBackend",
                               "QUEUES": []}},
        )
        django.setup()
        return
    # Django reads settings_dict at each connect: closed, the connection reconnects there.
    connections.close_all()
    connections["default"].settings_dict.update(database)
