"""A real worker process whose pipes a test holds, as the pool would (`RawWorker`)."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import select
import signal
import time
from collections import deque

import pytest

from pgpool.worker import ipc
from pgpool.worker import main as worker


def item(job_id: int, kind: str, payload: object = None, attempt: int = 1) -> ipc.WorkItem:
    return ipc.WorkItem(job_id, attempt, 0, 1, kind, "default",
                        json.dumps(payload or {}).encode(), math.inf)


class RawWorker:
    """A real worker process (`pgpool.worker.main`, handlers from
    tests/handlers/testjobs.py) whose pipes the test holds, as the pool would: to send a
    message at a moment the pool's own timing cannot be made to reach. It reads the result
    pipe whenever it waits for a message, so it needs no doorbell to read them; `rings`
    says how often the worker rang it."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        task_r, self._tasks = ctx.Pipe(duplex=False)
        self._results, result_w = ctx.Pipe(duplex=False)
        self._bell, bell_w = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=worker.main, daemon=True,
                                   args=(0, ["testjobs"], task_r, result_w, bell_w,
                                         os.getpid()))
        self.process.start()
        task_r.close()
        result_w.close()
        bell_w.close()
        self._decoder = ipc.Decoder()
        self._messages: deque[ipc.Message] = deque()
        assert isinstance(self.receive(), ipc.Ready)

    def send(self, *messages: ipc.ToWorker) -> None:
        """``messages`` in one write: the worker's reader takes them in one read, and acts on
        each before it waits for more."""
        view = memoryview(b"".join(ipc.encode(m) for m in messages))
        while view:  # the raw frames, as the pool's transport writes them
            view = view[os.write(self._tasks.fileno(), view):]

    def receive(self, timeout: float = 30) -> ipc.Message | None:
        """The next message it writes; None once its result pipe is closed (it exited)."""
        deadline = time.monotonic() + timeout
        fd = self._results.fileno()
        while not self._messages:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                pytest.fail(f"the worker wrote nothing for {timeout}s")
            data = os.read(fd, 1 << 16)
            if not data:
                return None
            self._messages.extend(self._decoder.feed(data))
        return self._messages.popleft()

    def close(self) -> None:
        if self.process.exitcode is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.join(10)
        self._tasks.close()
        self._results.close()
        self._bell.close()

    def rings(self) -> int:
        """How many times the worker rang its doorbell since the last call."""
        fd = self._bell.fileno()
        rung = 0
        while select.select([fd], [], [], 0)[0]:
            got = len(os.read(fd, 1 << 16))
            if not got:
                break
            rung += got
        return rung
