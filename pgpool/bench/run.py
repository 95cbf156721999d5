"""The bench's stages in order (see `pgpool.bench` for the contract), and the figures that
combine them."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import psycopg

from ..db import dsn as dsnlib
from ..db import schema
from .ceilings import CYCLES, combine_ceilings, measure_ceilings
from .drive import drive_dispatcher
from .figures import predict
from .options import BenchOptions
from .pickup import measure_pickup
from .profiles import calibrate, payloads
from .progress import Progress
from .scratch import add_backlog, expect_empty, scratch_schema, server_facts
from .seed import compare_loads


def run(opts: BenchOptions, progress: Progress) -> dict[str, Any]:
    """Run the whole benchmark and return every figure as a JSON-ready dict.

    Creates and always drops its own schema; raises `BenchError` if the jobs did not drain.
    """
    with dsnlib.connect(opts.dsn, autocommit=True) as admin:
        server = server_facts(admin)
        with scratch_schema(admin, opts.dsn, progress) as scratch:
            report = _stages(opts, scratch.dsn, admin, progress)
    return {"server": server, "schema": scratch.name,
            "options": {"jobs": opts.jobs, "procs": opts.procs, "batch": opts.batch,
                        "profile": opts.profile, "backlog": opts.backlog,
                        "max_claims_per_sec": opts.max_claims_per_sec}, **report}


def _stages(opts: BenchOptions, dsn: str, admin: psycopg.Connection,
            progress: Progress) -> dict[str, Any]:
    """Every stage, in the scratch schema ``dsn`` reaches; ``admin`` sees the database."""
    with (dsnlib.connect(dsn, autocommit=True) as conn,
          tempfile.TemporaryDirectory(prefix="pgpool-bench-") as tmp):
        schema.migrate(conn)
        progress.step("calibrating the job profile on this host")
        rounds, handle_time = calibrate(opts.profile)
        jobs = payloads(opts.profile, opts.jobs, rounds)

        progress.step(f"seeding {opts.jobs} jobs: enqueue_many vs raw COPY")
        seed = compare_loads(conn, jobs)
        if opts.backlog:
            progress.step(f"backlog: inserting {opts.backlog} jobs due in a day")
            add_backlog(conn, opts.backlog)

        runs: list[dict[str, Any]] = []
        if opts.batch != "auto":
            runs.append(measure_ceilings(conn, dsn, jobs, batch=opts.batch,
                                         backlog=opts.backlog, when="before the drive",
                                         progress=progress))
        drive = drive_dispatcher(opts, dsn, admin, conn, jobs, Path(tmp), progress)
        expect_empty(conn, "the dispatcher", opts.backlog)
        while len(runs) < 2:  # with auto, both runs follow the drive: its batch is known then
            runs.append(measure_ceilings(conn, dsn, jobs, batch=drive["batch"],
                                         backlog=opts.backlog, when="after the drive",
                                         progress=progress))

        pickup = measure_pickup(opts, dsn, conn, Path(tmp), progress)
        expect_empty(conn, "the pickup dispatcher", opts.backlog)

    ceiling = combine_ceilings(runs, drive["batch"])
    for cycle in CYCLES:
        drive[f"ratio_to_{cycle}"] = drive["steady_jobs_per_s"] / ceiling[cycle]["jobs_per_s"]
    # What the workers could do if they had their cores to themselves, at the CPU a job
    # took in them (all their CPU, start-up and hand-offs included, over the jobs): the
    # cpu profile's target. Not the calibrated time: a job's speed in the workers, both
    # busy, differs from the calibration's, run alone seconds earlier (by 15-30% either
    # way on a small VM).
    drive["worker_cpu_per_job_ms"] = 1000 * drive["cpu_seconds"]["workers"] / max(
        1, drive["jobs_drained"])
    drive["workers_only_jobs_per_s"] = opts.procs / max(1e-9, drive["worker_cpu_per_job_ms"]
                                                        / 1000)
    drive["predicted_jobs_per_s"] = predict(opts.procs, drive["batch"],
                                            drive["claim_rtt_p50_ms"] / 1000, handle_time)
    return {
        "calibration": {"cpu_rounds": rounds, "handle_time_ms": handle_time * 1000},
        "seed": seed,
        "ceiling": ceiling,
        "drive": drive,
        "pickup": pickup,
    }
