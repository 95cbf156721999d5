"""Frames on the pipes between the dispatcher and its workers.

A frame is a 4-byte little-endian length and a pickle. Pickle is safe here: both ends are
our own processes, started by the dispatcher, and nothing from the database is unpickled
(payloads travel as the raw JSON bytes PostgreSQL returned).

Messages, dispatcher -> worker:
    ("jobs", [(id, attempt, max_attempts, kind, queue, payload_bytes), ...])
    ("stop",)                      finish the current job, hand back the rest, exit
Messages, worker -> dispatcher:
    ("ready", pid) | ("broken", reason)         once, after importing handler modules
    ("done", id, elapsed) | ("failed", id, error_text, cause, elapsed)   one per job
    ("returned", [ids])            unstarted jobs, answering "stop"
    ("retiring", reason)           leaving between jobs (max tasks, MemoryError): every
                                   job still assigned to it is unstarted, even those sent
                                   after this message, which it never reads
"""

from __future__ import annotations

import os
import pickle
import struct
from typing import Any

_HEADER = struct.Struct("<I")


def encode(message: tuple[Any, ...]) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


class Decoder:
    """Turns a byte stream into messages, however the stream is split."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        buf = self._buf
        buf += data
        out = []
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = _HEADER.unpack_from(buf, pos)
            if len(buf) - pos - 4 < size:
                break
            out.append(pickle.loads(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        del buf[:pos]
        return out


def write_all(fd: int, data: bytes) -> None:
    """Blocking write of a whole frame (worker side)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
