"""Structured events in the logs (placeholder until the logs module lands)."""

from __future__ import annotations

import logging


def event(logger: logging.Logger, level: int, name: str, message: str, *args: object,
          **fields: object) -> None:
    """Log ``message % args`` as event ``name`` with ``fields``."""
    logger.log(level, message, *args, extra={"event": name, "fields": fields})
