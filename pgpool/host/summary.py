"""The host's periodic summary of the jobs it ran (``pgpool run --log-summary``): one INFO
event, ``summary``, with how many attempts ended in each way since the line before (the
completer's counts: `pgpool.host.completer.Completer.counts`) and each kind's run times,
p50 and p95, so that a host says what it is doing without a line per job.

When: never while nothing happens; at most one line per interval (60 s by default) while
jobs keep ending; and the first line after a quiet spell within a few seconds of its first
job's end (`SETTLE`), so that a host just started, or just handed work after a quiet hour,
shows it ran something at once. The loop looks every `SETTLE` seconds.

Why 60 s by default: a busy host's log gets a line a minute, 1,440 a day (``--log-jobs``
adds one per job: millions a day on a busy host); a minute of jobs of a second or more is
enough for a p95 to mean something; and it is the bucket most log dashboards count by.
Shorter suits a host watched by a person; tests set it to a second.

On the per-job path only the run time is recorded (`RunTimes.add`: appended to its kind's
list, about 100 ns next to the tens of microseconds the dispatcher spends on each job).
The loop folds those lists every few seconds, sampling the long ones (as much again per
job, for a kind past `KEEP` attempts in a fold), so that memory stays bounded at any rate;
the percentiles are exact below that.

The host's ``finished`` event, as it stops, counts the same outcomes under the same names
since it started; the jobs that ended after the last summary are counted there only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Mapping
from typing import Final

from ..horizon import run_time
from ..logs import event

log = logging.getLogger("pgpool.dispatcher")

#: The loop folds the run times and looks whether a line is due this often (at most: the
#: interval, if shorter): the first line after a quiet spell comes within this long.
SETTLE: Final = 5.0
#: The run times a kind keeps per `RunTimes.fold` beyond which they are sampled.
KEEP: Final = 10_000
#: Samples a kind keeps at most between two lines, in `KEEP`-sized sets, before they are
#: merged into one weighted sample of `KEEP`.
MOST_SETS: Final = 8
#: The kinds a text line names at most (the most run first); the JSON event has them all.
TEXT_KINDS: Final = 10
#: The counts a line shows, as `Completer.counts` keys them, in the order of ``finished``.
COUNTS: Final = ("done", "retried", "dead", "discarded", "cancelled", "snoozed", "released",
                 "interrupted", "lost", "parked")


class RunTimes:
    """The run times of the attempts that ended since the last `take`, per kind.

    `add` appends to a list (about 100 ns); `fold`, which the summary's loop calls every
    few seconds, turns a list of more than `KEEP` into a uniform random sample of `KEEP`
    standing for them all, so that memory stays bounded at any rate. The percentiles are
    exact while a kind ends fewer than `KEEP` attempts between two folds, and sampled
    (weighted by what each sample stands for) beyond."""

    def __init__(self) -> None:
        self._fresh: dict[str, list[float]] = {}
        #: Per kind, the samples folded since the last take: (sample, attempts it stands for).
        self._sampled: dict[str, list[tuple[list[float], int]]] = {}

    def add(self, kind: str, seconds: float) -> None:
        """An attempt of ``kind`` ran ``seconds`` (called once per job: keep it cheap)."""
        runs = self._fresh.get(kind)
        if runs is None:
            runs = self._fresh[kind] = []
        runs.append(seconds)

    def fold(self) -> None:
        """Sample the kinds that ran more than `KEEP` attempts since the last fold."""
        for kind in [k for k, runs in self._fresh.items() if len(runs) > KEEP]:
            runs = self._fresh.pop(kind)
            sets = self._sampled.setdefault(kind, [])
            sets.append((random.sample(runs, KEEP), len(runs)))
            if len(sets) > MOST_SETS:  # one sample of them all, each weighed by its share
                values = [v for sample, _ in sets for v in sample]
                weights = [n / len(sample) for sample, n in sets for _ in sample]
                sets[:] = [(random.choices(values, weights, k=KEEP), sum(n for _, n in sets))]

    def take(self) -> dict[str, tuple[int, float, float]]:
        """Per kind, (attempts, p50, p95 in seconds) since the last take; starts afresh."""
        fresh, sampled = self._fresh, self._sampled
        self._fresh, self._sampled = {}, {}
        return {kind: _percentiles(fresh.get(kind, []), sampled.get(kind, []))
                for kind in {**fresh, **sampled}}


def _percentiles(runs: list[float], sets: list[tuple[list[float], int]]
                 ) -> tuple[int, float, float]:
    """(attempts, p50, p95), nearest rank, of ``runs`` and the samples ``sets``, each
    value of a sample weighing what it stands for."""
    if not sets:
        runs.sort()
        n = len(runs)
        return n, runs[math.ceil(0.5 * n) - 1], runs[math.ceil(0.95 * n) - 1]
    weighed = sorted([(v, 1.0) for v in runs]
                     + [(v, n / len(sample)) for sample, n in sets for v in sample])
    total = len(runs) + sum(n for _, n in sets)
    found, seen = [], 0.0
    ranks = iter((0.5 * total, 0.95 * total))
    rank = next(ranks)
    for value, weight in weighed:
        seen += weight
        while seen >= rank - 1e-9:
            found.append(value)
            rank = next(ranks, math.inf)
    found += [weighed[-1][0]] * (2 - len(found))
    return total, found[0], found[1]


class Summary:
    """Logs the ``summary`` event every ``interval`` seconds while jobs end (see the
    module's docstring). ``counts``: the completer's counts since the host started, read at
    each line. The dispatcher records each attempt's run time in ``runs``."""

    name = "summary"

    def __init__(self, interval: float, counts: Mapping[str, int]) -> None:
        self.interval = interval
        self.runs = RunTimes()
        self._counts = counts
        self._before: dict[str, int] = {}
        self._since = time.monotonic()

    async def run(self) -> None:
        """Every `SETTLE` seconds (or interval, if shorter), fold the run times and log a
        line if one is due: jobs ended, and the last line is an interval old. Until
        cancelled."""
        tick = min(SETTLE, self.interval)
        last = -math.inf
        while True:
            await asyncio.sleep(tick)
            self.runs.fold()
            now = time.monotonic()
            # A timer may fire a hair early (uvloop's count milliseconds).
            if now - last >= self.interval - 0.01 * tick and self.line():
                last = now

    def line(self) -> bool:
        """Log the jobs that ended since the last line, if any did; whether it logged."""
        now = time.monotonic()
        counts = self._counts
        # "done" can go down: a success whose outcome the database refused becomes a
        # failure (`Completer._fail_refused_outcomes`).
        c = {k: max(0, counts.get(k, 0) - self._before.get(k, 0)) for k in COUNTS}
        runs = self.runs.take()
        if not runs and not any(c.values()):
            return False
        self._before = {k: counts.get(k, 0) for k in COUNTS}
        seconds, self._since = now - self._since, now
        failed = c["retried"] + c["dead"]
        dead_lettered = c["dead"] + c["discarded"] + c["cancelled"]
        by_runs = sorted(runs.items(), key=lambda item: (-item[1][0], item[0]))
        times = ", ".join(f"{kind} {run_time(p50)}/{run_time(p95)} ({n} run{'s' * (n != 1)})"
                          for kind, (n, p50, p95) in by_runs[:TEXT_KINDS])
        if len(by_runs) > TEXT_KINDS:
            times += f", {len(by_runs) - TEXT_KINDS} more kinds"
        event(log, logging.INFO, "summary", "in the last %s: %s%s", run_time(seconds),
              _counted(c, dead_lettered), f"; run time p50/p95: {times}" if times else "",
              seconds=round(seconds, 3), failed=failed, dead_lettered=dead_lettered, **c,
              run_times={kind: {"runs": n, "p50": round(p50, 6), "p95": round(p95, 6)}
                         for kind, (n, p50, p95) in by_runs})
        return True


def _counted(c: Mapping[str, int], dead_lettered: int) -> str:
    """The counts that are not 0, as ``finished`` words them."""
    parts = [f"{c['done']} succeeded"] if c["done"] else []
    if c["retried"]:
        parts.append(f"{c['retried']} failed and retried later")
    if dead_lettered:
        why = ", ".join(f"{c[k]} {word}" for k, word in (
            ("dead", "failed"), ("discarded", "discarded"), ("cancelled", "cancelled")) if c[k])
        parts.append(f"{dead_lettered} dead-lettered ({why})")
    for key, words in (("snoozed", "snoozed"), ("released", "handed back"),
                       ("interrupted", "cut off by the shutdown"),
                       ("lost", "dropped (lease lost)"), ("parked", "parked")):
        if c[key]:
            parts.append(f"{c[key]} {words}")
    return ", ".join(parts) or "no attempt ended"
