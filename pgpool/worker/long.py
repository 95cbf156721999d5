"""Long jobs, the worker's side: a handler's checkpoints and progress, and its host's request
to stop (`pgpool.worker.followups.RunningJob`'s ``checkpoint``, ``checkpoint_state``,
``progress`` and ``stopping`` come here).

What crosses the pipes (`pgpool.worker.ipc`), and who answers::

  handler thread                                      dispatcher
  checkpoint(state): JSON, bounded ── Checkpoint ──▶ pool ─▶ UPDATE guarded by owner and
     waits for the answer ◀────────── Stored ◀────── attempt (pgpool.host.long)
     (the inbox thread hands it over: `answer`)
     stopping? raise Interrupted
  checkpoint_state, first read in a later claim ── LoadCheckpoint ──▶ SELECT ── Loaded ──▶
     kept on the attempt
  progress(done, total, note): kept on the attempt;  ── Progress ──▶ kept by the pool, written
     sent at an attempt's first call, then at the       with the next heartbeat
     first call after each `ipc.Extend` (one per beat)

A job that never checkpoints nor reports progress sends none of these: the common path
pays nothing. Frames are written through the attempt's guard (`Guard`: under the lock its
end takes), so none is ever written after the attempt's outcome, nor in
the middle of another frame (a large checkpoint is written in several pieces).

Without a dispatcher (`pgpool.testing` runs handlers in the test's process), checkpoints
are stored on the test's connection under `pgpool.testing.drain`, and kept in this
process, by job id, under `pgpool.testing.run_handler`: a test can run a job, fail it,
and see its next attempt resume.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import orjson

from ..enqueue import has_non_finite, has_nul
from ..errors import CheckpointError, ConfigError
from ..outcomes import load_checkpoint, store_checkpoint
from . import ipc

if TYPE_CHECKING:  # a worker never imports psycopg for its own use
    import psycopg

#: The default bound of a checkpoint's JSON text (``PGPOOL_MAX_CHECKPOINT_BYTES``).
DEFAULT_MAX_CHECKPOINT_BYTES: Final = 1024 * 1024
#: Longest progress note, in characters: longer ones are cut.
MAX_NOTE_CHARS: Final = 200


#: Runs a write while the attempt runs, before it can end, or raises (the attempt has
#: ended): `pgpool.worker.followups.Attempt.while_running`.
Guard = Callable[[Callable[[], None]], None]


class Channel:
    """This worker's end of the long-job messages: requests written to the result pipe
    (``outbox``), their answers handed over by the inbox thread (`answer`)."""

    def __init__(self, outbox: ipc.Outbox) -> None:
        self._outbox = outbox
        self._asking = threading.Lock()  # one request in flight: answers carry a job id only
        self._answered = threading.Condition(threading.Lock())
        self._answer: ipc.Stored | ipc.Loaded | None = None

    def send(self, message: ipc.LongFromWorker) -> None:
        """Write one frame (called through a `Guard`)."""
        self._outbox.send(ipc.encode(message))

    def ask(self, message: ipc.Checkpoint | ipc.LoadCheckpoint,
            guard: Guard) -> ipc.Stored | ipc.Loaded:
        """Send ``message`` (through ``guard``) and wait for its answer. No time limit: the
        fence ends the worker at its lease deadline if none comes (a frozen dispatcher)."""
        with self._asking:
            with self._answered:
                self._answer = None
            guard(lambda: self.send(message))
            with self._answered:
                while self._answer is None or self._answer.id != message.id:
                    self._answered.wait()
                return self._answer

    def answer(self, message: ipc.Stored | ipc.Loaded) -> None:
        """The inbox thread received ``message``: wake the handler waiting for it."""
        with self._answered:
            self._answer = message
            self._answered.notify_all()


#: The worker's channel (`open`); None outside a worker process.
_channel: Channel | None = None
#: Set by the inbox on `ipc.Stop`: the host is stopping (``current_job().stopping``).
stopping = False
#: Set by the inbox on each `ipc.Extend` (after a heartbeat): the next progress is sent.
beat = False
#: Checkpoints kept without a dispatcher (`pgpool.testing`), by job id.
_local: dict[int, bytes] = {}


def open_channel(outbox: ipc.Outbox) -> None:
    """Called once by the worker process: long-job messages go through its ``outbox``."""
    global _channel
    _channel = Channel(outbox)


def answer(message: ipc.Stored | ipc.Loaded) -> None:
    """The inbox thread received the answer to a request."""
    if _channel is not None:
        _channel.answer(message)


def stop() -> None:
    """The inbox thread received `ipc.Stop`."""
    global stopping
    stopping = True


def extended() -> None:
    """The inbox thread received `ipc.Extend`: a heartbeat went by."""
    global beat
    beat = True


@functools.cache
def max_checkpoint_bytes() -> int:
    """A checkpoint's size limit: ``PGPOOL_MAX_CHECKPOINT_BYTES``, default 1 MiB."""
    raw = os.environ.get("PGPOOL_MAX_CHECKPOINT_BYTES")
    try:
        value = DEFAULT_MAX_CHECKPOINT_BYTES if raw is None else int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"PGPOOL_MAX_CHECKPOINT_BYTES={raw!r} is not a positive integer "
                          "number of bytes")
    return value


def encode(state: Any) -> bytes:
    """``state`` as the JSON text a checkpoint stores; `CheckpointError` (one line) when it
    cannot be: not JSON, NaN or Infinity, or over the limit."""
    try:
        data = orjson.dumps(state)
    except orjson.JSONEncodeError as exc:
        raise CheckpointError(
            f"current_job().checkpoint(): a {type(state).__name__} that is not "
            f"JSON-serialisable ({exc}): pass dicts with str keys, lists, str, int, float, "
            "bool or None; nothing was stored") from None
    limit = max_checkpoint_bytes()
    if len(data) > limit:
        raise CheckpointError(
            f"current_job().checkpoint(): {len(data):,} bytes of JSON, over the {limit:,}-byte "
            "limit of a checkpoint: store large data elsewhere and checkpoint a reference, "
            "or raise PGPOOL_MAX_CHECKPOINT_BYTES; nothing was stored")
    if has_nul(data):
        raise CheckpointError(
            "current_job().checkpoint(): a NUL character (\\u0000), which PostgreSQL jsonb "
            "cannot store: remove it; nothing was stored")
    if b"null" in data and has_non_finite(state):
        raise CheckpointError(
            "current_job().checkpoint(): NaN or Infinity, which JSON cannot represent: "
            "store None or a string in their place; nothing was stored")
    return data


def store(job_id: int, claim: int, data: bytes, guard: Guard,
          conn: psycopg.Connection[Any] | None = None) -> str | None:
    """Store checkpoint ``data`` for claim ``claim`` of job ``job_id``; why it was not
    (this attempt no longer holds the job), or None once it is stored. ``conn``: the
    test's connection (`pgpool.testing.drain`), when there is no dispatcher."""
    if _channel is None:
        if conn is None:
            guard(lambda: _local.__setitem__(job_id, data))
            return None
        if not store_checkpoint(conn, job_id, claim, data.decode()):
            return ipc.NOT_HELD
        return None
    reply = _channel.ask(ipc.Checkpoint(job_id, claim, data), guard)
    assert isinstance(reply, ipc.Stored)
    return reply.error


def load(job_id: int, claim: int, guard: Guard,
         conn: psycopg.Connection[Any] | None = None) -> bytes | None:
    """The JSON text of job ``job_id``'s stored checkpoint, or None."""
    if _channel is None:
        if conn is None:
            return _local.get(job_id)
        text = load_checkpoint(conn, job_id)
        return None if text is None else text.encode()
    reply = _channel.ask(ipc.LoadCheckpoint(job_id, claim), guard)
    assert isinstance(reply, ipc.Loaded)
    return reply.state


def send_progress(job_id: int, claim: int, done: float, total: float | None,
                  note: str | None, guard: Guard) -> None:
    """Send a progress report (the caller decided it is time: `beat`)."""
    global beat
    beat = False
    channel = _channel
    if channel is not None:
        guard(lambda: channel.send(ipc.Progress(job_id, claim, done, total, note)))


def check_progress(done: Any, total: Any, note: Any) -> str | None:
    """Why these progress arguments are refused (one line), or None."""
    if not isinstance(done, int | float) or isinstance(done, bool) or done != done:
        return f"done must be a number, got {done!r:.60}"
    if total is not None and (not isinstance(total, int | float) or isinstance(total, bool)
                              or not total >= 0):
        return f"total must be None or a number of 0 or more, got {total!r:.60}"
    if note is not None and not isinstance(note, str):
        return f"note must be None or a str, got {type(note).__name__}"
    return None
