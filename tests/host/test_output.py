"""What handlers print: prefixed with the job, bounded per job (`pgpool.worker.output`), in-process
and through a real `pgpool run`."""

from __future__ import annotations

import io

import pytest
from commands import RUN, run_pgpool

import pgpool
from pgpool.worker.output import LIMIT, JobStream


def test_lines_name_their_job_and_pass_through_between_jobs() -> None:
    raw = io.StringIO()
    stream = JobStream(raw, limit=1000)
    stream.write("before\n")
    stream.begin("thumb#7")
    stream.write("one\ntw")
    stream.write("o\nthree")
    stream.end()
    stream.write("after\n")
    assert raw.getvalue() == "before\n[thumb#7] one\n[thumb#7] two\n[thumb#7] three\nafter\n"


def test_each_job_writes_at_most_the_limit_and_is_told_what_was_dropped() -> None:
    raw = io.StringIO()
    stream = JobStream(raw, limit=10)
    stream.begin("k#1")
    stream.write("0123456789abcdef\n")
    stream.end()
    stream.begin("k#2")  # a new job has the whole limit again
    stream.write("ok\n")
    stream.end()
    assert raw.getvalue() == ("[k#1] 0123456789\n"
                              "[k#1] ... 7 more characters of output dropped (a job may "
                              "write 10 per stream)\n"
                              "[k#2] ok\n")


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_a_job_printing_20_mb_does_not_flood_the_dispatchers_output(db, dsn):
    job = pgpool.enqueue(db, "chatty", {"chars": 20_000_000})
    done = run_pgpool(dsn, *RUN, "--procs", "1", "--burst")
    assert done.returncode == 0, done.stderr[-2000:]
    for out in (done.stdout, done.stderr):
        mine = [line for line in out.splitlines() if line.startswith(f"[chatty#{job}] ")]
        # Its 64 KiB in 100-character lines, and the line saying what was dropped.
        assert len(mine) == LIMIT // 100 + 2, len(mine)
        assert "more characters of output dropped" in mine[-1]
        assert len(out) < 2 * LIMIT + 10_000
