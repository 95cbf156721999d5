"""The operating filters check their fields where they are made."""

from __future__ import annotations

import pytest

from pgpool import ConfigError, ops


def test_a_filter_is_checked_where_it_is_made() -> None:
    # Nothing to call before using one (the reference shows no `check`), and a bad filter
    # fails where it was written, not in the operation it is given to.
    with pytest.raises(ConfigError, match="conflicting filters"):
        ops.DeadFilter(since=3600, older_than=7200)
    with pytest.raises(ConfigError, match="reason must be one of"):
        ops.DeadFilter(reason="bogus")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no job ids given"):
        ops.DeadFilter(ids=[])
    with pytest.raises(ConfigError, match="state must be one of"):
        ops.JobFilter(state="dead")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="older_than must be a non-negative number"):
        ops.JobFilter(older_than=-1)
    assert ops.DeadFilter().empty and not ops.DeadFilter(kind="charge").empty
