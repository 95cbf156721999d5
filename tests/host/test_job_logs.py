"""What a host logs of the jobs it runs (issue 37): a failure's error, as much as
``--log-errors`` allows and its secrets masked; each success with ``--log-jobs``; the
periodic ``summary`` of what ended; and the Quickstart's run step, which shows them."""

from __future__ import annotations

import itertools
import re
import time
from datetime import datetime

import pytest
from commands import JSON_LOGS, MARKER, RUN, SECRET, run_pgpool
from dbtools import one
from jsonlogs import events, only_event
from places import ROOT
from processes import start_pgpool
from waits import wait_until

import pgpool

#: What the ``leaky`` handler's exception carries: a password, and a second line.
LEAKY = {"password": SECRET, "more": MARKER}
#: The first line of its error, as a log shows it: both copies of the password masked.
FIRST_LINE = ("ConnectionError: could not connect to postgresql://app:***@db:5432/prod "
              "(password=***)")
#: A text log line (as tests/cli/test_logs.py reads it): its message is the last group.
TEXT_LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} pgpool\[(\d+)\] (DEBUG|INFO|WARNING|ERROR) "
    r"([\w.]+): (.*)")


def make_due(db) -> None:
    """Skip a retry's backoff instead of sleeping through it."""
    db.execute("UPDATE pgpool_jobs SET run_at = now(), state = 'ready' "
               "WHERE state IN ('ready', 'scheduled')")


# --- a failure's error ---------------------------------------------------------------------


def test_a_failure_logs_the_first_line_of_its_error_masked_by_default(db, dsn) -> None:
    retried = pgpool.enqueue(db, "leaky", LEAKY)  # 2 attempts
    dead = pgpool.enqueue(db, "leaky", LEAKY, max_attempts=1)
    pgpool.enqueue(db, "ender", {"how": "cancel", "reason": f"token={SECRET} expired"})
    done = run_pgpool(dsn, *RUN, "--burst", **JSON_LOGS)
    assert done.returncode == 0, done.stderr
    # The password is masked, and the second line (which quotes the payload) left out.
    assert SECRET not in done.stderr and MARKER not in done.stderr, done.stderr
    retry = only_event(done.stderr, "job_retry")
    assert (retry["job_id"], retry["cause"], retry["error"]) == (
        retried, "ConnectionError", FIRST_LINE)
    assert retry["outcome"] == "retried" and retry["seconds"] >= 0
    assert FIRST_LINE in retry["message"] and "exception" not in retry
    buried = only_event(done.stderr, "job_dead")
    assert (buried["job_id"], buried["error"], buried["outcome"]) == (dead, FIRST_LINE, "dead")
    # A discarded or cancelled job's reason is its error text.
    assert only_event(done.stderr, "job_cancelled")["error"] == "token=*** expired"
    assert events(done.stderr, "job_traceback") == []  # at DEBUG only
    # What the log leaves out, the job keeps: `pgpool jobs show` shows it.
    (error,) = one(db, "SELECT last_error FROM pgpool_jobs WHERE id = %s", retried)
    assert SECRET in error and f"second line: {MARKER}" in error


def test_by_default_the_traceback_is_logged_at_debug(db, dsn) -> None:
    pgpool.enqueue(db, "leaky", LEAKY)
    done = run_pgpool(dsn, *RUN, "--burst", "--log-level", "DEBUG", **JSON_LOGS)
    assert done.returncode == 0, done.stderr
    retry = only_event(done.stderr, "job_retry")
    assert retry["error"] == FIRST_LINE and "exception" not in retry
    trace = only_event(done.stderr, "job_traceback")
    assert (trace["level"], trace["job_id"], trace["attempt"]) == ("DEBUG", retry["job_id"], 1)
    assert trace["exception"].startswith("Traceback (most recent call last):\n")
    assert trace["exception"].endswith(f"{FIRST_LINE}\nsecond line: {MARKER}")
    assert SECRET not in done.stderr


def test_traceback_logs_the_whole_error_masked_under_the_line(db, dsn) -> None:
    job = pgpool.enqueue(db, "leaky", LEAKY)
    done = run_pgpool(dsn, *RUN, "--burst", "--log-errors", "traceback", **JSON_LOGS)
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stderr
    retry = only_event(done.stderr, "job_retry")
    assert retry["error"] == FIRST_LINE
    trace = retry["exception"]
    assert trace.startswith("Traceback (most recent call last):\n")
    assert ", in leaky\n" in trace  # the handler's frame
    assert trace.endswith(f"{FIRST_LINE}\nsecond line: {MARKER}")
    assert events(done.stderr, "job_traceback") == []  # it is on the line already
    # In text, from the environment: under the line, as a record's traceback is.
    make_due(db)
    text = run_pgpool(dsn, *RUN, "--burst", PGPOOL_LOG_ERRORS="traceback")
    assert text.returncode == 0, text.stderr
    assert SECRET not in text.stderr
    lines = text.stderr.splitlines()
    failed = next(i for i, line in enumerate(lines) if f"job {job} (leaky" in line)
    assert TEXT_LINE.fullmatch(lines[failed]).group(2) == "ERROR"  # its last attempt
    assert f"({FIRST_LINE})" in lines[failed]
    assert lines[failed + 1] == "Traceback (most recent call last):"
    assert f"second line: {MARKER}" in lines


def test_none_logs_the_exceptions_type_only_even_at_debug(db, dsn) -> None:
    pgpool.enqueue(db, "leaky", LEAKY)
    pgpool.enqueue(db, "ender", {"how": "discard", "reason": MARKER})
    done = run_pgpool(dsn, *RUN, "--burst", "--log-errors", "none", "--log-level", "DEBUG",
                      **JSON_LOGS)
    assert done.returncode == 0, done.stderr
    retry = only_event(done.stderr, "job_retry")
    assert retry["cause"] == "ConnectionError"
    assert "error" not in retry and "exception" not in retry
    assert "error" not in only_event(done.stderr, "job_discarded")  # nor a reason
    assert events(done.stderr, "job_traceback") == []
    for leak in ("could not connect", "Traceback", SECRET, MARKER):
        assert leak not in done.stderr, leak


def test_a_job_its_worker_died_with_logs_how_long_it_ran(db, dsn) -> None:
    pgpool.enqueue(db, "spin", {})  # killed at its 1 s timeout; one attempt
    done = run_pgpool(dsn, *RUN, "--burst", **JSON_LOGS)
    assert done.returncode == 0, done.stderr
    buried = only_event(done.stderr, "job_dead")
    assert buried["cause"].startswith("timeout") and buried["error"] == buried["cause"]
    assert 1.0 <= buried["seconds"] < 30, buried


# --- each job's end, and the summary ---------------------------------------------------------


def test_log_jobs_logs_each_success_with_its_run_time(db, dsn) -> None:
    pgpool.enqueue_many(db, "record", [{"sleep": 0.05}] * 3)
    failed = pgpool.enqueue(db, "fail", {}, max_attempts=1)
    done = run_pgpool(dsn, *RUN, "--burst", "--log-jobs", **JSON_LOGS)
    assert done.returncode == 0, done.stderr
    ended = events(done.stderr, "job_done")
    assert len(ended) == 3 and failed not in {e["job_id"] for e in ended}
    for e in ended:
        assert (e["level"], e["kind"], e["attempt"], e["outcome"]) == (
            "INFO", "record", 1, "done")
        assert 0.05 <= e["seconds"] < 10, e
    # A failure's end is its own line, with its run time too, not a second one.
    assert only_event(done.stderr, "job_dead")["job_id"] == failed
    # Off by default.
    pgpool.enqueue(db, "record", {})
    quiet = run_pgpool(dsn, *RUN, "--burst", **JSON_LOGS)
    assert quiet.returncode == 0 and only_event(quiet.stderr, "finished")["done"] == 1
    assert events(quiet.stderr, "job_done") == []


COUNTS = ("done", "failed", "retried", "dead", "dead_lettered", "discarded", "cancelled",
          "snoozed", "released", "interrupted", "lost", "parked")


@pytest.mark.soak  # a host run through several summary intervals: `make soak-test`
def test_the_summary_counts_what_ended_since_the_line_before(db, dsn) -> None:
    host = start_pgpool(dsn, *RUN, PGPOOL_LOG_SUMMARY="1s")
    host.event("started")
    pgpool.enqueue_many(db, "record", [{}] * 4)
    pgpool.enqueue(db, "picky", {"raise": "ConnectionResetError"})  # retried in 30 s
    pgpool.enqueue(db, "picky", {"raise": "ValueError"})  # dead: its Retry does not retry it
    pgpool.enqueue(db, "ender", {"how": "discard", "reason": "x"})
    pgpool.enqueue(db, "ender", {"how": "cancel", "reason": "y"})
    pgpool.enqueue(db, "snoozer", {"until_claim": 1, "seconds": 3600})
    expected = {"done": 4, "failed": 2, "retried": 1, "dead": 1, "dead_lettered": 3,
                "discarded": 1, "cancelled": 1, "snoozed": 1, "released": 0,
                "interrupted": 0, "lost": 0, "parked": 0}

    def totals() -> dict[str, int]:
        return {k: sum(e[k] for e in host.events("summary")) for k in COUNTS}

    wait_until(lambda: totals() == expected, "summaries of every job", timeout=30)
    lines = host.events("summary")
    for line in lines:
        assert line["level"] == "INFO" and line["logger"] == "pgpool.dispatcher"
        assert line["failed"] == line["retried"] + line["dead"]
        assert line["dead_lettered"] == line["dead"] + line["discarded"] + line["cancelled"]
        assert line["seconds"] > 0
        for kind in line["run_times"].values():
            assert 0 < kind["p50"] <= kind["p95"] and kind["runs"] >= 1
    runs: dict[str, int] = {}
    for line in lines:
        for kind, times in line["run_times"].items():
            runs[kind] = runs.get(kind, 0) + times["runs"]
    assert runs == {"record": 4, "picky": 2, "ender": 2, "snoozer": 1}
    # At most one line per interval...
    stamps = [datetime.fromisoformat(line["time"]) for line in lines]
    assert all((b - a).total_seconds() >= 0.9 for a, b in itertools.pairwise(stamps)), stamps
    # ... and none while nothing ends.
    time.sleep(2.5)
    assert len(host.events("summary")) == len(lines)
    assert host.stop() == 0, host.stderr
    # The shutdown's summary counts the same, under the same names, since the start.
    finished = only_event(host.stderr, "finished")
    assert {k: finished[k] for k in COUNTS} == expected


@pytest.mark.soak  # a host run past the summary interval: `make soak-test`
def test_the_summary_can_be_turned_off(db, dsn) -> None:
    for every, some in (("0.2s", True), ("off", False)):
        # The quick job's line comes while the slow one runs, long before the host exits.
        pgpool.enqueue(db, "record", {})
        pgpool.enqueue(db, "record", {"sleep": 1.5})
        done = run_pgpool(dsn, *RUN, "--burst", "--procs", "2", "--log-summary", every,
                          **JSON_LOGS)
        assert done.returncode == 0, done.stderr
        assert bool(events(done.stderr, "summary")) == some, (every, done.stderr)


# --- the Quickstart ------------------------------------------------------------------------

QUICKSTART = ROOT / "docs" / "getting-started" / "quickstart.md"
#: The messages of the Quickstart's run step, with the kind it runs.
STARTED = r"dispatcher \S+: \d+ workers, batch auto, queues default, kinds {kind}"
SUMMARY = (r"in the last [0-9.]+m?s: 1 succeeded; run time p50/p95: {kind} [0-9.]+m?s/"
           r"[0-9.]+m?s \(1 run\)")
RETRY = (r"job \d+ \({kind}, attempt 1/\d+\) failed \(\w+: .+\) after [0-9.]+m?s; "
         r"retry in [0-9.]+s")


@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_the_quickstarts_run_step_shows_what_a_host_logs(db, dsn) -> None:
    page = QUICKSTART.read_text()
    step = page[page.index("## 3. Run a host"):page.index("## Try it")]
    shown = [TEXT_LINE.fullmatch(line).group(4)
             for block in re.findall(r"```text\n(.*?)\n```", step, re.S)
             for line in block.splitlines()]
    assert len(shown) == 3, shown
    for message, pattern in zip(shown, (STARTED, SUMMARY, RETRY), strict=True):
        assert re.fullmatch(pattern.format(kind="thumbnail"), message), message
    # A host with the defaults: the summary comes within seconds of the job's end.
    pgpool.enqueue(db, "record", {})
    host = start_pgpool(dsn, *RUN, PGPOOL_LOG_FORMAT="text")
    started = host.wait_for_line(lambda line: "dispatcher " in line, "the start")
    summary = host.wait_for_line(lambda line: "in the last" in line, "the summary",
                                 timeout=15)
    messages = [TEXT_LINE.fullmatch(line.rstrip("\n")).group(4) for line in (started, summary)]
    assert re.fullmatch(STARTED.format(kind=r"\S+"), messages[0]), messages
    assert re.fullmatch(SUMMARY.format(kind="record"), messages[1]), messages
    # And a failure, as it happens.
    pgpool.enqueue(db, "fail", {})
    failed = host.wait_for_line(lambda line: "(fail, attempt 1/" in line, "the failure")
    assert re.fullmatch(RETRY.format(kind="fail"), TEXT_LINE.fullmatch(failed.rstrip("\n"))
                        .group(4)), failed
    assert host.stop() == 0, host.stderr


@pytest.mark.parametrize("errors", ["message", "traceback"])
def test_what_a_line_shows_of_an_error_is_one_line_at_most_300_characters(
        db, dsn, errors: str) -> None:
    pgpool.enqueue(db, "huge_error", {})  # a 5 MB message, one attempt
    done = run_pgpool(dsn, *RUN, "--burst", "--log-errors", errors, **JSON_LOGS)
    assert done.returncode == 0, done.stderr
    buried = only_event(done.stderr, "job_dead")
    assert len(buried["error"]) == 300 and buried["error"].endswith("...")
    assert buried["error"].startswith("ValueError: xxx")
    # The traceback is the stored error's, bounded as it is (4,000 characters).
    assert ("exception" in buried) == (errors == "traceback")
    assert len(buried.get("exception", "")) < 4_500
