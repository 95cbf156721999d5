"""The arithmetic the bench's figures share: quantiles, and the throughput formula."""

from __future__ import annotations

import statistics


def quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile (0.01 to 0.99, by hundredths) of a sorted, non-empty list; its
    only value if it has one."""
    if len(ordered) < 2:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[round(q * 100) - 1]


def predict(procs: int, batch: int, claim_rtt: float, handle_time: float) -> float:
    """The throughput formula, jobs/s: procs * batch / (claim_rtt + batch * handle_time)."""
    return procs * batch / max(1e-9, claim_rtt + batch * handle_time)
