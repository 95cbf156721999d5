"""tests/unit/ holds the tests that need no database: one asking for it (through `dsn`,
`db` or any fixture on the suite's server) belongs beside what it exercises instead."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_database(request: pytest.FixtureRequest) -> None:
    assert "server_dsn" not in request.fixturenames, (
        "a test of tests/unit/ asks for the database: move it to the folder of what it "
        "exercises (tests/db, tests/host, tests/api, tests/cli or tests/web)")
