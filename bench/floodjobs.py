"""The handler of ``bench/flood.py --serve-flood`` (``--handlers floodjobs``, with bench/ on
the path): the flood's kind, ``flood``, whose jobs do nothing. With it the host that
measures the sensitive kind's pickup also drains the flood, as seed 004's host did."""

from __future__ import annotations

import pgpool


@pgpool.handler("flood", max_attempts=1)
def flood(payload: dict) -> None:
    """Nothing: the flood's jobs cost the host only their claim and ack."""
