"""Periodic jobs: cron schedules declared in code, each tick enqueued once across the fleet.

A handler module declares a schedule with `periodic` at import, beside its handlers. Every
dispatcher that imports the module runs a periodic part (`pgpool.host.parts.periodic`), which
enqueues each tick exactly once across the hosts that declare the schedule.

After downtime (every host down, or the schedule's part failing), the missed ticks collapse:
by default only the latest due tick is enqueued (``catch_up="latest"``); ``catch_up=N``
enqueues the latest N. Ticks are computed in the schedule's time zone (`zoneinfo`) by
croniter; around DST changes a wall-clock time the clock skips fires once, when the clock
jumps, and in the repeated hour of a fall-back only schedules whose hour field is a wildcard
fire again (fixed-time schedules fire once, as Debian's cron does).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal

from .enqueue import encode_payload
from .errors import HandlerError, PgpoolError
from .names import check_name

# zoneinfo and croniter are imported where used: handler modules import this module in every
# worker process, which never computes a tick.
if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

#: ``catch_up`` after downtime: only the latest due tick.
LATEST: Final = "latest"
#: The largest ``catch_up``: a host enqueues at most this many ticks in one transaction.
MAX_CATCH_UP: Final = 1000
#: Cron aliases whose hour is fixed (they fire once in a repeated fall-back hour).
_FIXED_HOUR_ALIASES: Final = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight"})


@dataclass(frozen=True)
class Schedule:
    """A declared schedule (see `periodic`). ``catch_up`` is a number of ticks (1: latest)."""

    name: str
    cron: str
    kind: str
    payload: dict[str, Any]
    timezone: str
    queue: str
    priority: int
    max_attempts: int | None
    catch_up: int
    tick_key: str | None

    @property
    def zone(self) -> ZoneInfo:
        return zone(self.timezone)

    def definition(self) -> tuple[str, str, str, str]:
        """What ``pgpool_schedules`` records of it, to tell two code versions apart."""
        return self.cron, self.timezone, self.kind, self.queue

    def payload_for(self, tick: datetime) -> dict[str, Any]:
        """The job's payload for ``tick``: the declared one, with the tick (ISO 8601, UTC)
        under ``tick_key``."""
        if self.tick_key is None:
            return self.payload
        return {**self.payload, self.tick_key: tick.astimezone(UTC).isoformat()}

    def due(self, last: datetime, now: datetime) -> list[datetime]:
        """The ticks to enqueue: the latest ``catch_up`` ticks in (``last``, ``now``]."""
        return due_ticks(self.cron, self.zone, last, now, self.catch_up)

    def next_after(self, after: datetime) -> datetime:
        return next_tick(self.cron, self.zone, after)


_schedules: dict[str, Schedule] = {}
#: Off in worker processes: their dispatcher imported the same modules and checked every
#: time zone and cron expression before starting them, and croniter costs ~50 ms of CPU.
_check_times = True


def periodic(
    name: str,
    cron: str,
    *,
    kind: str,
    payload: dict[str, Any] | None = None,
    timezone: str = "UTC",
    queue: str = "default",
    priority: int = 0,
    max_attempts: int | None = None,
    catch_up: int | Literal["latest"] = LATEST,
    tick_key: str | None = "tick",
) -> Schedule:
    """Declare the schedule ``name``: enqueue a job of ``kind`` at every tick of ``cron``.

    Call it at the top level of a handler module (``pgpool run`` imports it on every host).
    ``cron`` has 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds
    last (``"* * * * * */10"``: every 10 s), or is an alias such as ``"@daily"``; it is
    read in ``timezone`` (an IANA name, e.g. ``"Europe/Paris"``), DST included. The job
    gets ``payload`` with the tick time (ISO 8601, UTC) added under ``tick_key`` (None:
    the payload as given), and ``queue``, ``priority`` and ``max_attempts`` as `enqueue`.

    Contract: each tick is enqueued exactly once across every host that declares the
    schedule, while at least one runs. Ticks missed while none ran are not all enqueued:
    ``catch_up="latest"`` enqueues the latest due one, ``catch_up=N`` (1 to
    `MAX_CATCH_UP`) the latest N. A new schedule's first tick is the first after it is
    first declared. ``name`` identifies the schedule across hosts and code versions;
    rename it to start afresh. Raises `HandlerError` naming the schedule and what to fix
    when an argument is invalid, or when ``name`` is declared twice differently.
    """
    what = f"schedule {name!r}"
    try:
        check_name("schedule name", name)
        check_name("kind", kind)
        check_name("queue", queue)
    except PgpoolError as exc:
        raise HandlerError(f"{what}: {exc}") from None
    payload = {} if payload is None else payload
    try:
        encode_payload(payload)
    except PgpoolError as exc:
        raise HandlerError(f"{what}: {exc}") from None
    if tick_key is not None and (not isinstance(tick_key, str) or tick_key in payload):
        raise HandlerError(f"{what}: tick_key {tick_key!r} must be a string that is not "
                           "a key of the payload, or None to leave the payload as given")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise HandlerError(f"{what}: priority must be an integer, got {priority!r}")
    if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
        raise HandlerError(f"{what}: max_attempts must be a positive integer or None")
    ticks = _catch_up(what, catch_up)
    cron = " ".join(cron.split()) if isinstance(cron, str) else cron
    if _check_times:
        _check(what, cron, _zone(what, timezone))
    schedule = Schedule(name, cron, kind, payload, timezone, queue, priority, max_attempts,
                        ticks, tick_key)
    old = _schedules.get(name)
    if old is not None and old != schedule:
        raise HandlerError(f"{what} is declared twice, differently: give one of them "
                           "another name")
    _schedules[name] = schedule
    return schedule


def declared() -> dict[str, Schedule]:
    """A copy of this process's declared schedules: name -> Schedule."""
    return dict(_schedules)


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """Schedules declared inside are forgotten on leaving (`pgpool.registry.isolated`'s
    twin)."""
    kept = dict(_schedules)
    try:
        yield
    finally:
        _schedules.clear()
        _schedules.update(kept)


def skip_time_checks() -> None:
    """In a worker process, before importing handler modules (see ``_check_times``)."""
    global _check_times
    _check_times = False


def _catch_up(what: str, catch_up: object) -> int:
    if catch_up == LATEST:
        return 1
    if (not isinstance(catch_up, int) or isinstance(catch_up, bool)
            or not 1 <= catch_up <= MAX_CATCH_UP):
        raise HandlerError(f"{what}: catch_up must be \"latest\" or a number of ticks from 1 "
                           f"to {MAX_CATCH_UP}, got {catch_up!r}")
    return catch_up


def zone(name: str) -> ZoneInfo:
    """The time zone ``name``: `KeyError` (ZoneInfoNotFoundError) or `ValueError` if there
    is none by that name."""
    from zoneinfo import ZoneInfo

    return ZoneInfo(name)


def _zone(what: str, timezone: object) -> ZoneInfo:
    try:
        if not isinstance(timezone, str):
            raise ValueError(timezone)
        return zone(timezone)
    except (KeyError, ValueError):
        raise HandlerError(
            f"{what}: unknown time zone {timezone!r}: use an IANA name such as "
            "\"UTC\" or \"Europe/Paris\" (install the tzdata package if the system has none)"
        ) from None


def _check(what: str, cron: object, tz: ZoneInfo) -> None:
    """Refuse an expression croniter cannot read, or that never fires."""
    from croniter import CroniterBadDateError, CroniterError

    fix = ('use 5 fields (minute hour day-of-month month day-of-week), 6 with seconds last, '
           'or an alias such as "@daily"')
    if not isinstance(cron, str) or (not cron.startswith("@") and len(cron.split()) not in (5, 6)):
        raise HandlerError(f"{what}: bad cron expression {cron!r}: {fix}")
    try:
        next_tick(cron, tz, datetime.now(UTC))
    except CroniterBadDateError:
        raise HandlerError(f"{what}: cron expression {cron!r} never fires (no date matches "
                           "its day-of-month, month and day-of-week fields): fix them") from None
    except (CroniterError, ValueError, KeyError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise HandlerError(f"{what}: bad cron expression {cron!r} ({reason}): {fix}") from None


# --- ticks --------------------------------------------------------------------------------


def _hour_is_wildcard(cron: str) -> bool:
    if cron.startswith("@"):
        return cron.lower() not in _FIXED_HOUR_ALIASES
    return cron.split()[1].startswith("*")


def _repeated(tick: datetime, zone: ZoneInfo) -> bool:
    """Whether ``tick`` is the second occurrence of its wall-clock time (a fall-back hour)."""
    local = tick.astimezone(zone)
    return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()


def _ticks(cron: str, zone: ZoneInfo, start: datetime, forward: bool) -> Iterator[datetime]:
    """croniter's ticks from ``start`` (UTC), in UTC, without the fall-back repeats that a
    fixed-hour schedule skips."""
    from croniter import croniter

    skip_repeats = not _hour_is_wildcard(cron)
    it = croniter(cron, start.astimezone(zone))
    step = it.get_next if forward else it.get_prev
    while True:
        tick = step(datetime).astimezone(UTC)
        if not (skip_repeats and _repeated(tick, zone)):
            yield tick


def next_tick(cron: str, zone: ZoneInfo, after: datetime) -> datetime:
    """The first tick of ``cron`` strictly after ``after`` (aware), in UTC."""
    for tick in _ticks(cron, zone, after, forward=True):
        if tick > after:
            return tick
    raise AssertionError("unreachable")


def due_ticks(cron: str, zone: ZoneInfo, last: datetime, now: datetime,
              limit: int) -> list[datetime]:
    """The latest ``limit`` ticks in (``last``, ``now``], oldest first: counted back from
    ``now``, so a long gap costs ``limit`` steps, not one per missed tick."""
    found: list[datetime] = []
    if next_tick(cron, zone, last) > now:
        return found
    # croniter's get_prev from ``now`` gives ticks strictly before the whole second of now.
    start = now + timedelta(seconds=1)
    for tick in _ticks(cron, zone, start, forward=False):
        if tick <= last or len(found) == limit:
            break
        if tick <= now:
            found.append(tick)
    return found[::-1]
