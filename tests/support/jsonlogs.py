"""A ``--log-format json`` log read back: its records, and the events among them."""

from __future__ import annotations

import json
from typing import Any


def log_records(text: str) -> list[dict[str, Any]]:
    """The JSON log records among the lines of ``text`` (other lines are skipped: the
    one-line errors and notices are plain text in both formats)."""
    records = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def events(text: str, name: str) -> list[dict[str, Any]]:
    """The records of the event ``name`` in a ``--log-format json`` log."""
    return [r for r in log_records(text) if r.get("event") == name]


def only_event(text: str, name: str) -> dict[str, Any]:
    """The one record of the event ``name`` (a failure names what was there instead)."""
    found = events(text, name)
    assert len(found) == 1, f"expected one {name!r} event, got {len(found)}:\n{text}"
    return found[0]
