"""Example handlers of a derived image (deploy/derived-image)."""

from __future__ import annotations

import hashlib

import pgpool


@pgpool.handler("myjobs.digest")
def digest(payload: dict) -> None:
    """SHA-256 of ``payload["text"]``, checked against ``payload["expect"]`` if given."""
    value = hashlib.sha256(str(payload["text"]).encode()).hexdigest()
    if payload.get("expect") not in (None, value):
        raise ValueError("digest mismatch")
