"""Errors a user can act on.

Every `PgpoolError` carries a message that names what is wrong and what to do about it.
The CLI prints it as one line and exits with status 2; library callers can catch the
specific subclass. Messages never include payloads or passwords.
"""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """The gist of an exception for a one-line message: its first line, without libpq's
    "connection to server at ... failed:" preamble or a "FATAL:" prefix."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    line = lines[0] if lines else type(exc).__name__
    if "failed: " in line:
        line = line.rsplit("failed: ", 1)[1]
    return line.removeprefix("FATAL:").strip().rstrip(".")


class PgpoolError(Exception):
    """Base class: a problem the user can fix. ``str(err)`` is the whole explanation."""


class ConfigError(PgpoolError, ValueError):
    """An option, argument or environment variable has an invalid value."""


class ConnectError(PgpoolError):
    """The database could not be reached or refused the connection."""


class SchemaError(PgpoolError):
    """The database's pgpool schema is missing, older or newer than this code."""


class HandlerError(PgpoolError):
    """A handler module failed to import, or handlers were registered incorrectly."""


class GroupNotFound(PgpoolError, LookupError):
    """An id names no group: no group was started with it, or it was pruned."""


class PayloadError(PgpoolError, ValueError):
    """A job payload cannot be stored: not JSON-serialisable, too large, or not an object."""


class PayloadDecodeError(PayloadError):
    """A stored payload does not fit its handler's payload type, so the handler cannot be
    called with it: it was written without the handler's checks (``pgpool_enqueue``, an
    INSERT, an older producer). Workers dead-letter its job at once: no retry changes it."""


class CheckpointError(PgpoolError, ValueError):
    """A checkpoint's state cannot be stored: not JSON-serialisable, or too large. Raised
    in the handler by ``current_job().checkpoint()``; nothing was stored."""
