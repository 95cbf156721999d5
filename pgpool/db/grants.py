"""``pgpool grants``: least-privilege GRANT statements for an application role and a worker role.

- The **application** role enqueues and reads: INSERT on the producer's columns of
  ``pgpool_jobs`` (`PRODUCER_COLUMNS`: what ``enqueue`` and ``enqueue_many`` write; COPY
  and ``ON CONFLICT DO NOTHING`` need nothing more; the identity column takes its ids
  without a sequence grant; NOTIFY needs no privilege) and SELECT on every pgpool table
  (``RETURNING`` the id, ``pgpool status``, ``pgpool enqueue``'s check that a host serves
  the kind, outcomes). It executes ``pgpool_enqueue``, which runs with the caller's
  privileges (SECURITY INVOKER), so it adds no right the INSERT grant lacks: it lets an
  application enqueue from SQL; and ``pgpool_enqueue_group`` (`pgpool.group`), which runs
  as the tables' owner and makes a whole new group (its callback, its members and its
  row) and nothing else. It cannot change a job once enqueued, nor write what only a
  dispatcher writes (owner, lease, attempts, errors, the id), nor a group's id or counts:
  with the schema's insert trigger, which refuses from anyone but the tables' owner a new
  job that is not ready or scheduled or that names a group, it cannot forge a running,
  done, parked or waiting job, nor count a job into another's group. Nor can it write the
  host registry (a fake fresh row there would take budget shares) or the fleet's budget.
- The **worker** role runs ``pgpool run``: it claims, extends, acks and reaps jobs
  (SELECT, UPDATE and DELETE on ``pgpool_jobs``), enqueues the ticks of periodic
  schedules and handlers' follow-ups (INSERT on the producer's columns of
  ``pgpool_jobs``; SELECT, INSERT and UPDATE on ``pgpool_schedules``, whose rows it
  declares and advances), writes dead letters (INSERT on ``pgpool_dead``, and SELECT for
  its ``RETURNING``), keeps its ``pgpool_hosts`` row, takes part in the election of the
  fleet's maintenance leader (``pgpool_leader``), and reads the budget. It adds and uses
  the rows of rate limits (``pgpool_limit_ticks``, and deletes those of tenants or keys
  unused for a day), records its attempts' CPU time per tenant and reads the fleet's
  (``pgpool_tenant_cpu``, for ``--fair-by cpu``; it deletes what is past its window), and
  reads operators' overrides of limits (``pgpool_limits``), which
  only the owner sets (``pgpool limits set``), and the views of the queues' work and the
  limits in force (``pgpool_queue_work``, ``pgpool_limits_in_force``) that the host serving
  the queue's metrics reads. It cannot set
  the budget. It records finished jobs (INSERT on ``pgpool_done``), counts the members of
  groups (UPDATE on ``pgpool_groups``) and makes their callbacks ready (through
  ``pgpool_release_callbacks``, which runs with the caller's privileges: executable by
  every role, as the migration leaves it, and granted here by name so that a database
  that revokes EXECUTE from PUBLIC keeps working), starts the groups a handler asks for
  (through ``pgpool_enqueue_group``), and prunes both.

Neither may change the schema (``pgpool migrate`` needs the schema's owner), nor set the
budget: that is ``pgpool budget set``, run as the owner. Each role's statements start by
revoking what it held on pgpool's tables and functions and CREATE on pgpool's schema (a
role that may create functions there could plant overloads that pgpool's own statements
would call), so applying them twice, or to a role set up with broader grants, leaves
exactly these. (Migrations revoke EXECUTE on pgpool's functions from PUBLIC, PostgreSQL's
default for a new function.)
"""

from __future__ import annotations

from typing import Final

from psycopg import sql as pgsql

from ..sql import install as sql

#: Every pgpool table and view, in the order the statements name them.
TABLES: Final = ("pgpool_jobs", "pgpool_dead", "pgpool_done", "pgpool_groups", "pgpool_hosts",
                 "pgpool_fleet", "pgpool_paused", "pgpool_schedules", "pgpool_schema_version",
                 "pgpool_limit_ticks", "pgpool_limits", "pgpool_leader", "pgpool_tenant_cpu",
                 "pgpool_hosts_wanted", "pgpool_limits_in_force", "pgpool_queue_work")

#: The columns of ``pgpool_jobs`` a producer writes (`pgpool.sql.jobs.ENQUEUE`, `COPY_JOBS_AT`).
PRODUCER_COLUMNS: Final = ("queue, kind, payload, priority, run_at, state, max_attempts, "
                           "unique_key, tenant, concurrency_key, meta")

#: The pgpool functions a role may be granted, by signature: enqueue one job, start a group,
#: make the callbacks of complete groups ready.
ENQUEUE_FUNCTION: Final = ("pgpool_enqueue(text, jsonb, text, integer, timestamptz, interval, "
                           "text, integer, text, text)")
GROUP_FUNCTION: Final = ("pgpool_enqueue_group(text, jsonb, text, integer, timestamptz, "
                         "integer, text, text, text, jsonb, text, integer, integer, text, text)")
RELEASE_FUNCTION: Final = "pgpool_release_callbacks(bigint[])"
FUNCTIONS: Final = (ENQUEUE_FUNCTION, GROUP_FUNCTION, RELEASE_FUNCTION)

#: (privileges, tables) per role.
APP: Final = (
    ("SELECT", TABLES),
    (f"INSERT ({PRODUCER_COLUMNS})", ("pgpool_jobs",)),
)
WORKER: Final = (
    # The views: the host that serves the queue's metrics reads them (pgpool.host.metrics).
    ("SELECT", ("pgpool_fleet", "pgpool_paused", "pgpool_schema_version", "pgpool_limits",
                "pgpool_limits_in_force", "pgpool_queue_work")),
    # INSERT: the ticks of periodic schedules (`pgpool.schedules`), as a producer writes.
    (f"SELECT, INSERT ({PRODUCER_COLUMNS}), UPDATE, DELETE", ("pgpool_jobs",)),
    ("SELECT, INSERT, UPDATE", ("pgpool_schedules",)),
    # The rings of rate limits: the hosts add their kinds' rows, and claims use them; the
    # maintenance leader deletes the rings of tenants or keys unused for a day.
    ("SELECT, INSERT, UPDATE, DELETE", ("pgpool_limit_ticks",)),
    # Fairness by CPU time: the hosts add their attempts' CPU to it, and claims read it;
    # the maintenance leader deletes the buckets past its window.
    ("SELECT, INSERT, UPDATE, DELETE", ("pgpool_tenant_cpu",)),
    ("SELECT, INSERT, UPDATE, DELETE", ("pgpool_hosts",)),
    # UPDATE: the election of the fleet's maintenance leader (INSERT: its row, if deleted).
    ("SELECT, INSERT, UPDATE", ("pgpool_leader",)),
    # DELETE: dead-letter retention (`pgpool.host.parts.retention`) runs on the hosts, and so
    # does the retention of finished jobs and groups.
    ("SELECT, INSERT, DELETE", ("pgpool_dead", "pgpool_done")),
    # UPDATE: the acks count members (pgpool_enqueue_group starts a handler's groups).
    ("SELECT, UPDATE, DELETE", ("pgpool_groups",)),
)
#: The functions each role executes.
APP_FUNCTIONS: Final = (ENQUEUE_FUNCTION, GROUP_FUNCTION)
WORKER_FUNCTIONS: Final = (GROUP_FUNCTION, RELEASE_FUNCTION)


def statements(schema: str, *, app: str | None = None,
               worker: str | None = None) -> list[pgsql.Composed]:
    """The statements that give ``app`` and ``worker`` (either may be None) exactly their
    privileges on the pgpool tables in ``schema``."""
    out: list[pgsql.Composed] = []
    for role, grants, executes in ((app, APP, APP_FUNCTIONS),
                                   (worker, WORKER, WORKER_FUNCTIONS)):
        if role is None:
            continue
        who = pgsql.Identifier(role)
        out.append(pgsql.SQL(sql.REVOKE_TABLES).format(tables=_tables(schema, TABLES),
                                                       role=who))
        out.append(pgsql.SQL(sql.REVOKE_FUNCTIONS).format(
            functions=_functions(schema, FUNCTIONS), role=who))
        out.append(pgsql.SQL(sql.REVOKE_CREATE).format(schema=pgsql.Identifier(schema),
                                                       role=who))
        out.append(pgsql.SQL(sql.GRANT_SCHEMA).format(schema=pgsql.Identifier(schema),
                                                      role=who))
        for privileges, tables in grants:
            out.append(pgsql.SQL(sql.GRANT_TABLES).format(
                privileges=pgsql.SQL(privileges), tables=_tables(schema, tables), role=who))
        out.append(pgsql.SQL(sql.GRANT_FUNCTIONS).format(
            functions=_functions(schema, executes), role=who))
    return out


def _tables(schema: str, tables: tuple[str, ...]) -> pgsql.Composed:
    return pgsql.SQL(", ").join(pgsql.Identifier(schema, t) for t in tables)


def _functions(schema: str, functions: tuple[str, ...]) -> pgsql.Composed:
    return pgsql.SQL(", ").join(pgsql.Identifier(schema) + pgsql.SQL("." + f)
                                for f in functions)
