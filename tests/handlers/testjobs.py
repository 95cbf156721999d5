"""Handlers used by the test suite (imported by real worker processes: ``--handlers testjobs``).

Each records what it did as a line "<job id> <claim> <pid> <event>" in a per-process file
under $TESTJOBS_RECORD, so a test can check exactly which attempts ran where (the claim
number, `pgpool.JobInfo.claim`, tells a job's attempts apart).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

import pgpool


def _record(event: str) -> None:
    where = os.environ.get("TESTJOBS_RECORD")
    if not where:
        return
    job = pgpool.current_job()
    line = f"{job.id} {job.claim} {os.getpid()} {event}\n".encode()
    fd = os.open(os.path.join(where, f"{os.getpid()}.log"),
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@pgpool.handler("record")
def record(payload: dict) -> None:
    _record("start")
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    _record("end")


@pgpool.handler("fail", max_attempts=3)
def fail(payload: dict) -> None:
    _record("start")
    raise ValueError("this job always fails")


@pgpool.handler("leaky", max_attempts=2)
def leaky(payload: dict) -> None:
    """Fails with what a handler's exception may carry: a connection string with its
    password, a ``password=`` pair, and a second line (``payload["more"]``)."""
    _record("start")
    secret = payload["password"]
    raise ConnectionError(f"could not connect to postgresql://app:{secret}@db:5432/prod "
                          f"(password={secret})\nsecond line: {payload['more']}")


@pgpool.handler("flaky")
def flaky(payload: dict) -> None:
    _record("start")
    if pgpool.current_job().attempt < payload["succeed_on"]:
        raise RuntimeError("not yet")
    _record("end")


@pgpool.handler("crash", max_attempts=2)
def crash(payload: dict) -> None:
    _record("start")
    how = payload.get("how", "kill")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "exit":
        os._exit(7)
    elif how == "segfault":
        ctypes.string_at(0)


@pgpool.handler("spin", timeout=1, max_attempts=1)
def spin(payload: dict) -> None:
    _record("start")
    while True:
        pass


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception fails")


@pgpool.handler("unprintable", max_attempts=1)
def unprintable(payload: dict) -> None:
    raise _Unprintable()


@pgpool.handler("huge_error", max_attempts=1)
def huge_error(payload: dict) -> None:
    raise ValueError("x" * 5_000_000)


@pgpool.handler("async_record")
async def async_record(payload: dict) -> None:
    import asyncio

    _record("start")
    await asyncio.sleep(0)
    _record("end")


@pgpool.handler("hog", max_attempts=1)
def hog(payload: dict) -> None:
    _record("start")
    ballast = bytearray(payload["mib"] * 2**20)  # noqa: F841 - the allocation is the point
    _record("end")


@pgpool.handler("whoami")
def whoami(payload: dict) -> None:
    _record("run")


@pgpool.handler("noop")
def noop(payload: dict) -> None:
    pass


@pgpool.handler("large_result")
def large_result(payload: dict) -> dict:
    return {"blob": "x" * payload["bytes"]}  # a frame many times a pipe's size


@pgpool.handler("chatty")
def chatty(payload: dict) -> None:
    """Prints ``payload["chars"]`` characters to stdout and to stderr, in lines."""
    line = "x" * 99
    for _ in range(payload["chars"] // 100):
        print(line)
        print(line, file=sys.stderr)


@pgpool.handler("forker", max_attempts=1)
def forker(payload: dict) -> None:
    """Start a child that sleeps (it inherits the worker's pipes), then sleep too."""
    if os.fork() == 0:
        try:
            _record("child")
            time.sleep(payload.get("child_sleep", 40))
        finally:
            os._exit(0)
    _record("start")
    time.sleep(payload.get("sleep", 0))
    _record("end")


@pgpool.handler("orphan")
def orphan(payload: dict) -> None:
    """Leave an orphan behind: a child forks a grandchild and exits at once. Whichever of
    the two ends first, the grandchild ends up re-parented (to PID 1, or a subreaper) and
    is a zombie there until that process reaps it."""
    child = os.fork()
    if child == 0:
        os.fork()
        os._exit(0)  # both the child and the grandchild
    os.waitpid(child, 0)
    _record("run")


@pgpool.handler("stuck", max_attempts=1)
def stuck(payload: dict) -> None:
    """Stuck for ``payload["seconds"]``: in ``time.sleep`` (``how`` "sleep"), or in a C call
    that holds the GIL all along (``how`` "gil": libc's sleep through ctypes.PyDLL)."""
    _record("start")
    if payload["how"] == "gil":
        ctypes.PyDLL(None).sleep(int(payload["seconds"]))
    else:
        time.sleep(payload["seconds"])
    _record("end")


#: Seconds between a ticker's records.
TICK = 0.02


@pgpool.handler("ticker", max_attempts=5)
def ticker(payload: dict) -> None:
    """Run ``payload["seconds"]``, recording "<job id> <attempt> <monotonic ns>" every
    `TICK` seconds, then "<job id> <attempt> end", in ``$TICKS_RECORD/<ppid>-<pid>.log``.
    Whenever handler code runs, a tick follows within `TICK` of running time: the last tick
    of a killed attempt is within `TICK` of the last moment its code ran."""
    job = pgpool.current_job()
    name = os.path.join(os.environ["TICKS_RECORD"], f"{os.getppid()}-{os.getpid()}.log")
    fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        until = time.monotonic_ns() + int(payload["seconds"] * 1e9)
        while True:
            now = time.monotonic_ns()
            os.write(fd, f"{job.id} {job.claim} {now}\n".encode())
            if now >= until:
                break
            time.sleep(TICK)
        os.write(fd, f"{job.id} {job.claim} end\n".encode())
    finally:
        os.close(fd)


@pgpool.handler("gated")
def gated(payload: dict) -> None:
    """Run until the file ``payload["release"]`` exists (at most 60 s): the test decides
    when the job ends, not a guess at how long it takes."""
    _record("start")
    deadline = time.monotonic() + 60
    while not os.path.exists(payload["release"]):
        if time.monotonic() > deadline:
            raise TimeoutError("the test never released this job")
        time.sleep(0.005)
    _record("end")


@pgpool.handler("spawner", max_attempts=1)
def spawner(payload: dict) -> None:
    """Start a shell loop that appends the wall-clock time (``date +%s.%N``) to
    ``payload["file"]`` every 50 ms, write its pid to ``<file>.pid``, then sleep
    ``payload["seconds"]``: shelled-out work that runs for as long as its process does."""
    loop = 'while :; do date +%s.%N >> "$1"; sleep 0.05; done'
    child = subprocess.Popen(["sh", "-c", loop, "sh", payload["file"]])
    with open(payload["file"] + ".tmp", "w") as f:
        f.write(str(child.pid))
    os.replace(payload["file"] + ".tmp", payload["file"] + ".pid")
    time.sleep(payload["seconds"])


#: The exceptions `picky` raises, by name.
_PICKY = {"ConnectionResetError": ConnectionResetError, "TimeoutError": TimeoutError,
          "ValueError": ValueError}


@pgpool.handler("picky", retry=pgpool.Retry(attempts=4, base=30, cap=45, jitter=False,
                                             on=(OSError,), never=(TimeoutError,)))
def picky(payload: dict) -> None:
    """Raises ``payload["raise"]``: retried if an OSError (ConnectionResetError is one),
    except a TimeoutError (an OSError too, but `never` wins); anything else is not."""
    _record("start")
    raise _PICKY[payload["raise"]]("picky failed")


@pgpool.handler("snoozer", max_attempts=2, retry=pgpool.Retry(base=0.05, jitter=False))
def snoozer(payload: dict) -> None:
    """Snoozes ``payload["seconds"]`` on its claims up to ``payload["until_claim"]``, then
    succeeds; records ``attempt=<n>`` (the attempt as counted) on every run."""
    job = pgpool.current_job()
    _record(f"attempt={job.attempt}")
    if job.claim <= payload["until_claim"]:
        raise pgpool.Snooze(payload["seconds"])
    _record("end")


@pgpool.handler("ender")
def ender(payload: dict) -> None:
    """Ends its job with ``pgpool.Discard`` or ``pgpool.Cancel`` (``payload["how"]``) and
    ``payload["reason"]``."""
    _record("start")
    if payload["how"] == "discard":
        raise pgpool.Discard(payload["reason"])
    raise pgpool.Cancel(payload["reason"])


@pgpool.handler("snooze_killed", retry=pgpool.Retry(base=0.05, jitter=False))
def snooze_killed(payload: dict) -> None:
    """On its first claim, raises ``pgpool.Snooze`` and is SIGKILLed while the exception
    is on its way out: the worker never reports it. Succeeds on any later claim."""
    _record("start")
    if pgpool.current_job().claim == 1:
        try:
            raise pgpool.Snooze(3600)
        finally:
            os.kill(os.getpid(), signal.SIGKILL)
    _record("end")


def _spin(seconds: float) -> None:
    """Use ``seconds`` of this process's CPU time."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


@pgpool.handler("burn")
def burn(payload: dict) -> None:
    """Sleep ``sleep`` seconds (no CPU), use ``cpu`` seconds of CPU, then have a child
    process, waited for, use ``child_cpu`` seconds: what ``--fair-by cpu`` measures."""
    time.sleep(payload.get("sleep", 0))
    _spin(payload.get("cpu", 0))
    if payload.get("child_cpu"):
        subprocess.run([sys.executable, "-c", "import time\n"
                        f"end = time.process_time() + {float(payload['child_cpu'])}\n"
                        "while time.process_time() < end: pass"], check=True)
