"""The test project's settings: ``default`` is PostgreSQL on psycopg 3 at the test's DSN
(``DJANGOAPP_DSN``, whose ``options`` carry the test schema's search_path); ``other`` is
SQLite, to be refused by pgpool."""

import os

from psycopg.conninfo import conninfo_to_dict

_dsn = conninfo_to_dict(os.environ["DJANGOAPP_DSN"])
_named = {"dbname": "NAME", "user": "USER", "password": "PASSWORD", "host": "HOST",
          "port": "PORT"}

try:
    import django.tasks  # noqa: F401  (Django 6: built in)

    _TASKS_APP = []
except ImportError:
    _TASKS_APP = ["django_tasks"]

SECRET_KEY = "pgpool-tests"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["pgpool.contrib.django", *_TASKS_APP, "djangoapp"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        **{_named[k]: str(v) for k, v in _dsn.items() if k in _named},
        "OPTIONS": {k: v for k, v in _dsn.items() if k not in _named},
    },
    "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
TASKS = {"default": {"BACKEND": "pgpool.contrib.django.tasks.PgpoolBackend", "QUEUES": []}}
