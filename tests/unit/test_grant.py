"""A rate's grant (`pgpool.host.grant`): which hosts ask for tokens, how many, and how two
claims in flight share them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import pgpool
from pgpool.host.grant import HOLD, HOLD_SHARE, MOST_CLAIMS, Grant, Grants

UNTIL = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(("limits", "hold"), [
    ([pgpool.Limit(rate=1000, per=1)], HOLD),
    ([pgpool.Limit(rate=100, per=60)], HOLD),
    ([pgpool.Limit(rate=1000, per=0.2)], HOLD_SHARE * 0.2),  # a short window: a short hold
    ([pgpool.Limit(rate=1000, concurrency=5)], 0.0),  # its slots are per job
    ([pgpool.Limit(concurrency=5)], 0.0),
    ([pgpool.Limit(rate=10), pgpool.Limit(rate=20)], 0.0),  # one claim for both kinds
    ([], 0.0)])
def test_only_a_host_with_one_rate_and_no_concurrency_limit_asks(limits: list[pgpool.Limit],
                                                                  hold: float) -> None:
    assert Grants.for_limits(limits).hold == pytest.approx(hold)


def test_a_host_asks_for_the_claims_that_fit_in_the_hold_at_its_pace() -> None:
    grants = Grants(0.05)
    assert grants.ask(50, 100.0) == 0  # a first claim: no pace known
    assert grants.ask(50, 100.011) == 50 * 4  # 11 ms apart: four more fit in 50 ms
    grants.answered(200, 0, None, 100.011)
    assert grants.ask(50, 100.012) == 50 * MOST_CLAIMS  # 1 ms apart: many, but bounded
    grants.answered(50 * MOST_CLAIMS, 0, None, 100.012)
    assert grants.ask(50, 100.042) == 50  # 30 ms apart: one more fits
    grants.answered(50, 0, None, 100.042)
    assert grants.ask(50, 100.102) == 0  # 60 ms apart: none
    grants.claimed(100.103)  # a granted claim sets the pace too
    assert grants.ask(20, 100.115) == 20 * 4
    assert Grants(0.0).ask(50, 1.0) == 0 and Grants(0.0).ask(50, 1.001) == 0


def test_one_claim_asks_at_a_time_and_none_while_a_grant_has_tokens() -> None:
    grants = Grants(0.05)
    grants.ask(50, 1.0)
    assert grants.ask(50, 1.001) > 0
    assert grants.ask(50, 1.002) == 0  # the other claim loop, while the first is in flight
    grants.answered(50 * MOST_CLAIMS, 0, None, 1.001)  # it was granted nothing
    assert grants.ask(50, 1.003) > 0
    grants.answered(1600, 100, UNTIL, 1.003)
    assert grants.current == Grant(100, UNTIL, 1.053)
    assert grants.ask(50, 1.004) == 0  # tokens left: no grant would replace them
    assert grants.current.take(100, 1.005) == 100
    assert grants.ask(50, 1.006) > 0  # spent
    grants.answered(1600, 300, UNTIL, 1.006)
    grants.claimed(1.059)
    assert grants.ask(50, 1.060) > 0  # expired (at 1.056), tokens left or not


def test_claims_in_flight_share_a_grants_tokens_and_give_back_what_they_did_not_use() -> None:
    grant = Grant(120, UNTIL, expires=10.0)
    first, second = grant.take(50, 1.0), grant.take(50, 1.0)
    assert (first, second, grant.take(50, 1.0)) == (50, 50, 20)
    assert grant.take(50, 1.0) == 0  # none left: no two claims hold one token
    grant.give_back(7)
    assert grant.take(50, 1.0) == 7
    grant.give_back(7)
    assert grant.take(50, 10.0) == 0  # expired: tokens left are not the host's any more
