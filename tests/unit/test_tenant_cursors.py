"""The fair claim's cursors as the claimer keeps them (`pgpool.host.claimer.TenantCursors`):
which tenants' cursors a claim sends, in what order, and when a quiet tenant's is dropped.
"""

from __future__ import annotations

import pytest

from pgpool.host import claimer
from pgpool.sql.jobs import TENANT_SKIPS


def row(id_: int, tenant: str, queue: str = "default", kind: str = "k") -> tuple:
    """A claimed job's row as the fair claim returns it (id, kind, queue, ..., tenant,
    priority, ..., run_at in µs)."""
    return (id_, kind, queue, 1, 0, 20, b"{}", 0.0, tenant, 0, 0, None, None, 1000 + id_)


def test_a_claim_sends_the_cursors_its_walk_may_visit_in_tenant_order() -> None:
    cursors = claimer.TenantCursors()
    names = [f"t{i:03d}" for i in range(300)]
    cursors.move([row(i, name) for i, name in enumerate(names)], limit=300)
    cursors.move([row(1000, "x", kind="other")], limit=1)
    # After t249, a walk of 50 may visit TENANT_SKIPS + 50 tenants: t250..t299, then
    # round to t000..t099; sent in tenant order, pair by pair (kinds inner).
    params = cursors.tenant_params(["default"], ["k", "other"], "t249", 50, sweep=False)
    window = names[:TENANT_SKIPS] + names[250:]
    assert params["cursor_tenants"] == [*window, "x"]
    assert params["cursor_pairs"] == "{" + ",".join(["1"] * len(window) + ["2"]) + "}"
    assert params["cursor_ids"] == "{" + ",".join(
        [str(names.index(t)) for t in window] + ["1000"]) + "}"
    assert cursors.tenant_params(["default"], ["k"], "t249", 50, sweep=True) == {}


def test_a_tenant_quiet_for_a_minute_loses_its_cursor(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    clock = [100.0]
    monkeypatch.setattr(claimer.time, "monotonic", lambda: clock[0])
    cursors = claimer.TenantCursors()
    cursors.move([row(1, "a"), row(2, "b")], limit=50)
    clock[0] += claimer.TENANT_CURSOR_KEPT / 2
    cursors.move([row(3, "b")], limit=50)
    clock[0] += claimer.TENANT_CURSOR_KEPT / 2 + 1
    cursors.move([row(4, "c")], limit=50)
    params = cursors.tenant_params(["default"], ["k"], "", 50, sweep=False)
    assert params["cursor_tenants"] == ["b", "c"]
    assert params["cursor_ids"] == "{3,4}"


def test_claims_sweep_while_sweeps_cost_no_more_than_claims_from_the_cursors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(claimer.time, "monotonic", lambda: clock[0])
    cursors = claimer.TenantCursors()

    def claim(took: float) -> bool:
        """One claim that took ``took`` seconds, full: whether it swept."""
        started = clock[0]
        sweep = cursors.sweep_due(started)
        clock[0] += took
        cursors.ran(sweep, started)
        cursors.move([row(int(clock[0] * 1000), "a")], limit=1)
        clock[0] += 0.001
        return sweep

    # The first claim sweeps (no cursor yet), the second reads from the cursors (what do
    # they cost?), and the third sweeps again (what does a sweep cost? its first round
    # trip, which prepared the statement, is not counted).
    assert [claim(0.004), claim(0.005), claim(0.004)] == [True, False, True]
    # A clean table: sweeps cost no more, so every claim sweeps, but one a second
    # (SWEEP_EVERY) from the cursors, to know what those cost now.
    swept = [claim(0.004) for _ in range(300)]
    assert 1 <= swept.count(False) <= 3 and swept[0]
    # Behind a pin, sweeps cost more with every dead row: claims go by the cursors, and a
    # sweep comes once a second while they come back full.
    clock[0] += 1
    claim(0.040)  # a sweep, due (a second since the last): it costs ten times more now
    from_cursors = [claim(0.004) for _ in range(150)]
    assert from_cursors.count(True) <= 1
