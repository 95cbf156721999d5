"""Handlers as typed objects: ``@pgpool.handler`` returns a `pgpool.Handler`, callable as the
function, whose enqueue methods carry the kind and its defaults, and whose typed payloads
(TypedDict, dataclass, pydantic model) are checked and encoded at enqueue and decoded in
the worker. A Handler names its kind wherever one is taken (`pgpool.enqueue` and its kin),
with what its own enqueue applies; a typed payload given with the kind's name instead is
refused naming the handler to go through.

Enqueueing runs against the real test database; decoding through a real ``pgpool run
--burst`` whose handlers (tests/handlers/typedjobs.py) pickle what they received.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import pickle
import subprocess
import sys
import textwrap
import uuid
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, NewType, NotRequired, TypedDict

import psycopg
import pytest
import typedjobs
from commands import JSON_LOGS, MARKER, assert_user_error, run_pgpool
from jsonlogs import events
from places import HANDLERS
from psycopg.types.json import Jsonb
from typedjobs import Invoice, Note, Owner, Report, Size, Thumb

import pgpool
from pgpool import registry
from pgpool.testing import Counts, drain

# --- the object ---------------------------------------------------------------------------


def echo(payload: Thumb) -> Thumb:
    return payload


def test_a_handler_is_its_function_with_its_kind_and_defaults() -> None:
    thumb = typedjobs.thumb
    assert isinstance(thumb, pgpool.Handler)
    assert registry.registered()["typed.thumb"] is thumb
    assert (thumb.kind, thumb.fn.__name__, thumb.timeout, thumb.max_attempts) == (
        "typed.thumb", "thumb", None, 1)
    assert (thumb.queue, thumb.priority, thumb.tenant, thumb.unique_key) == (
        "thumbs", 5, "acme", None)
    assert callable(thumb.concurrency_key)
    assert thumb.payload_type is Thumb and typedjobs.report.payload_type is Report
    assert typedjobs.LEGACY.payload_type is None and typedjobs.LEGACY.fn is typedjobs.legacy
    # Called directly, it is the function as written: the payload goes in as given,
    # unchecked, and what it returns comes back.
    with registry.isolated():
        handler = pgpool.handler("typed.echo", timeout=5)(echo)
        assert handler.timeout == 5.0 and handler.__name__ == "echo"
        sent = Thumb(1, Size.SMALL)
        assert handler(sent) is sent
        assert handler({"not": "checked"}) == {"not": "checked"}  # type: ignore[arg-type]


def test_plain_handlers_run_as_before_and_workers_skip_the_type_machinery() -> None:
    # A worker importing only plain handlers never imports pgpool.payloads.
    check = ("import sys, testjobs; "
             "assert 'pgpool.payloads' not in sys.modules, 'payloads imported'; "
             "h = testjobs.record; assert h.payload_type is None")
    done = subprocess.run([sys.executable, "-c", check], cwd=HANDLERS,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# --- what enqueue refuses -------------------------------------------------------------------


@dataclasses.dataclass
class Flat:
    n: int
    ratio: float
    flag: bool
    label: str | None
    when: datetime
    day: date
    ref: uuid.UUID
    kind: Literal["a", "b"]
    tags: list[str]
    scores: dict[str, int]


GOOD_FLAT = dict(n=1, ratio=2, flag=True, label=None, when=datetime(2024, 5, 1, tzinfo=UTC),
                 day=date(2024, 5, 2), ref=uuid.UUID(int=7), kind="a", tags=["x"],
                 scores={"a": 1})


def flat(payload: Flat) -> None:
    pass


REFUSED = {
    "int-as-str": ({"n": "1"}, "field 'n': expected int, got str"),
    "bool-for-int": ({"n": True}, "field 'n': expected int, got bool"),
    "float-as-str": ({"ratio": "2.5"}, "field 'ratio': expected float, got str"),
    "int-for-bool": ({"flag": 1}, "field 'flag': expected bool, got int"),
    "optional": ({"label": 3}, "field 'label': expected str, got int"),
    "str-for-datetime": ({"when": "2024-05-01"}, "field 'when': expected datetime, got str"),
    "datetime-for-date": ({"day": datetime(2024, 5, 2)},
                          "field 'day': expected date, got datetime"),
    "uuid": ({"ref": "not a uuid"}, "field 'ref': expected UUID, got str"),
    "literal": ({"kind": "c"}, "field 'kind': expected 'a' or 'b', got another str"),
    "list-item": ({"tags": ["x", 2]}, "field 'tags[1]': expected str, got int"),
    "dict-value": ({"scores": {"a": "1"}}, "field \"scores['a']\": expected int, got str"),
    "missing": ({"n": dataclasses.MISSING}, "field 'n': missing (required by Flat)"),
    "unknown": ({"m": 1}, "field 'm': not a field of Flat"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_payload_that_does_not_fit_is_refused_naming_the_field(
        db: psycopg.Connection, case: str) -> None:
    change, needle = REFUSED[case]
    payload = {k: v for k, v in {**GOOD_FLAT, **change}.items() if v is not dataclasses.MISSING}
    with registry.isolated():
        handler = pgpool.handler("typed.flat")(flat)
        with pytest.raises(pgpool.PayloadError) as caught:
            handler.enqueue(db, payload)  # type: ignore[arg-type]
        assert handler.enqueue(db, GOOD_FLAT) is not None  # type: ignore[arg-type]
    assert str(caught.value) == f"payload for 'typed.flat': {needle}"
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone() == (1,)


def test_instances_are_checked_too_and_nested_fields_are_named(
        db: psycopg.Connection) -> None:
    cases: list[tuple[Any, str]] = [
        (Thumb(1, "big"), "field 'size': expected Size (a member), got str"),  # type: ignore[arg-type]
        (Thumb(1, Size.SMALL, owner=Owner("ann", ["a", None])),  # type: ignore[list-item]
         "field 'owner.tags[1]': expected str, got None"),
        ({"image_id": 1, "size": Size.SMALL, "owner": {"name": 5}},
         "field 'owner.name': expected str, got int"),
        ([1, 2], "expected Thumb (an instance, or a dict of its fields), got list"),
    ]
    for payload, needle in cases:
        with pytest.raises(pgpool.PayloadError) as caught:
            typedjobs.thumb.enqueue(db, payload)
        assert str(caught.value) == f"payload for 'typed.thumb': {needle}"
    with pytest.raises(pgpool.PayloadError) as caught:
        typedjobs.invoice.enqueue(db, {"invoice_id": "x", "total": 1,  # type: ignore[arg-type]
                                       "issued": datetime.now(UTC)})
    assert str(caught.value).startswith("payload for 'typed.invoice': field 'invoice_id': "
                                        "Input should be a valid integer")
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone() == (0,)


UserId = NewType("UserId", int)
RECEIVED: list[Any] = []


@dataclasses.dataclass
class Node:
    name: str
    children: list[Node] = dataclasses.field(default_factory=list)
    weight: Annotated[int, "grams"] | str = 0
    owner: UserId | None = None
    invoice: Invoice | None = None
    extra: Any = None


def tree(payload: Node) -> None:
    RECEIVED.append(payload)


def flat_received(payload: Flat) -> None:
    RECEIVED.append(payload)


def test_payloads_come_back_from_the_table_as_they_went_in(db: psycopg.Connection) -> None:
    sent = Node("root", [Node("a", weight="heavy"), Node("b", [Node("c", owner=UserId(5))])],
                invoice=Invoice(invoice_id=1, total=2, issued=datetime(2024, 1, 1, tzinfo=UTC)),
                extra={"x": [1, None]})
    RECEIVED.clear()
    with registry.isolated():
        for fn, payload, expected in [
                (tree, sent, sent),
                (flat_received, GOOD_FLAT, Flat(**{**GOOD_FLAT, "ratio": 2.0})),  # type: ignore[arg-type]
        ]:
            handler = pgpool.handler(f"typed.{fn.__name__}")(fn)  # type: ignore[type-var]
            job = handler.enqueue(db, payload)
            stored = db.execute("SELECT payload FROM pgpool_jobs WHERE id = %s",
                                (job,)).fetchone()[0]
            handler.run(stored)  # as a worker does, with the JSON it read
            got = RECEIVED.pop()
            assert got == expected and type(got) is type(expected)


def test_enqueue_refuses_a_bad_payload_and_inserts_nothing(db: psycopg.Connection,
                                                            dsn: str) -> None:
    bad = {"image_id": "x", "size": Size.SMALL}
    with psycopg.connect(dsn) as conn:
        with pytest.raises(pgpool.PayloadError, match="field 'image_id': expected int"):
            typedjobs.thumb.enqueue(conn, bad)  # type: ignore[arg-type]
        # A batch with one bad payload in the middle: none of it, and the caller's
        # transaction goes on.
        good = [Thumb(n, Size.SMALL) for n in range(5)]
        with pytest.raises(pgpool.PayloadError) as caught:
            typedjobs.thumb.enqueue_many(conn, [*good, bad, *good],  # type: ignore[list-item]
                                         concurrency_key=None)
        assert str(caught.value) == ("payload #5 (0-based): payload for 'typed.thumb': "
                                     "field 'image_id': expected int, got str")
        assert typedjobs.thumb.enqueue_many(conn, good, concurrency_key=None) == 5
        conn.commit()
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone() == (5,)


# --- defaults, overrides, keys --------------------------------------------------------------


def test_defaults_and_per_call_overrides_land_in_the_row(db: psycopg.Connection) -> None:
    taken = datetime(2024, 5, 1, 12, tzinfo=UTC)
    first = typedjobs.thumb.enqueue(db, Thumb(7, Size.LARGE, taken=taken))
    second = typedjobs.thumb.enqueue(db, {"image_id": 8, "size": Size.SMALL},
                                     queue="urgent", priority=-1, tenant=None,
                                     concurrency_key="mine", max_attempts=4)
    rows = db.execute(
        "SELECT id, queue, kind, priority, tenant, concurrency_key, max_attempts, payload "
        "FROM pgpool_jobs ORDER BY id").fetchall()
    assert rows == [
        (first, "thumbs", "typed.thumb", 5, "acme", "image-7", None,
         {"image_id": 7, "size": 512, "ratio": 1.0, "owner": None,
          "taken": "2024-05-01T12:00:00+00:00", "day": None, "ref": None, "mode": "fit",
          "meta": {}}),
        # A dict is stored as given (with the enum's value): defaults fill in at decoding.
        (second, "urgent", "typed.thumb", -1, "", "mine", 4, {"image_id": 8, "size": 64}),
    ]


def test_a_unique_key_computed_from_the_payload_deduplicates(db: psycopg.Connection) -> None:
    first = typedjobs.report.enqueue(db, {"report_id": 3, "pages": [1]})
    again = typedjobs.report.enqueue(db, {"report_id": 3, "pages": [2], "format": "csv"})
    other = typedjobs.report.enqueue(db, {"report_id": 4, "pages": []})
    explicit = typedjobs.report.enqueue(db, {"report_id": 3, "pages": []}, unique_key=None)
    assert first is not None and again is None and other is not None and explicit is not None
    assert db.execute("SELECT unique_key FROM pgpool_jobs ORDER BY id").fetchall() == [
        ("report-3",), ("report-4",), (None,)]


def test_enqueue_many_refuses_keys_it_cannot_apply(db: psycopg.Connection) -> None:
    with pytest.raises(pgpool.ConfigError, match="has a unique_key, which enqueue_many "
                       "cannot apply"):
        typedjobs.report.enqueue_many(db, [{"report_id": 1, "pages": []}])
    with pytest.raises(pgpool.ConfigError, match="computes its concurrency_key per payload"):
        typedjobs.thumb.enqueue_many(db, [Thumb(1, Size.SMALL)])
    assert typedjobs.thumb.enqueue_many(db, [Thumb(1, Size.SMALL), Thumb(2, Size.LARGE)],
                                        concurrency_key="batch-1", priority=9) == 2
    assert typedjobs.LEGACY.enqueue_many(db, ({"n": n} for n in range(3))) == 3
    assert db.execute(
        "SELECT kind, queue, priority, tenant, concurrency_key, count(*) FROM pgpool_jobs "
        "GROUP BY 1, 2, 3, 4, 5 ORDER BY 1").fetchall() == [
        ("typed.legacy", "default", 0, "", None, 3),
        ("typed.thumb", "thumbs", 9, "acme", "batch-1", 2)]


def test_the_async_twins_check_and_encode_typed_payloads_too(dsn: str,
                                                             db: psycopg.Connection) -> None:
    async def main() -> tuple[int | None, int]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            one = await typedjobs.note.enqueue_async(aconn, {"id": "n1"})
            with pytest.raises(pgpool.PayloadError, match="field 'text': expected str"):
                await typedjobs.note.enqueue_async(aconn, {"id": "n2", "text": 5})
            many = await typedjobs.note.enqueue_many_async(
                aconn, [{"id": "n3", "text": None}, {"id": "n4", "text": "hi"}], queue="notes")
            return one, many

    one, many = asyncio.run(main())
    assert one is not None and many == 2
    assert db.execute("SELECT queue, payload FROM pgpool_jobs ORDER BY id").fetchall() == [
        ("default", {"id": "n1"}), ("notes", {"id": "n3", "text": None}),
        ("notes", {"id": "n4", "text": "hi"})]


# --- a Handler wherever a kind is taken ----------------------------------------------------

#: The columns a job's producer decides, as the comparisons below read them.
JOB_COLUMNS = ("kind, queue, priority, tenant, unique_key, concurrency_key, max_attempts, "
               "state, payload")


def jobs_as_rows(db: psycopg.Connection) -> list[tuple[Any, ...]]:
    return db.execute(f"SELECT {JOB_COLUMNS} FROM pgpool_jobs ORDER BY id").fetchall()


def by_both(db: psycopg.Connection, enqueue: Any) -> list[tuple[Any, ...]]:
    """The rows ``enqueue(how)`` leaves when ``how`` is the handler's own method and when it
    is `pgpool.enqueue`'s kin given the handler (each on an empty table): asserted equal,
    and returned."""
    rows = []
    for own in (True, False):
        db.execute("DELETE FROM pgpool_jobs")
        enqueue(own)
        rows.append(jobs_as_rows(db))
    assert rows[0] == rows[1]
    return rows[0]


def test_pgpool_enqueue_given_a_handler_is_the_handlers_own_enqueue(
        db: psycopg.Connection) -> None:
    thumb, report = typedjobs.thumb, typedjobs.report
    taken = datetime(2024, 5, 1, 12, tzinfo=UTC)

    def enqueue(own: bool) -> None:
        def one(handler: pgpool.Handler[Any], payload: Any, **options: Any) -> int | None:
            if own:
                return handler.enqueue(db, payload, **options)
            return pgpool.enqueue(db, handler, payload, **options)

        # Its defaults (queue, priority, tenant, a concurrency_key computed from the typed
        # payload), then a dict that fits with options given over them, None included.
        assert one(thumb, Thumb(7, Size.LARGE, taken=taken)) is not None
        assert one(thumb, {"image_id": 8, "size": Size.SMALL}, queue="urgent", priority=-1,
                   tenant=None, concurrency_key="mine", max_attempts=4) is not None
        # A unique_key computed from the payload deduplicates: None for the second.
        assert one(report, {"report_id": 3, "pages": [1]}) is not None
        assert one(report, {"report_id": 3, "pages": [2]}) is None
        assert one(report, {"report_id": 3, "pages": []}, unique_key=None,
                   delay=60) is not None

    assert by_both(db, enqueue) == [
        ("typed.thumb", "thumbs", 5, "acme", None, "image-7", None, "ready",
         {"image_id": 7, "size": 512, "ratio": 1.0, "owner": None,
          "taken": "2024-05-01T12:00:00+00:00", "day": None, "ref": None, "mode": "fit",
          "meta": {}}),
        ("typed.thumb", "urgent", -1, "", None, "mine", 4, "ready",
         {"image_id": 8, "size": 64}),
        ("typed.report", "default", 0, "", "report-3", None, None, "ready",
         {"report_id": 3, "pages": [1]}),
        ("typed.report", "default", 0, "", None, None, None, "scheduled",
         {"report_id": 3, "pages": []}),
    ]


def test_a_payload_that_does_not_fit_the_handler_given_as_the_kind_is_refused(
        db: psycopg.Connection) -> None:
    with pytest.raises(pgpool.PayloadError) as caught:
        pgpool.enqueue(db, typedjobs.thumb, {"image_id": "x", "size": 64})
    assert str(caught.value) == ("payload for 'typed.thumb': field 'image_id': expected int, "
                                 "got str")
    with pytest.raises(pgpool.PayloadError, match=r"^payload #1 \(0-based\): payload for "
                                                  r"'typed.thumb': field 'size'"):
        pgpool.enqueue_many(db, typedjobs.thumb, [Thumb(1, Size.SMALL), {"image_id": 2}],
                            concurrency_key="batch")
    with pytest.raises(pgpool.PayloadError, match="field 'oops': not a field of Thumb"):
        pgpool.enqueue(db, typedjobs.thumb, {"image_id": 1, "size": 64, "oops": 1})
    assert jobs_as_rows(db) == []


def test_pgpool_enqueue_many_given_a_handler_is_the_handlers_own(db: psycopg.Connection
                                                                 ) -> None:
    def enqueue(own: bool) -> None:
        payloads = [Thumb(1, Size.SMALL), {"image_id": 2, "size": Size.LARGE}]
        options: dict[str, Any] = {"concurrency_key": "batch-1", "priority": 9}
        count = (typedjobs.thumb.enqueue_many(db, payloads, **options) if own
                 else pgpool.enqueue_many(db, typedjobs.thumb, payloads, **options))
        assert count == 2

    assert by_both(db, enqueue) == [
        ("typed.thumb", "thumbs", 9, "acme", None, "batch-1", None, "ready",
         {"image_id": 1, "size": 64, "ratio": 1.0, "owner": None, "taken": None,
          "day": None, "ref": None, "mode": "fit", "meta": {}}),
        ("typed.thumb", "thumbs", 9, "acme", None, "batch-1", None, "ready",
         {"image_id": 2, "size": 512}),
    ]
    # What the handler's enqueue_many refuses, pgpool.enqueue_many refuses alike.
    with pytest.raises(pgpool.ConfigError, match="has a unique_key, which enqueue_many "
                                                 "cannot apply"):
        pgpool.enqueue_many(db, typedjobs.report, [{"report_id": 1, "pages": []}])
    with pytest.raises(pgpool.ConfigError, match="computes its concurrency_key per payload"):
        pgpool.enqueue_many(db, typedjobs.thumb, [Thumb(1, Size.SMALL)])
    with pytest.raises(pgpool.ConfigError, match=r"typed.thumb.enqueue_many takes .*, not "
                                                 r"delay"):
        pgpool.enqueue_many(db, typedjobs.thumb, [], concurrency_key="k",
                            delay=5)  # type: ignore[call-overload]


def test_the_async_twins_take_a_handler_too(dsn: str, db: psycopg.Connection) -> None:
    async def main() -> tuple[int | None, int]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            one = await pgpool.enqueue_async(aconn, typedjobs.thumb, Thumb(3, Size.SMALL),
                                             priority=1)
            with pytest.raises(pgpool.PayloadError, match="field 'text': expected str"):
                await pgpool.enqueue_async(aconn, typedjobs.note, {"id": "n2", "text": 5})
            many = await pgpool.enqueue_many_async(
                aconn, typedjobs.note, [{"id": "n3"}, {"id": "n4", "text": "hi"}],
                queue="notes")
            return one, many

    one, many = asyncio.run(main())
    assert one is not None and many == 2
    assert [row[:3] + row[5:6] + row[8:] for row in jobs_as_rows(db)] == [
        ("typed.thumb", "thumbs", 1, "image-3",
         {"image_id": 3, "size": 64, "ratio": 1.0, "owner": None, "taken": None,
          "day": None, "ref": None, "mode": "fit", "meta": {}}),
        ("typed.note", "notes", 0, None, {"id": "n3"}),
        ("typed.note", "notes", 0, None, {"id": "n4", "text": "hi"}),
    ]


def test_a_kind_that_is_neither_a_name_nor_a_handler_is_refused(db: psycopg.Connection
                                                                ) -> None:
    for kind in (typedjobs.thumb.fn, typedjobs.Thumb, 42, None):
        with pytest.raises(pgpool.ConfigError, match="invalid kind"):
            pgpool.enqueue(db, kind, {})  # type: ignore[call-overload]
        with pytest.raises(pgpool.ConfigError, match="invalid kind"):
            pgpool.enqueue_many(db, kind, [{}])  # type: ignore[call-overload]
    assert jobs_as_rows(db) == []


def test_a_typed_payload_given_with_the_kinds_name_is_refused_naming_its_handler(
        db: psycopg.Connection) -> None:
    through = ("enqueue it with {0}.enqueue(conn, payload), which checks and encodes it, or "
               "pass the handler as the kind: pgpool.enqueue(conn, {0}, payload)")
    with pytest.raises(pgpool.PayloadError) as caught:
        pgpool.enqueue(db, "typed.thumb", Thumb(1, Size.SMALL))  # type: ignore[call-overload]
    assert str(caught.value) == (
        "payload must be a dict (a JSON object), not Thumb: it is the payload type of handler "
        "'typed.thumb' (typedjobs.thumb): " + through.format("thumb"))
    # Enqueued many at once, named by position; a type two handlers take names both.
    invoice = Invoice(invoice_id=1, total=2, issued=datetime(2024, 1, 1, tzinfo=UTC))
    with pytest.raises(pgpool.PayloadError) as caught:
        pgpool.enqueue_many(db, "typed.bill", [{"invoice_id": 1}, invoice])  # type: ignore[list-item]
    assert str(caught.value) == (
        "payload #1 (0-based): payload must be a dict (a JSON object), not Invoice: it is the "
        "payload type of handler 'typed.invoice' (typedjobs.invoice) or 'typed.bill' "
        "(typedjobs.bill): " + through.format("invoice"))
    # A dataclass no handler registered in this process takes: the advice, unnamed.
    with pytest.raises(pgpool.PayloadError) as caught:
        pgpool.enqueue(db, "typed.flat", Flat(**GOOD_FLAT))  # type: ignore[arg-type, call-overload]
    assert str(caught.value) == (
        "payload must be a dict (a JSON object), not Flat: a dataclass or a pydantic model "
        "is a typed handler's payload: enqueue it with that handler's .enqueue(conn, "
        "payload), which checks and encodes it, or pass the handler as the kind: "
        "pgpool.enqueue(conn, handler, payload)")
    # Any other value is to be wrapped.
    with pytest.raises(pgpool.PayloadError, match=r"not list: wrap the value, e\.g\. "):
        pgpool.enqueue(db, "typed.thumb", [1, 2])  # type: ignore[call-overload]
    assert jobs_as_rows(db) == []


# --- registration -------------------------------------------------------------------------


class Unfit(TypedDict):
    data: bytes


@dataclasses.dataclass
class DeepUnfit:
    name: str
    inner: list[dict[str, set[int]]]


class IntKeys(TypedDict):
    counts: dict[int, int]


class Later(TypedDict):
    n: NotRequired[Missing]  # type: ignore[name-defined]  # noqa: F821


class Color(enum.Enum):
    RED = (255, 0, 0)


class Painted(TypedDict):
    color: Color


def unfit(payload: Unfit) -> None:
    pass


def deep_unfit(payload: DeepUnfit) -> None:
    pass


def int_keys(payload: IntKeys) -> None:
    pass


def later(payload: Later) -> None:
    pass


def painted(payload: Painted) -> None:
    pass


def unknown_name(payload: NotDefinedAnywhere) -> None:  # type: ignore[name-defined]  # noqa: F821
    pass


UNSUPPORTED = {
    "bytes": (unfit, "payload type Unfit: field 'data': bytes is not supported: use str, "),
    "nested": (deep_unfit, "payload type DeepUnfit: field 'inner': set[int] is not "
                           "supported"),
    "int-keys": (int_keys, "field 'counts': dict[int, int] is not supported: JSON object "
                           "keys are strings, use dict[str, X]"),
    "unresolved-field": (later, "the annotations of Later cannot be resolved (NameError: "
                                "name 'Missing' is not defined)"),
    "enum-values": (painted, "field 'color': enum Color: its values must be str or int"),
    "unresolved": (unknown_name, "the annotation of 'payload' cannot be resolved "
                                 "(NameError: name 'NotDefinedAnywhere' is not defined): "
                                 "define or import"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_an_unsupported_payload_type_is_refused_at_registration(case: str) -> None:
    fn, needle = UNSUPPORTED[case]
    kind = f"typed.unsupported-{case}"
    with registry.isolated(), pytest.raises(pgpool.HandlerError) as caught:
        pgpool.handler(kind)(fn)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"handler {kind!r}: ")
    assert needle in message, message
    assert kind not in registry.registered()


def test_bad_defaults_are_refused_at_registration() -> None:
    for options, needle in [({"queue": "no spaces"}, "invalid queue 'no spaces'"),
                            ({"priority": "high"}, "priority must be an integer"),
                            ({"tenant": 5}, "tenant must be None or a non-empty string"),
                            # Values too, not only types: the defaults are one JobOptions.
                            ({"tenant": ""}, "tenant must be None or a non-empty string"),
                            ({"priority": 2**31}, "priority must be an integer within"),
                            ({"concurrency_key": "x" * 201}, "concurrency_key must be None"),
                            ({"unique_key": 5}, "unique_key must be a string or a function")]:
        with pytest.raises(pgpool.HandlerError, match=needle):
            pgpool.handler("typed.bad-defaults", **options)  # type: ignore[arg-type]


# --- the worker decodes ---------------------------------------------------------------------


def received(record_dir: Path, job_id: int | None) -> Any:
    with open(record_dir / f"{job_id}.pickle", "rb") as f:
        return pickle.load(f)


def test_a_real_worker_gets_the_payload_decoded_into_its_type(
        db: psycopg.Connection, dsn: str, record_dir: Path) -> None:
    sent_thumb = Thumb(7, Size.LARGE, 0.5, Owner("ann", ["x"]),
                       datetime(2024, 5, 1, 12, tzinfo=UTC), date(2024, 5, 2),
                       uuid.UUID(int=42), "fill", {"any": [1, {"k": None}]})
    sent_report: Report = {"report_id": 1, "pages": [3, 4], "format": "pdf"}
    sent_note: Note = {"id": "n"}
    sent_invoice = Invoice(invoice_id=9, total=12.5, issued=datetime(2024, 5, 3, tzinfo=UTC))
    jobs = {
        "thumb": typedjobs.thumb.enqueue(db, sent_thumb),
        "dict-thumb": typedjobs.thumb.enqueue(db, {"image_id": 8, "size": Size.SMALL}),
        "report": typedjobs.report.enqueue(db, sent_report),
        "note": typedjobs.note.enqueue(db, sent_note),
        "old-note": pgpool.enqueue(db, "typed.note-old", {"id": "old", "text": None}),
        "invoice": typedjobs.invoice.enqueue(db, sent_invoice),
        "dict-invoice": typedjobs.invoice.enqueue(
            db, {"invoice_id": 10, "total": 1, "issued": "2024-05-04T00:00:00Z"}),
        "legacy": typedjobs.LEGACY.enqueue(db, {"secret": MARKER}),
    }
    done = run_pgpool(dsn, "run", "--handlers", "typedjobs", "--burst", "--procs", "1",
                      "--queue", "default", "--queue", "thumbs", record_dir=record_dir)
    assert done.returncode == 0, done.stderr
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM pgpool_dead").fetchone() == (0,)
    got = {name: received(record_dir, job) for name, job in jobs.items()}
    assert type(got["thumb"]) is Thumb and got["thumb"] == sent_thumb
    assert type(got["thumb"].size) is Size and type(got["thumb"].owner) is Owner
    assert got["dict-thumb"] == Thumb(8, Size.SMALL)
    assert got["report"] == sent_report and got["note"] == sent_note
    assert got["old-note"] == {"id": "old", "text": None}
    assert type(got["invoice"]) is Invoice and got["invoice"] == sent_invoice
    assert got["dict-invoice"] == Invoice(invoice_id=10, total=1.0,
                                          issued=datetime(2024, 5, 4, tzinfo=UTC))
    assert got["legacy"] == {"secret": MARKER}
    assert MARKER not in done.stderr


def stored_without_checks(db: psycopg.Connection) -> dict[int, str]:
    """Jobs of typed kinds with the default retries whose payloads do not fit, written as
    the SQL function and a plain INSERT let anyone write them (the values are MARKER, which
    nothing may show); what each dead letter must say."""
    ids: dict[int, str] = {}
    for kind, payload, field, problem in [
            ("typed.owner", {"tags": [MARKER]}, "name", "missing (required by Owner)"),
            ("typed.bill", {"invoice_id": 1, "total": MARKER, "issued": "2024-05-01T00:00:00Z"},
             "total", "Input should be a valid number, unable to parse string as a number"),
    ]:
        (job,) = db.execute("SELECT pgpool_enqueue(%s, %s)", (kind, Jsonb(payload))).fetchone()
        ids[job] = (f"payload decode failure: the stored payload does not fit "
                    f"{'Owner' if kind == 'typed.owner' else 'Invoice'}, the payload type of "
                    f"handler {kind!r}: field {field!r}: {problem}. {DECODE_FIX}")
    (job,) = db.execute("INSERT INTO pgpool_jobs (kind, payload) VALUES ('typed.report', %s) "
                        "RETURNING id", (Jsonb({"report_id": MARKER, "pages": []}),)).fetchone()
    ids[job] = ("payload decode failure: the stored payload does not fit Report, the payload "
                "type of handler 'typed.report': field 'report_id': expected int, got str. "
                + DECODE_FIX)
    return ids


DECODE_FIX = ("It would not on a retry either: enqueue with the handler's .enqueue, which "
              "checks the payload (pgpool_enqueue and an INSERT do not)")


def test_a_stored_payload_that_does_not_fit_is_dead_at_once_naming_the_field(
        db: psycopg.Connection, dsn: str, record_dir: Path) -> None:
    # Decoding fails alike on every attempt: the job dies on its first, as an error its
    # Retry does not retry would, not after the 20 attempts of its default schedule.
    expected = stored_without_checks(db)
    done = run_pgpool(dsn, "run", "--handlers", "typedjobs", "--burst", "--procs", "1",
                      record_dir=record_dir, **JSON_LOGS)
    assert done.returncode == 0, done.stderr
    assert db.execute("SELECT id, state FROM pgpool_jobs").fetchall() == []
    dead = {job: (reason, attempts, error) for job, reason, attempts, error in db.execute(
        "SELECT id, reason, attempts, last_error FROM pgpool_dead")}
    assert dead == {job: ("failed", 1, error) for job, error in expected.items()}
    assert {e["job_id"]: (e["permanent"], e["cause"]) for e in events(done.stderr, "job_dead")
            } == dict.fromkeys(expected, (True, "PayloadDecodeError"))
    assert not list(record_dir.glob("*.pickle"))  # no function ran
    assert MARKER not in done.stderr


def test_drain_dead_letters_a_payload_that_does_not_fit_at_once_too(
        db: psycopg.Connection) -> None:
    expected = stored_without_checks(db)
    first = min(expected)
    with pytest.raises(pgpool.PayloadDecodeError) as caught:
        drain(db, ["typed.owner", "typed.bill", "typed.report"])
    assert str(caught.value) == expected[first]
    assert drain(db, ["typed.owner", "typed.bill", "typed.report"],
                 raise_errors=False) == Counts(dead=2)
    assert dict(db.execute("SELECT id, last_error FROM pgpool_dead").fetchall()) == expected


def test_run_refuses_a_module_whose_typed_handler_cannot_be_resolved(
        dsn: str, tmp_path: Path) -> None:
    (tmp_path / "typed_mistake.py").write_text(textwrap.dedent('''
        from __future__ import annotations
        from dataclasses import dataclass
        import pgpool

        @pgpool.handler("typed.early")
        def early(payload: Defined) -> None:
            pass

        @dataclass
        class Defined:
            n: int
    '''))
    assert_user_error(run_pgpool(dsn, "run", "--handlers", "typed_mistake", "--burst",
                                 PYTHONPATH=str(tmp_path)),
                      "handler 'typed.early': the annotation of 'payload' cannot be resolved",
                      "name 'Defined' is not defined", "before the handler")
