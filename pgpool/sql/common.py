"""What every audience of pgpool's SQL shares: the installation's LISTEN/NOTIFY channel,
the payloads said on it besides queue names, and `int_array`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final


def int_array(values: Iterable[int]) -> str:
    """A PostgreSQL array literal of integers, e.g. ``{1,2,3}``, for a ``::bigint[]`` or
    ``::int[]`` parameter (integers need no quoting): a string costs psycopg a fraction of
    what dumping a list does, which inspects every element."""
    return "{" + ",".join(map(str, values)) + "}"


def nullable_int_array(values: Iterable[int | None]) -> str:
    """`int_array`, with None as NULL: ``{1,NULL,3}``."""
    return "{" + ",".join("NULL" if v is None else str(v) for v in values) + "}"


#: The LISTEN/NOTIFY channel of the installation whose ``pgpool_jobs`` is the table with oid
#: ``{table}``: derived from its schema, so installations in different schemas of one
#: database (and the bench's scratch schema) never wake each other. ``pgpool`` for
#: ``public``, as before channels were per schema (a dispatcher of an older pgpool still
#: hears it); else ``pgpool.<schema>``, or ``pgpool.<md5 of the schema>`` when that would
#: pass the 63 bytes a channel name may have. The payload is the queue with new ready work.
CHANNEL_OF: Final = """(
    SELECT CASE WHEN n.nspname = 'public' THEN 'pgpool'
                WHEN octet_length(n.nspname) <= 56 THEN 'pgpool.' || n.nspname
                ELSE 'pgpool.' || md5(n.nspname) END
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.oid = {table})"""

#: The channel of the installation ``search_path`` resolves to: an expression, for the
#: statements that notify it; `CHANNEL` selects it, for `LISTEN`.
OUR_CHANNEL: Final = CHANNEL_OF.format(table="to_regclass('pgpool_jobs')")
CHANNEL: Final = "SELECT " + OUR_CHANNEL

#: The channel on which the installation says that jobs finished (`pgpool.outcomes.wait`
#: listens), apart from the hosts' so that it wakes no host: ``pgpool!done``, then
#: ``.<schema>`` as `CHANNEL_OF` (the md5 past 51 bytes). Empty payloads: a waiter asks again.
OUR_FINISHED_CHANNEL: Final = """(
    SELECT CASE WHEN n.nspname = 'public' THEN 'pgpool!done'
                WHEN octet_length(n.nspname) <= 51 THEN 'pgpool!done.' || n.nspname
                ELSE 'pgpool!done.' || md5(n.nspname) END
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.oid = to_regclass('pgpool_jobs'))"""
FINISHED_CHANNEL: Final = "SELECT " + OUR_FINISHED_CHANNEL

#: Format with the channel `CHANNEL` returned, quoted (`listen_statement`).
LISTEN: Final = "LISTEN {}"


def listen_statement(channel: str) -> str:
    """``LISTEN`` on ``channel`` (as `CHANNEL` returns it), quoted as an identifier: a
    schema name may hold any character."""
    return LISTEN.format('"' + channel.replace('"', '""') + '"')

#: The notification payload that tells every host's stager (`pgpool.host.parts.stager`) to read the
#: next due time now: a job was scheduled that may be due before the time it knew. No queue
#: name starts with "!".
STAGE: Final = "!stage"

#: The payload of the notification that tells every host to re-read
#: `pgpool.sql.fleet.CONTROL_POLL` now (a queue was paused or resumed, a job cancelled). No
#: queue name starts with "!".
CONTROL: Final = "!control"

#: The payload of the notification a maintenance leader sends when it resigns (a clean
#: exit): every host's election part (`pgpool.host.parts.leader`) tries for the lease now
#: rather than at its expiry. No queue name starts with "!".
LEADER: Final = "!leader"

#: How the payload begins by which a host tells its group that it took every job of theirs
#: it saw (`pgpool.host.settle`); its group's signature follows. No queue name starts
#: with "!".
SETTLED: Final = "!settled "

#: How the payload begins by which a host tells its group that more jobs wait than it
#: takes (`pgpool.host.settle`): every idle host of the group claims at once. Its group's
#: signature follows.
WANTED: Final = "!wanted "


#: The CTEs that count the members of groups that finished in a statement, and make a
#: group's callback ready when its last member did: a data-modifying statement's ``WITH``
#: list goes on with ``, members AS (...)``. Format with ``finished``: a query of the
#: (group_id, dead) of the members it finished (moved out of ``pgpool_jobs``, to
#: ``pgpool_done`` or nowhere, or to ``pgpool_dead``). The groups are locked in id order
#: first, so two statements that finish members of the same groups wait for each other
#: instead of deadlocking; the UPDATE then counts on the latest row (READ COMMITTED
#: re-reads a row updated since the statement began), so exactly one statement sees the
#: last member in, and ``state = 'waiting'`` makes the callback ready once. ``called``
#: holds the queue of each callback made ready (`NOTIFY_CALLED`): made ready by the
#: function ``pgpool_release_callbacks`` (migration 19), whose UPDATE takes a snapshot of
#: its own. The statement's snapshot predates the lock on the group it may have waited
#: for: a replay that held it, putting the callback back waiting, committed after the
#: snapshot, and an UPDATE in the statement would not see the callback. A CTE that only
#: selects runs when it is read: the statement must read ``called``.
COUNT_MEMBERS: Final = """, members AS (
    SELECT group_id, count(*) FILTER (WHERE NOT dead) AS done,
           count(*) FILTER (WHERE dead) AS dead
    FROM ({finished}) AS f
    GROUP BY group_id
), locked_groups AS (
    SELECT g.id FROM pgpool_groups AS g
    WHERE g.id IN (SELECT group_id FROM members)
    ORDER BY g.id
    FOR NO KEY UPDATE
), counted AS (
    UPDATE pgpool_groups AS g
    SET done = g.done + m.done, dead = g.dead + m.dead,
        completed_at = coalesce(g.completed_at,
                                CASE WHEN g.done + m.done + g.dead + m.dead >= g.total
                                     THEN now() END)
    FROM members AS m
    WHERE g.id = m.group_id AND g.id IN (SELECT id FROM locked_groups)
    RETURNING g.id, g.completed_at IS NOT NULL AS complete
), called AS (
    SELECT queue
    FROM pgpool_release_callbacks(ARRAY(SELECT id FROM counted WHERE complete)) AS queue
)"""

#: After `COUNT_MEMBERS`: wake the hosts of the callbacks' queues (a column of the final
#: SELECT: how many queues were told).
NOTIFY_CALLED: Final = f"""(SELECT count(pg_notify({OUR_CHANNEL}, queue))
        FROM (SELECT DISTINCT queue FROM called) AS q)"""


def notify_finished(condition: str) -> str:
    """A column of a final SELECT that tells `pgpool.outcomes.wait`'s listeners (on
    `OUR_FINISHED_CHANNEL`) that jobs finished, once, when ``condition`` holds."""
    return (f"(SELECT count(pg_notify({OUR_FINISHED_CHANNEL}, '')) "
            f"FROM (SELECT WHERE {condition}) AS f)")
