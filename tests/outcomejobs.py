"""Handlers of the outcomes tests (tests/test_outcomes.py): results kept or not, follow-up
jobs and groups started through the running job, and callbacks that read their group's
members. Imported by real worker processes (``--handlers outcomejobs``) and by
`pgpool.testing.drain` in the tests' own process."""

from __future__ import annotations

import os
import signal
import time

import pgpool


@pgpool.handler("out.square", keep=3600)
def square(payload: dict) -> dict:
    if payload.get("fail"):
        raise ValueError("asked to fail")
    return {"square": payload["n"] ** 2}


@pgpool.handler("out.loose")
def loose(payload: dict) -> dict:
    """Returns a value that nothing keeps."""
    return {"n": payload["n"]}


@pgpool.handler("out.huge", keep=60)
def huge(payload: dict) -> str:
    return "x" * payload["size"]


@pgpool.handler("out.parent", max_attempts=2, retry=pgpool.Retry(base=3600, cap=3600))
def parent(payload: dict) -> None:
    """Enqueues ``children`` follow-ups, then fails if asked, or is killed (with its worker)
    on its first attempt if asked. Retried an hour later: a test sees it wait for its retry
    however slow the machine (`pgpool retry` runs it now)."""
    job = pgpool.current_job()
    for i in range(payload["children"]):
        job.enqueue("out.child", {"parent": job.id, "i": i})
    if payload.get("fail"):
        raise RuntimeError("failed after enqueueing its follow-ups")
    if payload.get("die_first") and job.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)


@pgpool.handler("out.child", keep=3600)
def child(payload: dict) -> dict:
    return payload


@pgpool.handler("out.score", max_attempts=1)
def score(payload: dict) -> float:
    """A member: its score, or a failure for a negative document; sleeps ``sleep`` first."""
    time.sleep(payload.get("sleep", 0))
    if payload["doc"] < 0:
        raise ValueError("no such document")
    return payload["doc"] * 0.5


@pgpool.handler("out.combine", keep=3600)
def combine(payload: dict) -> dict:
    """A callback: the sum of its members' scores, and how many failed."""
    members = pgpool.current_job().group_members()
    total = sum(m.result for m in members if m.state == "done")
    failed = sum(1 for m in members if m.state != "done")
    if payload.get("then_group"):  # a second fan-out after the first
        pgpool.current_job().group("out.score", [{"doc": d} for d in range(3)],
                                   then=("out.combine", {"label": "second"}))
    return {"label": payload.get("label"), "members": len(members), "total": total,
            "failed": failed}


@pgpool.handler("out.badfollow")
def bad_follow(payload: dict) -> None:
    pgpool.current_job().enqueue("out.child", {"x": float("nan")})


@pgpool.handler("out.fanout")
def fan_out(payload: dict) -> None:
    """Starts a group of four scores, then fails if asked."""
    pgpool.current_job().group("out.score", [{"doc": d} for d in range(4)],
                               then=("out.combine", {"label": "fanned"}))
    if payload.get("fail"):
        raise RuntimeError("failed after starting its group")


@pgpool.handler("out.fanout_later", retry=pgpool.Retry(base=3600, cap=3600))
def fan_out_later(payload: dict) -> None:
    """`fan_out`, retried an hour after a failure: a test sees it waiting for its retry."""
    fan_out(payload)
