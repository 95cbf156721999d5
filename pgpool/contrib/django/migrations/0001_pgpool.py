"""``manage.py migrate`` runs `pgpool.migrate`: pgpool's tables are created (or upgraded to
this pgpool's schema) where pgpool would put them itself, in the first schema of the
database's ``search_path`` unless an installation is found on it.

pgpool's migrations are numbered apart from Django's, so this one migration stands for all
of them at the time it runs; after upgrading pgpool, ``pgpool migrate`` upgrades the tables
(docs/guides/upgrading.md). A database that is not PostgreSQL is left alone. Reversing it
is a no-op: it leaves the tables, which hold jobs; dropping them is an operator's decision.
"""

from typing import Any

from django.db import migrations

import pgpool


def install(apps: Any, schema_editor: Any) -> None:
    from pgpool.contrib.django import connection_for

    if schema_editor.connection.vendor == "postgresql":
        pgpool.migrate(connection_for(schema_editor.connection.alias))


class Migration(migrations.Migration):
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(install, migrations.RunPython.noop, elidable=False)]
