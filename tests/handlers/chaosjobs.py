"""The chaos soak's handlers: a little CPU work per job, every attempt recorded durably.

Imported by real worker processes (``pgpool run --handlers chaosjobs`` from
``tests/handlers/``, or with it on ``PYTHONPATH``). Each attempt appends two lines to a
per-process file ``$CHAOS_RECORD/<dispatcher pid>-<worker pid>.log``, each written with one
``write`` and made durable with ``fdatasync`` before the handler goes on::

    <job id> <claim> <worker pid> <start_ns> -            before the work starts
    <job id> <claim> <worker pid> <start_ns> <end_ns>     after the work, before returning

The group workload's kinds (``chaos.member``, ``chaos.callback``, ``chaos.parent``,
``chaos.child``) add their kind and payload (compact JSON) to the start line, so the
checker knows what each attempt was even for follow-up jobs, whose ids only the ack that
inserted them knew::

    <job id> <claim> <worker pid> <start_ns> - <kind> <payload>

Their payloads name them (``chaos_checks`` reads them): a member ``{"g": group key, "i":
index}``, a callback ``{"g": group key, "total": members}`` (with ``"group": m`` if it starts
a nested group), a parent ``{"children": n, "group": m}``, and a parent's child ``{"p":
parent id, "c": the parent's claim, "i": index}``; a group started by a parent or a callback
has the key ``p<its id>.<claim>``.

Times are ``time.monotonic_ns()``: CLOCK_MONOTONIC, one clock for every process on the
host, so they compare with the fault times the soak driver takes. An attempt killed while
it ran leaves its start line without a matching end line. A line without its trailing
newline (the process died inside ``write``) is to be ignored by readers.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import pgpool
from pgpool.worker.followups import RunningJob

#: The environment variable naming the directory the records go to (chaos_cluster.RECORD_ENV).
RECORD_ENV = "CHAOS_RECORD"
#: The job kind the soak enqueues (chaos_cluster.KIND).
KIND = "chaos.record"
#: Long jobs that checkpoint after each step (issue 35): ``{"steps": n, "ms": per step}``.
#: Their start line carries kind and payload, and each step's start is recorded in the
#: per-process file ``<dispatcher pid>-<worker pid>.steps`` as ``<job id> <claim> <step>``.
STEPS = "chaos.steps"
#: A kind with a fleet-wide concurrency limit (tests/host/test_limited_hosts.py), and that limit.
LIMITED = "chaos.limited"
LIMITED_CONCURRENCY = 3
#: A kind of which one job at a time runs in the fleet (the chaos soak: fewer than its
#: workers, so the limit binds), and that limit.
ONE_AT_A_TIME = "chaos.one_at_a_time"
#: A kind with a fleet-wide rate limit (tests/host/test_limited_hosts.py), and that rate per
#: second.
RATED = "chaos.rated"
RATED_PER_SECOND = 20
#: A kind with a fleet-wide rate high enough for its claims' grants (`pgpool.host.grant`:
#: rows of 10 jobs; tests/host/test_limited_hosts.py), and that rate per second.
FAST_RATED = "chaos.fast_rated"
FAST_RATED_PER_SECOND = 640
#: A kind with a concurrency limit per tenant (tests/host/test_limited_hosts.py), and that
#: limit.
PER_TENANT = "chaos.per_tenant"
PER_TENANT_CONCURRENCY = 2
#: A kind with a rate limit per tenant (tests/host/test_limited_hosts.py), and that rate per
#: second.
TENANT_RATED = "chaos.tenant_rated"
TENANT_RATED_PER_SECOND = 10
#: The group workload's kinds (chaos_checks names them too).
MEMBER, CALLBACK, PARENT, CHILD = "chaos.member", "chaos.callback", "chaos.parent", "chaos.child"
#: How long the group workload's successes are kept: past any run, so the checker finds
#: every member, callback and parent in ``pgpool_done``, and retention leaves every group's
#: row in ``pgpool_groups`` (it prunes a group only once its members' records are gone).
KEEP = 24 * 3600

#: This process's record files, by suffix.
_fds: dict[str, int] = {}


def _append(line: str, suffix: str = ".log") -> None:
    """Append ``line`` to this process's record file (``.log``, or ``.steps``) and make it
    durable."""
    fd = _fds.get(suffix)
    if fd is None:
        where = os.environ.get(RECORD_ENV)
        if not where:
            raise RuntimeError(f"{RECORD_ENV} is not set: chaos jobs have nowhere to record")
        name = os.path.join(where, f"{os.getppid()}-{os.getpid()}{suffix}")
        fd = _fds[suffix] = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode())
    os.fdatasync(fd)


def spin(ms: float) -> None:
    """Burn about ``ms`` milliseconds of CPU (SHA-256 rounds until the time is up)."""
    deadline = time.perf_counter_ns() + int(ms * 1_000_000)
    digest = b"chaos"
    while time.perf_counter_ns() < deadline:
        for _ in range(20):
            digest = hashlib.sha256(digest).digest()


@pgpool.handler(KIND)
def record(payload: dict) -> None:
    """Record the start, spin ``payload["ms"]`` ms of CPU (default 2), then sleep
    ``payload["sleep"]`` seconds if given (a long job that leaves the CPU to others), and
    record the end.

    Never fails on its own: any re-run of a chaos job is caused by something outside it.
    """
    job = pgpool.current_job()
    pid = os.getpid()
    start = time.monotonic_ns()
    _append(f"{job.id} {job.claim} {pid} {start} -\n")
    spin(float(payload.get("ms", 2)))
    if payload.get("sleep"):
        time.sleep(float(payload["sleep"]))
    end = time.monotonic_ns()
    _append(f"{job.id} {job.claim} {pid} {start} {end}\n")


@pgpool.handler(STEPS)
def steps(payload: dict) -> None:
    """Run steps ``0..steps-1``, each ``ms`` ms of CPU, from the one the last stored
    checkpoint names, and checkpoint after each: a later attempt resumes there."""
    job = pgpool.current_job()
    pid = os.getpid()
    start = time.monotonic_ns()
    _append(f"{job.id} {job.claim} {pid} {start} - {STEPS} "
            f"{json.dumps(payload, separators=(',', ':'))}\n")
    state = job.checkpoint_state
    for step in range(state["next"] if state else 0, payload["steps"]):
        _append(f"{job.id} {job.claim} {step}\n", ".steps")
        spin(float(payload.get("ms", 5)))
        job.checkpoint({"next": step + 1})
    _append(f"{job.id} {job.claim} {pid} {start} {time.monotonic_ns()}\n")


@pgpool.handler(LIMITED, limit=pgpool.Limit(concurrency=LIMITED_CONCURRENCY))
def limited(payload: dict) -> None:
    """`record`, for a kind of which at most `LIMITED_CONCURRENCY` run at once in the fleet."""
    record(payload)


@pgpool.handler(ONE_AT_A_TIME, limit=pgpool.Limit(concurrency=1))
def one_at_a_time(payload: dict) -> None:
    """`record`, for a kind of which one job at a time runs in the fleet."""
    record(payload)


@pgpool.handler(PER_TENANT, limit=pgpool.Limit(concurrency=PER_TENANT_CONCURRENCY,
                                               by="tenant"))
def per_tenant(payload: dict) -> None:
    """`record`, for a kind of which at most `PER_TENANT_CONCURRENCY` of one tenant run at
    once in the fleet."""
    record(payload)


@pgpool.handler(TENANT_RATED, limit=pgpool.Limit(rate=TENANT_RATED_PER_SECOND, per=1,
                                                 by="tenant"))
def tenant_rated(payload: dict) -> None:
    """`record`, for a kind of which at most `TENANT_RATED_PER_SECOND` of one tenant start
    in any second."""
    record(payload)


@pgpool.handler(RATED, limit=pgpool.Limit(rate=RATED_PER_SECOND, per=1))
def rated(payload: dict) -> None:
    """`record`, for a kind of which at most `RATED_PER_SECOND` start in any second."""
    record(payload)


@pgpool.handler(FAST_RATED, limit=pgpool.Limit(rate=FAST_RATED_PER_SECOND, per=1))
def fast_rated(payload: dict) -> None:
    """`record`, for a kind of which at most `FAST_RATED_PER_SECOND` start in any second."""
    record(payload)


def _started(payload: dict) -> tuple[RunningJob, int]:
    """Record the start of the running attempt with its kind and payload, and spin
    ``payload["ms"]`` ms of CPU; the job and its start time."""
    job = pgpool.current_job()
    start = time.monotonic_ns()
    _append(f"{job.id} {job.claim} {os.getpid()} {start} - {job.kind} "
            f"{json.dumps(payload, separators=(',', ':'))}\n")
    spin(float(payload.get("ms", 1)))
    return job, start


def _hold(payload: dict) -> None:
    """If ``payload["hold"]`` names a file, wait until it exists (a minute at most): a test
    holds an attempt there to kill it mid-run, then lets the next attempt through."""
    if payload.get("hold"):
        deadline = time.monotonic() + 60
        while not os.path.exists(payload["hold"]) and time.monotonic() < deadline:
            time.sleep(0.01)


def _ended(job: RunningJob, start: int) -> None:
    _append(f"{job.id} {job.claim} {os.getpid()} {start} {time.monotonic_ns()}\n")


@pgpool.handler(MEMBER, keep=KEEP)
def member(payload: dict) -> dict:
    """A member of a group: records, spins (and may be held: `_hold`), and returns its
    index; one asked to ``fail``
    is discarded (dead-lettered at once: its group counts it dead) after its end record."""
    job, start = _started(payload)
    _hold(payload)
    _ended(job, start)
    if payload.get("fail"):
        raise pgpool.Discard("chaos: a member asked to fail")
    return {"i": payload["i"]}


@pgpool.handler(CALLBACK, keep=KEEP)
def callback(payload: dict) -> dict:
    """A group's callback: reads its group's members (`current_job().group_members()`),
    starts a nested group of ``payload["group"]`` members if asked (through its job, as a
    parent does), and returns how many members it saw, how many had finished, and its
    claim; it may be held after the read (`_hold`).
    The read is retried through
    database faults for a minute (a restart, terminated sessions), so it never fails on
    its own; a host cut off for a whole lease kills it anyway."""
    import psycopg  # only here: the other kinds never load it

    job, start = _started(payload)
    deadline = time.monotonic() + 60
    while True:
        try:
            members = job.group_members()
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    _start_group(job, payload.get("group", 0))
    _hold(payload)
    _ended(job, start)
    return {"members": len(members),
            "finished": sum(1 for m in members if m.state in ("done", "dead", "cancelled")),
            "claim": job.claim}


def _start_group(job: RunningJob, size: int) -> None:
    """Start a group of ``size`` members (none if 0) through ``job``, keyed by its claim."""
    if size:
        key = f"p{job.id}.{job.claim}"
        job.group(MEMBER, [{"g": key, "i": i} for i in range(size)],
                  then=(CALLBACK, {"g": key, "total": size}))


@pgpool.handler(PARENT, keep=KEEP, retry=pgpool.Retry(base=0.1, cap=1.0))
def parent(payload: dict) -> dict:
    """Enqueues ``payload["children"]`` children and, if ``payload["group"]``, a group of
    that many members with a callback, all through its job (written with its success
    only), and may be held (`_hold`). Then, after its end record, one asked to ``fail``
    is discarded (its follow-ups must never exist), and one asked to be ``flaky`` fails
    its first claim (retried soon: its follow-ups must exist once, from the claim that
    succeeded). Returns its claim."""
    job, start = _started(payload)
    for i in range(payload.get("children", 0)):
        job.enqueue(CHILD, {"p": job.id, "c": job.claim, "i": i})
    _start_group(job, payload.get("group", 0))
    _hold(payload)  # its follow-ups kept, its success not yet sent
    _ended(job, start)
    if payload.get("fail"):
        raise pgpool.Discard("chaos: a parent asked to fail")
    if payload.get("flaky") and job.claim == 1:
        raise RuntimeError("chaos: a flaky parent fails its first claim")
    return {"claim": job.claim}


@pgpool.handler(CHILD)
def child(payload: dict) -> None:
    """A parent's follow-up: records and spins; its success is not kept."""
    job, start = _started(payload)
    _ended(job, start)
