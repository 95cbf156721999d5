"""What every audience of pgpool's SQL shares: the installation's LISTEN/NOTIFY channel,
the payloads said on it besides queue names, and `int_array`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final


def int_array(values: Iterable[int]) -> str:
    """A PostgreSQL array literal of integers, e.g. ``{1,2,3}``, for a ``::bigint[]`` or
    ``::int[]`` parameter (integers need no quoting)."""
    return "{" + ",".join(map(str, values)) + "}"


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

#: Format with the channel `CHANNEL` returned, quoted (`listen_statement`).
LISTEN: Final = "LISTEN {}"


def listen_statement(channel: str) -> str:
    """``LISTEN`` on ``channel`` (as `CHANNEL` returns it), quoted as an identifier: a
    schema name may hold any character."""
    return LISTEN.format('"' + channel.replace('"', '""') + '"')

#: The notification payload that tells every host's stager (`pgpool.parts.stager`) to read the
#: next due time now: a job was scheduled that may be due before the time it knew. No queue
#: name starts with "!".
STAGE: Final = "!stage"

#: The payload of the notification that tells every host to re-read
#: `pgpool.sql.fleet.CONTROL_POLL` now (a queue was paused or resumed, a job cancelled). No
#: queue name starts with "!".
CONTROL: Final = "!control"
