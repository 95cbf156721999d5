"""Errors an application can cause with `pgpool.enqueue` / `pgpool.enqueue_many` on the
``db`` connection: a clear error, and nothing half-written (no job row, the caller's
transaction still usable), and what goes in comes out. The same for the command line:
tests/cli/test_user_errors.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import psycopg
import pytest
from commands import MARKER
from dbtools import count, has_table, stored_payloads

import pgpool
from pgpool import ConfigError, PayloadError, PgpoolError, SchemaError

# --- library: enqueue -----------------------------------------------------------------------


BAD_PAYLOADS = {
    "set": {"secret": MARKER, "s": {1, 2}},
    "bytes": {"secret": MARKER, "b": b"raw"},
    "list": [MARKER],
    "str": MARKER,
    "none": None,
    "tuple": (MARKER,),
    "nan-nested-list": {"secret": MARKER, "a": [1, [2, float("nan")]]},
    "inf-nested-dict": {"secret": MARKER, "a": {"b": {"c": float("inf")}}},
    "-inf-in-tuple": {"secret": MARKER, "a": [(1.0, float("-inf"))]},
    "lone-surrogate": {"secret": MARKER, "s": "\ud800"},
    "lone-surrogate-key": {"\udfff": MARKER},
    "nul-char": {"secret": MARKER, "s": "a\x00b"},
    "nul-in-key": {"k\x00": MARKER},
    "int-key": {1: MARKER},
    "tuple-key": {(1, 2): MARKER},
    "int-beyond-64-bit": {"secret": MARKER, "n": 2**64},
}


def nested(depth: int) -> dict[str, object]:
    """A payload ``depth`` levels deep (itself the first), alternating objects and arrays."""
    inner: object = MARKER
    for level in range(depth - 1):
        inner = [inner] if level % 2 else {"a": inner}
    return {"secret": inner}


def circular() -> dict[str, object]:
    payload: dict[str, object] = {"secret": MARKER}
    payload["self"] = [payload]
    return payload


def test_enqueue_payload_nesting_limit(db: psycopg.Connection) -> None:
    job = pgpool.enqueue(db, "record", nested(254))
    assert db.execute("SELECT payload = %s::jsonb FROM pgpool_jobs WHERE id = %s",
                      (orjson.dumps(nested(254)).decode(), job)).fetchone() == (True,)
    for payload in (nested(255), nested(5000), circular()):
        with pytest.raises(PayloadError) as info:
            pgpool.enqueue(db, "record", payload)
        assert str(info.value) == (
            "payload is nested more than 254 levels deep (objects and arrays within each "
            "other), or contains itself: flatten it")
    assert count(db) == 1


@pytest.mark.parametrize("case", list(BAD_PAYLOADS))
def test_enqueue_bad_payload(db: psycopg.Connection, case: str) -> None:
    with pytest.raises(PayloadError) as info:
        pgpool.enqueue(db, "record", BAD_PAYLOADS[case])
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, PgpoolError)
    message = str(info.value)
    assert message and "\n" not in message
    assert MARKER not in message, "payload data leaked into the error message"
    assert count(db) == 0


def test_enqueue_many_bad_payloads(db: psycopg.Connection) -> None:
    for case, bad in BAD_PAYLOADS.items():
        with pytest.raises(PayloadError, match=r"payload #1\b") as info:
            pgpool.enqueue_many(db, "record", [{"ok": 0}, bad, {"ok": 2}])
        assert MARKER not in str(info.value), case
        assert count(db) == 0, case
    assert pgpool.enqueue_many(db, "record", [{"ok": 1}]) == 1, "connection left unusable"


def test_payload_size_limit(db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPOOL_MAX_PAYLOAD_BYTES", "100")
    exactly = {"p": "x" * (100 - len(b'{"p":""}'))}
    assert len(orjson.dumps(exactly)) == 100
    over = {"p": "x" * (101 - len(b'{"p":""}'))}
    with pytest.raises(PayloadError, match="100-byte limit"):
        pgpool.enqueue(db, "record", over)
    with pytest.raises(PayloadError, match=r"payload #1\b.*100-byte limit"):
        pgpool.enqueue_many(db, "record", [exactly, over])
    assert count(db) == 0
    assert pgpool.enqueue(db, "record", exactly) is not None
    assert pgpool.enqueue_many(db, "record", [exactly, exactly]) == 2
    assert count(db) == 3


def test_payload_size_limit_misconfigured(db: psycopg.Connection,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("abc", "0", "-1", "", "1.5"):
        monkeypatch.setenv("PGPOOL_MAX_PAYLOAD_BYTES", value)
        with pytest.raises(ConfigError, match="PGPOOL_MAX_PAYLOAD_BYTES"):
            pgpool.enqueue(db, "record", {"a": 1})
        with pytest.raises(ConfigError, match="PGPOOL_MAX_PAYLOAD_BYTES"):
            pgpool.enqueue_many(db, "record", [{"a": 1}])
    assert count(db) == 0


NOW = datetime.now(UTC)

BAD_OPTIONS = {
    "naive-run_at": {"run_at": datetime(2030, 1, 1)},
    "run_at-not-datetime": {"run_at": "2030-01-01T00:00:00Z"},
    "run_at-and-delay": {"run_at": NOW + timedelta(minutes=1), "delay": 5},
    "negative-delay": {"delay": -1},
    "negative-timedelta": {"delay": timedelta(seconds=-1)},
    "nan-delay": {"delay": float("nan")},
    "inf-delay": {"delay": float("inf")},
    "str-delay": {"delay": "5"},
    "bool-delay": {"delay": True},
    "delay-beyond-timestamp-range": {"delay": 1e300},
    "timedelta-beyond-timestamp-range": {"delay": timedelta(days=999_999_999)},
    "priority-too-big": {"priority": 2**31},
    "priority-too-small": {"priority": -(2**31) - 1},
    "priority-bool": {"priority": True},
    "priority-float": {"priority": 1.5},
    "max_attempts-0": {"max_attempts": 0},
    "max_attempts-negative": {"max_attempts": -3},
    "max_attempts-bool": {"max_attempts": True},
    "max_attempts-too-big": {"max_attempts": 2**31},
    "bad-queue": {"queue": "bad queue!"},
    "empty-queue": {"queue": ""},
    "empty-unique_key": {"unique_key": ""},
    "nul-unique_key": {"unique_key": "a\x00b"},
}


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
def test_enqueue_bad_option(db: psycopg.Connection, case: str) -> None:
    with pytest.raises(ConfigError) as info:
        pgpool.enqueue(db, "record", {"secret": MARKER}, **BAD_OPTIONS[case])
    assert isinstance(info.value, ValueError)
    assert MARKER not in str(info.value)
    assert count(db) == 0


def test_enqueue_bad_kind(db: psycopg.Connection) -> None:
    for kind in ("bad kind", "", "x" * 129, "-leading-dash", "ünïcode", 42, None):
        with pytest.raises(ConfigError, match="invalid kind"):
            pgpool.enqueue(db, kind, {"a": 1})  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="invalid kind"):
            pgpool.enqueue_many(db, kind, [{"a": 1}])  # type: ignore[arg-type]
    assert count(db) == 0


def test_enqueue_many_bad_options(db: psycopg.Connection) -> None:
    for case in ("naive-run_at", "run_at-not-datetime", "priority-too-big", "priority-bool",
                 "max_attempts-0", "max_attempts-bool", "bad-queue"):
        with pytest.raises(ConfigError):
            pgpool.enqueue_many(db, "record", [{"a": 1}, {"a": 2}], **BAD_OPTIONS[case])
        assert count(db) == 0, case


def test_bad_payload_keeps_the_callers_transaction(db: psycopg.Connection) -> None:
    # "Validation happens before anything is sent": the caller's transaction goes on.
    with db.transaction():
        pgpool.enqueue(db, "record", {"n": 1})
        with pytest.raises(PayloadError):
            pgpool.enqueue(db, "record", {"n": float("nan")})
        with pytest.raises(ConfigError):
            pgpool.enqueue(db, "record", {"n": 2}, priority=True)
        pgpool.enqueue(db, "record", {"n": 3})
    assert stored_payloads(db) == [{"n": 1}, {"n": 3}]


def test_enqueue_many_bad_payload_keeps_the_callers_transaction(db: psycopg.Connection) -> None:
    # The same promise for the bulk path: a refused batch must not abort the caller's
    # transaction and so lose the rows it already wrote.
    with db.transaction():
        pgpool.enqueue(db, "record", {"n": 1})
        with pytest.raises(PayloadError, match=r"payload #1\b"):
            pgpool.enqueue_many(db, "record", [{"ok": 1}, {"bad": {1}}])
        pgpool.enqueue(db, "record", {"n": 3})
    assert stored_payloads(db) == [{"n": 1}, {"n": 3}]


def test_enqueue_many_one_bad_payload_among_1000_in_a_transaction(
    db: psycopg.Connection,
) -> None:
    payloads: list[object] = [{"i": i} for i in range(1000)]
    payloads[500] = {"i": 500, "bad": {"a", "set"}}
    with pytest.raises(PayloadError) as info, db.transaction():
        pgpool.enqueue_many(db, "record", payloads)
    assert "payload #500" in str(info.value)
    assert count(db) == 0
    # The connection is healthy afterwards.
    assert pgpool.enqueue_many(db, "record", [{"i": i} for i in range(1000)]) == 1000


def test_enqueue_many_bad_payload_after_data_was_streamed(db: psycopg.Connection) -> None:
    # ~8 KB payloads: the first 1 MiB chunks are already on the server when #300 fails.
    pad = "y" * 8000
    payloads: list[object] = [{"i": i, "pad": pad} for i in range(400)]
    payloads[300] = {"i": 300, "pad": pad, "bad": float("nan")}
    with pytest.raises(PayloadError, match=r"payload #300\b"):
        pgpool.enqueue_many(db, "record", payloads)
    assert count(db) == 0


def test_enqueue_many_iterable_that_raises_writes_nothing(db: psycopg.Connection) -> None:
    def payloads():
        for i in range(50):
            if i == 30:
                raise RuntimeError("producer failed")
            yield {"i": i}

    with pytest.raises(RuntimeError, match="producer failed"):
        pgpool.enqueue_many(db, "record", payloads())
    assert count(db) == 0


@pytest.mark.own_schema
def test_enqueue_without_schema(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(SchemaError, match="pgpool migrate"):
            pgpool.enqueue(conn, "record", {"a": 1})
        with pytest.raises(SchemaError, match="pgpool migrate"):
            pgpool.enqueue_many(conn, "record", [{"a": 1}, {"a": 2}])
        assert not has_table(conn, "pgpool_jobs")


# --- nothing corrupted: what goes in comes out ----------------------------------------------


TRICKY = {
    "backslash": "a\\b\\\\c\\",
    "copy-null-marker": "\\N",
    "copy-escapes": "\\t\\n\\r\\.",
    "controls": "tab\tnewline\nreturn\rbell\x07",
    "quotes": "\"'`",
    "unicode": "héllo ☃ 😀 \u2028 \ufeff",
    "nested": [1, -2, 2.5, None, True, False, {"x": [], "y": {}}],
    "u64-max": 2**64 - 1,
    "i64-min": -(2**63),
    "null-only": None,
    "empty-key": {"": "empty key"},
}


def test_tricky_payloads_round_trip(db: psycopg.Connection) -> None:
    payload = dict(TRICKY)
    one = pgpool.enqueue(db, "record", payload)
    assert one is not None
    assert pgpool.enqueue_many(db, "record", [payload, {"only": "\\"}]) == 2
    assert stored_payloads(db) == [payload, payload, {"only": "\\"}]


def test_literal_backslash_u0000_text_is_stored(db: psycopg.Connection) -> None:
    # The six characters \u0000 are ordinary text, not a NUL: refusing them loses data.
    payload = {"path": "C:\\u0000dir", "regex": "\\\\u0000"}
    pgpool.enqueue(db, "record", payload)
    pgpool.enqueue_many(db, "record", [payload])
    assert stored_payloads(db) == [payload, payload]


