"""A user's typed code, checked by ``mypy --strict`` in ``make lint`` (pyproject.toml's
[tool.mypy]): what pgpool's public API lets a type checker see. Never run.

The lines marked ``# type: ignore[...]`` are mistakes mypy must report: with
``warn_unused_ignores`` (part of strict), an ignore that silences nothing fails the check,
so each of them proves that the mistake is caught.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, TypedDict

import psycopg
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import pgpool
from pgpool.contrib import sqlalchemy as pgsa


@dataclass
class Thumb:
    image_id: int
    size: int


class Report(TypedDict):
    report_id: int


@pgpool.handler("thumbnail", timeout=120, max_attempts=5, queue="images",
                concurrency_key=lambda p: f"image-{p.image_id}")
def thumbnail(payload: Thumb) -> None:
    print(payload.image_id * payload.size)


@pgpool.handler("report", unique_key=lambda p: f"report-{p['report_id']}")
async def report(payload: Report) -> None:
    await asyncio.sleep(payload["report_id"])


@pgpool.handler("plain")
def plain(payload: dict[str, Any]) -> None:
    print(payload["anything"])


class Resize(BaseModel):
    width: int


@pgpool.handler("resize")
def resize(payload: Resize) -> None:
    print(payload.width)


def produce(conn: psycopg.Connection[Any]) -> None:
    job: int | None = thumbnail.enqueue(conn, Thumb(image_id=1, size=256), priority=3)
    count: int = thumbnail.enqueue_many(conn, [Thumb(2, 64), Thumb(3, 64)],
                                        concurrency_key=None)
    report.enqueue(conn, {"report_id": 7}, unique_key=None, delay=30)
    plain.enqueue(conn, {"anything": [1, 2]}, queue="other", tenant="acme")
    thumbnail(Thumb(4, 32))  # the function itself
    handler: pgpool.Handler[Thumb] = thumbnail
    print(job, count, handler.kind, handler.timeout, pgpool.enqueue(conn, "plain", {}))

    # A dataclass's or a pydantic model's handler takes a dict of its fields too, as at run
    # time (checked there: a dict that does not fit raises PayloadError).
    thumbnail.enqueue(conn, {"image_id": 1, "size": 2})
    thumbnail.enqueue_many(conn, [Thumb(1, 2), {"image_id": 3, "size": 4}])
    resize.enqueue(conn, Resize(width=3))
    resize.enqueue(conn, {"width": 3}, priority=1)
    print(thumbnail.encode({"image_id": 1, "size": 2}), resize.encode(Resize(width=3)))

    # A Handler wherever a kind is taken, with its defaults and its payload type.
    by_handler: int | None = pgpool.enqueue(conn, thumbnail, Thumb(1, 2), priority=3)
    pgpool.enqueue(conn, thumbnail, {"image_id": 1, "size": 2})
    pgpool.enqueue(conn, report, {"report_id": 7}, delay=30)
    pgpool.enqueue(conn, plain, {"anything": 1})
    many: int = pgpool.enqueue_many(conn, thumbnail, [Thumb(1, 2), Thumb(3, 4)],
                                    concurrency_key="all")
    pgpool.enqueue_many(conn, thumbnail, [{"image_id": 3, "size": 4}], concurrency_key="all")
    pgpool.enqueue_many(conn, "plain", [{"a": 1}], queue="bulk")
    print(by_handler, many)

    # Mistakes a type checker catches:
    thumbnail.enqueue(conn, Report(report_id=1))  # type: ignore[call-overload]
    thumbnail.enqueue(conn, [1, 2])  # type: ignore[call-overload]
    resize.enqueue(conn, Thumb(1, 2))  # type: ignore[call-overload]
    report.enqueue(conn, {"report_id": "7"})  # type: ignore[typeddict-item]
    report.enqueue(conn, Thumb(1, 2))  # type: ignore[arg-type]
    plain.enqueue(conn, [1, 2])  # type: ignore[arg-type]
    thumbnail.enqueue(conn, Thumb(1, 2), priority="high")  # type: ignore[call-overload]
    thumbnail.enqueue(conn, Thumb(1, 2), qeue="images")  # type: ignore[call-overload]
    thumbnail.enqueue_many(conn, [Thumb(1, 2)], delay=5)  # type: ignore[call-overload]
    thumbnail.enqueue_many(conn, [Report(report_id=1)])  # type: ignore[list-item]
    thumbnail(Report(report_id=1))  # type: ignore[arg-type]
    thumbnail({"image_id": 1, "size": 2})  # type: ignore[arg-type]  # the function as written
    wrong: pgpool.Handler[Report] = thumbnail  # type: ignore[assignment]
    print(wrong)
    pgpool.enqueue(conn, thumbnail, Report(report_id=1))  # type: ignore[misc]
    pgpool.enqueue(conn, report, Thumb(1, 2))  # type: ignore[misc]
    pgpool.enqueue(conn, "plain", [1, 2])  # type: ignore[call-overload]
    pgpool.enqueue(conn, thumbnail, Thumb(1, 2), qeue="x")  # type: ignore[call-overload]
    pgpool.enqueue_many(conn, "plain", [{}], delay=5)  # type: ignore[call-overload]
    pgpool.enqueue_many(conn, thumbnail, [Report(report_id=1)])  # type: ignore[misc]


async def produce_async(conn: psycopg.AsyncConnection[Any]) -> None:
    job: int | None = await thumbnail.enqueue_async(conn, Thumb(1, 2))
    count: int = await report.enqueue_many_async(conn, [{"report_id": 1}])
    await thumbnail.enqueue_async(conn, {"image_id": 1, "size": 2})
    await thumbnail.enqueue_many_async(conn, [{"image_id": 1, "size": 2}])
    await pgpool.enqueue_async(conn, thumbnail, {"image_id": 1, "size": 2}, tenant="acme")
    await pgpool.enqueue_many_async(conn, report, [{"report_id": 1}])
    await thumbnail.enqueue_async(conn, Report(report_id=1))  # type: ignore[call-overload]
    await pgpool.enqueue_async(conn, "plain", [1])  # type: ignore[call-overload]
    print(job, count)


def produce_from_sqlalchemy(session: Session) -> None:
    job: int | None = pgsa.enqueue(session, thumbnail, Thumb(1, 2), priority=3)
    count: int = pgsa.enqueue_many(session, "plain", [{"a": 1}], queue="bulk")
    pgsa.enqueue(session, "plain", {"a": 1}, tenant="acme")
    print(job, count)

    # Mistakes a type checker catches:
    pgsa.enqueue(session, "plain", [1, 2])  # type: ignore[call-overload]
    pgsa.enqueue_many(session, "plain", [{}], delay=5)  # type: ignore[call-overload]


async def produce_from_sqlalchemy_async(session: AsyncSession) -> None:
    job: int | None = await pgsa.enqueue_async(session, report, {"report_id": 1})
    count: int = await pgsa.enqueue_many_async(session, thumbnail, [Thumb(1, 2)])
    await pgsa.enqueue_async(session, report, {"report_id": 1}, priorty=1)  # type: ignore[call-overload]
    print(job, count)
