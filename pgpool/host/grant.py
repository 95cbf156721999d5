"""Tokens of a rate a host holds between claims, so that most claims under a rate far from
reached read and write no row of its ring.

    ring claim (sql.CLAIM_LIMITED_PLAIN)          granted claims (sql.CLAIM_GRANTED)
    takes its batch from the ring's last row  ->  take up to the tokens left, no ring row,
    and, if that row has room for another          while the server's now() <= until;
    claim, up to `Grants.ask` more of it as         the first that comes back short, or
    tokens: the row is stamped `until`             past `until`, ends the grant
    (now() + hold), the tokens counted in n

Why no window holds more than the rate: every job a grant lets start starts by ``until``
(the granted claim checks the server's clock, as the ring does), and the row is stamped
``until``, so its next episode begins ``per`` seconds after the last job the grant could
start. What a grant costs: its row is out of use ``hold`` seconds longer (at most 5% of
``per``), and tokens its host does not spend in time are lost to the rate. So a host asks
for tokens only while its claims come often enough to spend them: as many claims' worth
as fit in ``hold`` after the claim that asks, at the interval between its last two limited
claims, `MOST_CLAIMS` at most. Only a host whose kind-wide limits are one kind
with a rate and no concurrency limit asks (see `Grants.for_limits`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from ..limits import Limit

#: Seconds a grant lasts at most: enough for a host draining millisecond claims to spend
#: tens of claims' worth, short enough that tokens it cannot spend are not missed.
HOLD = 0.05
#: A grant lasts at most this share of its rate's ``per``: its row is out of use that much
#: longer, so a rate used to the full lets through at least 1 / (1 + HOLD_SHARE) of itself.
HOLD_SHARE = 0.05
#: Claims' worth of tokens a host asks for at most.
MOST_CLAIMS = 32


@dataclass
class Grant:
    """Tokens of a kind's rate its host may still start, by ``until`` (the server's
    clock), which is no earlier than ``expires`` (this host's monotonic clock)."""

    tokens: int
    until: datetime
    expires: float

    def take(self, limit: int, now: float) -> int:
        """Reserve up to ``limit`` tokens for a claim starting at ``now`` (none once
        expired): two claims in flight never hold the same token. Give back what the
        claim did not use with `give_back`."""
        if now >= self.expires:
            return 0
        taken = min(self.tokens, limit)
        self.tokens -= taken
        return taken

    def give_back(self, tokens: int) -> None:
        self.tokens += tokens


class Grants:
    """The grant a host's limited claims spend (`Grant`), and how many tokens its next
    ring claim asks for."""

    def __init__(self, hold: float) -> None:
        #: Seconds a grant lasts (0: this host asks for none).
        self.hold = hold
        self.current: Grant | None = None
        #: When the last limited claim started (monotonic seconds).
        self._last = -math.inf
        #: A ring claim that asked for tokens is in flight: the other claim loop's claims
        #: ask for none meanwhile, so that no grant replaces another with tokens left.
        self._asking = False

    @classmethod
    def for_limits(cls, limits: list[Limit]) -> Grants:
        """The grants of a host whose kind-wide limits are ``limits``: none unless they are
        one rate without a concurrency limit (a slot per job has no tokens to grant)."""
        if len(limits) != 1 or limits[0].rate is None or limits[0].concurrency is not None:
            return cls(0.0)
        return cls(min(HOLD, HOLD_SHARE * limits[0].per))

    def ask(self, limit: int, now: float) -> int:
        """Tokens the ring claim of ``limit`` starting at ``now`` asks for: the claims of
        ``limit`` that fit in `hold` after it, at the interval since the last limited
        claim started."""
        interval = now - self._last
        self._last = now
        live = self.current is not None and self.current.tokens and now < self.current.expires
        if not self.hold or interval <= 0 or self._asking or live:
            return 0
        claims = min(MOST_CLAIMS, math.ceil(self.hold / interval) - 1)  # k * interval < hold
        self._asking = claims > 0
        return limit * max(claims, 0)

    def claimed(self, now: float) -> None:
        """A granted claim started at ``now``: the interval `ask` sizes from counts it."""
        self._last = now

    def answered(self, asked: int, tokens: int, until: datetime | None, started: float
                 ) -> None:
        """The ring claim started at ``started``, which asked for ``asked`` tokens, was
        granted ``tokens`` until ``until`` (0 and None: none, or it failed)."""
        if asked:
            self._asking = False
        if tokens > 0 and until is not None:
            self.current = Grant(tokens, until, started + self.hold)
