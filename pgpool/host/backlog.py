"""The pool's backlog: claimed jobs not yet sent to a worker, and the order they go in.

::

    add(jobs) ────────▶ _levels[priority][(queue, kind)]: deque[Job]
                           │ popleft(): the highest priority first; in it, the pairs
                           │ in turns (one job of each, then the next of each...);
                           │ each pair's jobs first in, first out
    add_first(jobs) ──▶ _first: deque[Job] ── before all of them ──▶ `WorkerPool._assign`

Why turns, and not the order the claims came back in: a host holds up to two batches
ahead of its workers (`pgpool.host.scheduler`), so a job claimed behind a flood of another
kind would wait for both batches, 80 ms of no-op jobs at a batch of 400 (``python
bench/flood.py --serve-flood``). The claim already takes each batch in turns across its
(queue, kind) pairs (`pgpool.sql.jobs.CLAIM_PLAIN`); the backlog keeps the turns across
batches, and a job of a higher priority goes before the jobs of lower ones claimed
earlier. ``add_first`` is for jobs that must go next whatever their kind: those holding a
fleet-wide limit's slot, and a dead worker's unstarted jobs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator

from .attempt import Job


class Backlog:
    """Claimed jobs waiting for a worker, taken by priority, then in turns across (queue,
    kind) pairs, then first in first out."""

    def __init__(self) -> None:
        self._first: deque[Job] = deque()
        #: Per priority, per (queue, kind) in turn order: each pair's jobs in claim order.
        self._levels: dict[int, dict[tuple[str, str], deque[Job]]] = {}
        #: The highest priority's pairs, and the jobs of the pair whose turn it is (the
        #: first of them): what `popleft` takes from without a look-up, once per job.
        self._top: dict[tuple[str, str], deque[Job]] = {}
        self._head: deque[Job] = deque()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Job]:
        """Every job, in no particular order."""
        yield from self._first
        for level in self._levels.values():
            for jobs in level.values():
                yield from jobs

    def kinds(self) -> frozenset[str]:
        """The kinds with a job waiting."""
        waiting = {kind for level in self._levels.values() for _, kind in level}
        waiting.update(job.kind for job in self._first)
        return frozenset(waiting)

    def add(self, jobs: Iterable[Job]) -> None:
        """Queue ``jobs``, each behind the jobs of its (queue, kind) pair and priority."""
        levels = self._levels
        priority, pair, waiting = None, None, self._head
        added = 0
        for job in jobs:
            # A claim's jobs come in runs of one pair and priority: one look-up a run.
            if job.priority != priority or (job.queue, job.kind) != pair:
                priority, pair = job.priority, (job.queue, job.kind)
                level = levels.get(priority)
                if level is None:
                    level = levels[priority] = {}
                waiting = level.get(pair)
                if waiting is None:
                    waiting = level[pair] = deque()
            waiting.append(job)
            added += 1
        self._len += added
        self._find_head()

    def add_first(self, jobs: list[Job]) -> None:
        """Queue ``jobs``, in their order, before every job queued."""
        self._first.extendleft(reversed(jobs))
        self._len += len(jobs)

    def peek(self) -> Job:
        """The job `popleft` would take; IndexError if empty."""
        if self._first:
            return self._first[0]
        if not self._head:
            raise IndexError("peek from an empty backlog")
        return self._head[0]

    def popleft(self) -> Job:
        """Take the next job; IndexError if empty."""
        if self._first:
            self._len -= 1
            return self._first.popleft()
        head = self._head
        if not head:
            raise IndexError("pop from an empty backlog")
        job = head.popleft()
        self._len -= 1
        top = self._top
        if head:
            if len(top) > 1:  # its next job waits for one of each other pair's
                pair = (job.queue, job.kind)
                del top[pair]
                top[pair] = head
                self._head = next(iter(top.values()))
        else:
            del top[(job.queue, job.kind)]
            if top:
                self._head = next(iter(top.values()))
            else:
                del self._levels[max(self._levels)]
                self._find_head()
        return job

    def take_all(self) -> list[Job]:
        """Every job, emptying the backlog."""
        jobs = list(self)
        self._first.clear()
        self._levels.clear()
        self._len = 0
        self._find_head()
        return jobs

    def keep(self, wanted: Callable[[Job], bool]) -> None:
        """Drop the jobs ``wanted`` refuses, keeping the others' order."""
        self._first = deque(job for job in self._first if wanted(job))
        levels = {}
        for priority, level in self._levels.items():
            pairs = {pair: kept for pair, jobs in level.items()
                     if (kept := deque(job for job in jobs if wanted(job)))}
            if pairs:
                levels[priority] = pairs
        self._levels = levels
        self._len = len(self._first) + sum(len(jobs) for level in levels.values()
                                           for jobs in level.values())
        self._find_head()

    def _find_head(self) -> None:
        """Point `_top` and `_head` at what goes next. (No pair nor priority in ``_levels``
        is ever empty: `popleft` drops them as it empties them.)"""
        levels = self._levels
        self._top = levels[max(levels)] if levels else {}
        self._head = next(iter(self._top.values())) if self._top else deque()
