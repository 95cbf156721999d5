"""Waiting for a condition, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def wait_until(check: Callable[[], object], what: str, timeout: float = 30,
               interval: float = 0.02) -> Any:
    """Poll ``check`` every ``interval`` seconds until it returns something truthy, and
    return that; fail naming ``what`` after ``timeout`` seconds. ``check`` must not block
    (a database query or a file read; to wait for a log line use `Pgpool.event`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
