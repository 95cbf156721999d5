"""Typed handlers used by tests/api/test_typed_handlers.py (imported by real worker
processes: ``--handlers typedjobs``).

Annotations are strings here (``from __future__ import annotations``), as in many users'
modules: registration resolves them. Each handler pickles what it received to
``$TESTJOBS_RECORD/<job id>.pickle``, so a test can compare it, type and all, with what it
enqueued.
"""

from __future__ import annotations

import enum
import os
import pickle
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Literal, NotRequired, Required, TypedDict
from uuid import UUID

import pydantic

import pgpool


class Size(enum.IntEnum):
    SMALL = 64
    LARGE = 512


@dataclass
class Owner:
    name: str
    tags: list[str] = field(default_factory=list)


@dataclass
class Thumb:
    image_id: int
    size: Size
    ratio: float = 1.0
    owner: Owner | None = None
    taken: datetime | None = None
    day: date | None = None
    ref: UUID | None = None
    mode: Literal["fit", "fill"] = "fit"
    meta: dict[str, Any] = field(default_factory=dict)


class Report(TypedDict):
    report_id: int
    pages: list[int]
    format: NotRequired[Literal["pdf", "csv"]]


class Note(TypedDict, total=False):
    id: Required[str]
    text: str | None


class Invoice(pydantic.BaseModel):
    invoice_id: int
    total: float
    issued: datetime
    lines: list[str] = []


def _record(got: object) -> None:
    where = os.environ["TESTJOBS_RECORD"]
    path = os.path.join(where, f"{pgpool.current_job().id}.pickle")
    with open(path + ".tmp", "wb") as f:
        pickle.dump(got, f)
    os.replace(path + ".tmp", path)


@pgpool.handler("typed.thumb", max_attempts=1, queue="thumbs", priority=5, tenant="acme",
                concurrency_key=lambda p: f"image-{p.image_id}")
def thumb(payload: Thumb) -> None:
    _record(payload)


@pgpool.handler("typed.report", unique_key=lambda p: f"report-{p['report_id']}")
def report(payload: Report) -> None:
    _record(payload)


@pgpool.handler("typed.note")
@pgpool.handler("typed.note-old")  # stacked: a renamed kind whose old jobs still run
def note(payload: Note) -> None:
    _record(payload)


@pgpool.handler("typed.invoice", max_attempts=1)
async def invoice(payload: Invoice) -> None:
    _record(payload)


@pgpool.handler("typed.owner")
def owner(payload: Owner) -> None:
    """The default retry schedule, as typed.report's and typed.bill's."""
    _record(payload)


@pgpool.handler("typed.bill")
def bill(payload: Invoice) -> None:
    _record(payload)


def legacy(payload: dict) -> None:
    _record(payload)


# Registered by a call, not as a decorator: the module's attribute `legacy` stays the function.
LEGACY = pgpool.handler("typed.legacy")(legacy)
