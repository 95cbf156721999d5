"""Handlers of the outcomes tests (tests/api/test_outcomes.py): results kept or not,
follow-up jobs and groups started through the running job, and callbacks that read their
group's members. Imported by real worker processes (``--handlers outcomejobs``) and by
`pgpool.testing.drain` in the tests' own process."""

from __future__ import annotations

import os
import signal
import threading
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


#: `out.leaver`'s thread and `out.next`, in one worker process: each lets the other go.
_started = threading.Event()
_next_runs = threading.Event()
_left_done = threading.Event()
_left_calls: list[str] = []


@pgpool.handler("out.leaver")
def leaver(payload: dict) -> None:
    """Starts a thread that outlives this attempt, as a handler that forgot one would, once
    it has enqueued a follow-up while the attempt runs; then enqueues `out.next` through its
    job, so that it can only run after this attempt (two jobs enqueued together may come in
    either order: two claim loops race)."""
    threading.Thread(target=_left_behind, args=(pgpool.current_job(),), daemon=True).start()
    _started.wait(60)
    pgpool.current_job().enqueue("out.next", {})


def _left_behind(job: pgpool.JobInfo) -> None:
    """Enqueues a follow-up while its job runs; then, once the next job runs (`out.next`),
    long after its handler returned, calls the job it was started by and `current_job()`,
    and records what each call did."""
    _left_calls.append(f"current_job() returned {pgpool.current_job().id} while it ran")
    pgpool.current_job().enqueue("out.child", {"from": "while it ran"})
    _started.set()
    _next_runs.wait(60)
    calls = {
        "current_job()": lambda: pgpool.current_job().id,
        "held enqueue": lambda: job.enqueue("out.child", {"from": "held"}),  # type: ignore[attr-defined]
        "held group": lambda: job.group("out.score", [{"doc": 1}],  # type: ignore[attr-defined]
                                        then=("out.combine", {"label": "left"})),
        "current_job().enqueue": lambda: pgpool.current_job().enqueue("out.child",
                                                                     {"from": "fresh"}),
    }
    for name, call in calls.items():
        try:
            _left_calls.append(f"{name} returned {call()!r}")
        except Exception as exc:
            _left_calls.append(f"{name} raised {type(exc).__name__}: {exc}")
    _left_done.set()


@pgpool.handler("out.next", keep=3600)
def next_job(payload: dict) -> dict:
    """Runs after ``out.leaver`` in the same worker: lets its thread go, waits for it, and
    succeeds with what the thread's calls did."""
    _next_runs.set()
    _left_done.wait(60)
    return {"job": pgpool.current_job().id, "calls": _left_calls}


@pgpool.handler("out.fanout_later", retry=pgpool.Retry(base=3600, cap=3600))
def fan_out_later(payload: dict) -> None:
    """`fan_out`, retried an hour after a failure: a test sees it waiting for its retry."""
    fan_out(payload)
