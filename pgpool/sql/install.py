"""Installation: finding and migrating pgpool's schema (`pgpool.db.schema`, whose migrations
hold the DDL itself) and granting roles their privileges (`pgpool.db.grants`)."""

from __future__ import annotations

from typing import Final

# --- schema bookkeeping (pgpool.db.schema) ------------------------------------------------

#: Every schema of the database holding tables named ``pgpool_*``: its name, its place on
#: the session's effective ``search_path`` (1-based; NULL when not on it) and those tables.
#: pgpool is installed where ``pgpool_schema_version`` is (`pgpool.db.schema.locate`). Views
#: and foreign tables count: an unqualified name would resolve to them just the same.
INSTALLATIONS: Final = r"""
SELECT n.nspname::text, p.pos::int, array_agg(c.relname::text ORDER BY c.relname)
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN unnest(current_schemas(false)) WITH ORDINALITY AS p(name, pos) ON p.name = n.nspname
WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND c.relname LIKE 'pgpool\_%'
GROUP BY n.nspname, p.pos
ORDER BY p.pos NULLS LAST, n.nspname
"""

#: Where a new installation goes: the first existing schema on ``search_path``.
CURRENT_SCHEMA: Final = "SELECT current_schema()"

#: The migration transaction's session settings, to restore them at its end: SET LOCAL in a
#: savepoint (`migrate` inside the caller's transaction) would outlive the savepoint.
MIGRATE_SAVED: Final = "SELECT current_setting('search_path'), current_setting('lock_timeout')"
#: For the migration's transaction only (``is_local``): run the DDL in the installation's
#: schema, whatever schema the session's ``search_path`` would create tables in.
MIGRATE_SEARCH_PATH: Final = "SELECT set_config('search_path', %(search_path)s, true)"
#: One migration at a time per schema; installations in different schemas never wait on
#: each other. Taken before `MIGRATE_LOCK_TIMEOUT`: waiting here blocks nobody else.
MIGRATE_LOCK: Final = (
    "SELECT pg_advisory_xact_lock(hashtext('pgpool.migrate:' || current_schema()))"
)
#: A DDL waiting for ACCESS EXCLUSIVE makes every later statement on that table (claims,
#: heartbeats, acks) queue behind it: give up after this long, and retry later.
MIGRATE_LOCK_TIMEOUT: Final = "SELECT set_config('lock_timeout', %(lock_timeout)s, true)"
#: Put back what `MIGRATE_SAVED` read, at the end of the migration's transaction.
MIGRATE_RESTORE: Final = """
SELECT set_config('search_path', %(search_path)s, true),
       set_config('lock_timeout', %(lock_timeout)s, true)
"""
#: Record one applied migration.
MIGRATE_RECORD: Final = (
    "INSERT INTO pgpool_schema_version (version, description) VALUES (%s, %s)"
)

#: Sessions holding locks on pgpool's tables in schema ``schema``: named when `migrate`
#: gives up, so the operator knows which to end.
LOCK_HOLDERS: Final = r"""
SELECT DISTINCT l.pid FROM pg_locks AS l
JOIN pg_class AS c ON c.oid = l.relation
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE l.granted AND l.pid <> pg_backend_pid() AND n.nspname = %(schema)s
  AND c.relname LIKE 'pgpool\_%%'
ORDER BY 1
"""

#: Every migration a database has applied (`pgpool.db.schema._applied` reads its version
#: from them).
SCHEMA_VERSIONS: Final = (
    "SELECT coalesce(array_agg(version), '{}') FROM pgpool_schema_version"
)

# --- grants (pgpool.db.grants) ------------------------------------------------------------

#: Templates for psycopg.sql: ``{tables}`` are schema-qualified, ``{role}`` an identifier,
#: ``{privileges}`` one of pgpool.db.grants' fixed lists.
REVOKE_TABLES: Final = "REVOKE ALL ON {tables} FROM {role}"
GRANT_SCHEMA: Final = "GRANT USAGE ON SCHEMA {schema} TO {role}"
REVOKE_CREATE: Final = "REVOKE CREATE ON SCHEMA {schema} FROM {role}"
GRANT_TABLES: Final = "GRANT {privileges} ON {tables} TO {role}"
#: ``{functions}``: schema-qualified signatures (`pgpool.db.grants.FUNCTIONS`).
REVOKE_FUNCTIONS: Final = "REVOKE ALL ON FUNCTION {functions} FROM {role}"
GRANT_FUNCTIONS: Final = "GRANT EXECUTE ON FUNCTION {functions} TO {role}"

#: The schema pgpool_jobs resolves to through the connection's search_path (NULL: none),
#: and whether this role may grant on it: its owner, a member of the owner's role or a
#: superuser. (GRANT and REVOKE from anyone else only warn that nothing was granted.)
INSTALLED_SCHEMA: Final = """
SELECT n.nspname, pg_has_role(c.relowner, 'USAGE')
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass('pgpool_jobs')
"""
