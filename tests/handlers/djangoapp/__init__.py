"""A real Django project for tests/api/test_django.py, settings and app in one package: its
database is the test's schema (``DJANGOAPP_DSN``), its tasks run on pgpool."""
