"""Long jobs for the suite (``--handlers longjobs``): a job of steps that checkpoints after
each, resuming from its checkpoint.

Each step run is recorded as a line "<job id> <claim> <step>" in a per-process file under
$TESTJOBS_RECORD (`steps_run` reads them back), written once the step's work is over and
before its checkpoint is stored: a step whose checkpoint was not stored is recorded, and
runs again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pgpool


def _record(line: str) -> None:
    where = os.environ["TESTJOBS_RECORD"]
    fd = os.open(os.path.join(where, f"{os.getpid()}.steps"),
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@pgpool.handler("steps", keep=600)
def steps(payload: dict) -> dict:
    """``payload["steps"]`` steps of ``payload["seconds"]`` each, a checkpoint
    ``{"next": step + 1, "claim": claim}`` after each; starts at the stored checkpoint's
    ``next``. Returns the step it started from and its attempt as counted."""
    job = pgpool.current_job()
    state = job.checkpoint_state or {"next": 0}
    for step in range(state["next"], payload["steps"]):
        time.sleep(payload["seconds"])
        _record(f"{job.id} {job.claim} {step}")
        job.checkpoint({"next": step + 1, "claim": job.claim})
    return {"from": state["next"], "attempt": job.attempt}


def steps_run(where: Path) -> list[tuple[int, int, int]]:
    """Every step recorded under ``where``: (job id, claim, step), in no particular order."""
    found = []
    for path in where.glob("*.steps"):
        for line in path.read_text().splitlines():
            job_id, claim, step = map(int, line.split())
            found.append((job_id, claim, step))
    return found


@pgpool.handler("progressing")
def progressing(payload: dict) -> None:
    """Report progress in a tight loop, ``done`` counting the calls of ``total``, until
    the file ``payload["release"]`` exists (at most 60 s)."""
    job = pgpool.current_job()
    total = payload["total"]
    deadline = time.monotonic() + 60
    done = 0
    while not os.path.exists(payload["release"]):
        if time.monotonic() > deadline:
            raise TimeoutError("the test never released this job")
        for _ in range(1000):
            done = min(total, done + 1)
            job.progress(done, total, note=f"frame {done}")


@pgpool.handler("soft_spin", timeout=20, soft_timeout=1, keep=600)
def soft_spin(payload: dict) -> dict:
    """A pure-Python CPU loop (or ``time.sleep``, with ``payload["sleep"]``) until its soft
    timeout: returns how long after its start SoftTimeout came, and where."""
    started = time.perf_counter()
    try:
        if payload.get("sleep"):
            time.sleep(60)
        n = 0
        while True:
            n += 1
    except pgpool.SoftTimeout as exc:
        return {"after": time.perf_counter() - started, "message": str(exc)}


def _span(seconds: float) -> None:
    """Sleep ``seconds``, recording "<kind> <job id> <cpus> <start ns> <end ns>"."""
    job = pgpool.current_job()
    started = time.monotonic_ns()
    time.sleep(seconds)
    _record_span(f"{job.kind} {job.id} {job.cpus} {started} {time.monotonic_ns()}")


def _record_span(line: str) -> None:
    fd = os.open(os.path.join(os.environ["TESTJOBS_RECORD"], f"{os.getpid()}.spans"),
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@pgpool.handler("wide", cpus=2)
def wide(payload: dict) -> None:
    _span(payload["seconds"])


@pgpool.handler("narrow")
def narrow(payload: dict) -> None:
    _span(payload["seconds"])


@pgpool.handler("too_wide", cpus=64)
def too_wide(payload: dict) -> None:
    _span(0)


def spans(where: Path) -> list[tuple[str, int, int, int, int]]:
    """Every span recorded under ``where``: (kind, job id, cpus, start ns, end ns)."""
    found = []
    for path in where.glob("*.spans"):
        for line in path.read_text().splitlines():
            kind, *numbers = line.split()
            job_id, cpus, start, end = map(int, numbers)
            found.append((kind, job_id, cpus, start, end))
    return found
