"""A job as its producer chooses it (`JobOptions`: where, when and how it runs) and as a
handler (and a hook) sees it (`JobInfo`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, TypedDict

from .errors import ConfigError
from .names import check_name

#: Longest delay, in seconds: 100 years.
MAX_DELAY_SECONDS: Final = 100 * 366 * 86400
#: Longest tenant or concurrency key, in characters: both are index keys, and a btree
#: entry must fit in a third of a page.
MAX_KEY_CHARS: Final = 200
_INT4_MAX: Final = 2**31 - 1


@dataclass(frozen=True, slots=True)
class JobOptions:
    """A job's options, the keywords of `pgpool.enqueue`, as every enqueue path takes them
    (one job, COPY, the SQL function, groups, follow-ups, the integrations). Checked once,
    when made: a bad value raises `ConfigError` naming it.

    ``delay`` (seconds, or a timedelta) is kept in seconds. `columns` is the one place
    options become the jobs table's columns.
    """

    queue: str = "default"
    priority: int = 0
    run_at: datetime | None = None
    delay: float | timedelta | None = None
    unique_key: str | None = None
    max_attempts: int | None = None
    tenant: str | None = None
    concurrency_key: str | None = None

    def __post_init__(self) -> None:
        check_name("queue", self.queue)
        priority, run_at, max_attempts = self.priority, self.run_at, self.max_attempts
        if not isinstance(priority, int) or isinstance(priority, bool) or abs(priority) > _INT4_MAX:
            raise ConfigError(f"priority must be an integer within ±{_INT4_MAX}, got {priority!r}")
        if run_at is not None:
            if not isinstance(run_at, datetime):
                raise ConfigError(f"run_at must be a datetime, got {type(run_at).__name__}")
            if run_at.tzinfo is None or run_at.utcoffset() is None:
                raise ConfigError(
                    "run_at is a naive datetime, which is ambiguous: pass a timezone-aware "
                    "one, e.g. datetime.now(timezone.utc) + timedelta(minutes=5)"
                )
        if max_attempts is not None and (
            not isinstance(max_attempts, int) or isinstance(max_attempts, bool)
            or not 0 < max_attempts <= _INT4_MAX
        ):
            raise ConfigError(f"max_attempts must be a positive integer, got {max_attempts!r}")
        if self.delay is not None:
            object.__setattr__(self, "delay", _delay_seconds(run_at, self.delay))
        unique_key = self.unique_key
        if unique_key is not None and (not isinstance(unique_key, str) or not unique_key):
            raise ConfigError("unique_key must be a non-empty string or None")
        if unique_key is not None and "\x00" in unique_key:
            raise ConfigError("unique_key must not contain NUL characters")
        _check_group("tenant", self.tenant)
        _check_group("concurrency_key", self.concurrency_key)

    @classmethod
    def of(cls, options: Mapping[str, Any], *, over: JobOptions | None = None,
           allowed: frozenset[str] | None = None, what: str = "enqueue") -> JobOptions:
        """Options from keywords (``options``), those not given taken from ``over`` (the
        defaults otherwise). A name that is not an option, or not among ``allowed``, is a
        `ConfigError` saying what ``what`` takes."""
        names = NAMES if allowed is None else allowed
        unknown = set(options) - names
        if unknown:
            raise ConfigError(f"{what} takes {', '.join(sorted(names))}, not "
                              f"{', '.join(sorted(unknown))}")
        if over is None:
            return cls(**options)
        return dataclasses.replace(over, **options) if options else over

    def columns(self) -> dict[str, Any]:
        """The jobs table's columns for these options, as the insert statements take them
        (`pgpool.sql.jobs.ENQUEUE` and its kin): ``tenant`` '' for jobs without one (the
        fairness group of all of them), ``delay`` in seconds, 0 for none."""
        delay = self.delay  # seconds once made (a timedelta is converted)
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay or 0.0
        return {"queue": self.queue, "priority": self.priority, "run_at": self.run_at,
                "delay": seconds, "unique_key": self.unique_key,
                "max_attempts": self.max_attempts, "tenant": self.tenant or "",
                "concurrency_key": self.concurrency_key}

    def for_many(self, what: str) -> JobOptions:
        """These options, for many jobs given at once (COPY, a group's members): refused
        with a `ConfigError` when they hold a unique key (COPY does not deduplicate) or a
        delay (give ``run_at``)."""
        if self.unique_key is not None:
            raise ConfigError(f"{what} cannot apply a unique_key (COPY does not deduplicate): "
                              "enqueue such jobs one by one")
        if self.delay is not None:
            raise ConfigError(f"{what} takes run_at, not delay")
        return self


#: Every option's name.
NAMES: Final = frozenset(f.name for f in dataclasses.fields(JobOptions))
#: The options of many jobs given at once (`JobOptions.for_many`).
MANY: Final = NAMES - {"unique_key", "delay"}


class EnqueueOptions(TypedDict, total=False):
    """The options of one job, as keywords (`pgpool.enqueue`, `Handler.enqueue` and the
    integrations' ``enqueue``): `JobOptions`'s fields, for a type checker."""

    queue: str
    priority: int
    run_at: datetime | None
    delay: float | timedelta | None
    unique_key: str | None
    max_attempts: int | None
    tenant: str | None
    concurrency_key: str | None


class ManyOptions(TypedDict, total=False):
    """The options of many jobs given at once (`pgpool.enqueue_many`,
    `Handler.enqueue_many`): those of `MANY`."""

    queue: str
    priority: int
    run_at: datetime | None
    max_attempts: int | None
    tenant: str | None
    concurrency_key: str | None


def _delay_seconds(run_at: datetime | None, delay: float | timedelta) -> float:
    if run_at is not None:
        raise ConfigError("pass either run_at or delay, not both")
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if (
        not isinstance(seconds, int | float) or isinstance(seconds, bool)
        or not math.isfinite(seconds) or not 0 <= seconds <= MAX_DELAY_SECONDS
    ):
        raise ConfigError(
            f"delay must be a number of seconds from 0 to {MAX_DELAY_SECONDS:,} (100 years), "
            f"got {delay!r}"
        )
    return float(seconds)


def _check_group(what: str, value: str | None) -> None:
    """A tenant or concurrency key: None, or a non-empty string of at most `MAX_KEY_CHARS`."""
    if value is None:
        return
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_CHARS or "\x00" in value:
        raise ConfigError(
            f"{what} must be None or a non-empty string of at most {MAX_KEY_CHARS} characters "
            f"without NUL, got {value!r:.60}"
        )


@dataclass(frozen=True, slots=True)
class JobInfo:
    """The job the current worker is running, for handlers that want it."""

    id: int
    kind: str
    queue: str
    #: This attempt's number as counted against ``max_attempts`` (1 on the first run). An
    #: attempt cut off by a shutdown, or whose host died before it started, is not counted
    #: (at most three per job), so two attempts may share a number; ``claim`` tells them apart.
    attempt: int
    max_attempts: int
    #: How many times the job has been claimed, this attempt included: unique per attempt.
    claim: int
