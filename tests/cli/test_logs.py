"""Log formats: structured events, ``--log-format json`` lines, and text lines as they were."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import socket
from datetime import UTC, datetime, timedelta

import pytest
from commands import JSON_LOGS, MARKER, RUN, run_pgpool
from jsonlogs import events, log_records, only_event
from processes import start_pgpool

import pgpool
from pgpool import logs

#: A text log line, exactly as pgpool has always written it.
TEXT_LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} pgpool\[(\d+)\] (DEBUG|INFO|WARNING|ERROR) "
    r"([\w.]+): (.*)")


def formatted(formatter: logging.Formatter, emit) -> list[str]:
    """The lines ``emit(logger)`` writes through ``formatter``."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"pgpool.test_logs.{id(out)}")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
    return out.getvalue().splitlines()


def test_an_event_is_a_json_line_with_its_fields_beside_the_base_keys() -> None:
    before = datetime.now(UTC)
    (line,) = formatted(logs.JsonFormatter(), lambda log: logs.event(
        log, logging.WARNING, "abandoned", "gave up %d jobs after %gs", 3, 24.0,
        jobs=3, seconds=24.0, queues=["a", "b"], auto=True, nothing=None))
    record = json.loads(line)
    assert record.pop("logger").startswith("pgpool.test_logs.")
    assert record.pop("host") == socket.gethostname()
    stamp = datetime.fromisoformat(record.pop("time"))
    assert stamp.utcoffset() == timedelta(0)  # UTC
    assert before - timedelta(seconds=1) <= stamp <= datetime.now(UTC)
    assert record == {"level": "WARNING", "pid": os.getpid(),
                      "message": "gave up 3 jobs after 24s", "event": "abandoned",
                      "jobs": 3, "seconds": 24.0, "queues": ["a", "b"], "auto": True,
                      "nothing": None}


def test_a_plain_record_has_the_base_keys_only_and_an_exception_its_traceback() -> None:
    def emit(log: logging.Logger) -> None:
        log.info("plain %s", "message")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed")

    plain, failed = (json.loads(line) for line in formatted(logs.JsonFormatter(), emit))
    assert set(plain) == {"time", "level", "host", "logger", "pid", "message"}
    assert plain["message"] == "plain message"
    assert failed["level"] == "ERROR" and failed["message"] == "it failed"
    assert "ValueError: boom" in failed["exception"]


def test_fields_that_are_not_json_values_are_written_as_text() -> None:
    (line,) = formatted(logs.JsonFormatter(), lambda log: logs.event(
        log, logging.INFO, "odd", "odd", when=datetime(2024, 1, 2, tzinfo=UTC),
        text="é\n\"quoted\""))
    assert line.isascii()  # one line, whatever the terminal's encoding
    record = json.loads(line)
    assert record["when"] == "2024-01-02 00:00:00+00:00"
    assert record["text"] == "é\n\"quoted\""


def test_an_event_reads_as_any_other_line_in_text() -> None:
    (line,) = formatted(logging.Formatter(logs.TEXT_FORMAT), lambda log: logs.event(
        log, logging.INFO, "stopping", "%s: stopping", "SIGTERM", signal="SIGTERM"))
    pid, level, _, message = TEXT_LINE.fullmatch(line).groups()
    assert (int(pid), level, message) == (os.getpid(), "INFO", "SIGTERM: stopping")


@pytest.mark.parametrize("field", sorted(logs.BASE_KEYS))
def test_an_event_may_not_shadow_a_base_key(field: str) -> None:
    with pytest.raises(TypeError):  # "reserved", or the name of one of event()'s parameters
        logs.event(logging.getLogger("pgpool.test_logs"), logging.INFO, "x", "x",
                   **{field: 1})


# --- through the real CLI ---------------------------------------------------------------------


def test_text_is_the_default_and_unchanged(db, dsn) -> None:
    pgpool.enqueue_many(db, "noop", [{}] * 5)
    done = run_pgpool(dsn, *RUN, "--procs", "1", "--batch", "7", "--burst")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines and all(TEXT_LINE.fullmatch(line) for line in lines), done.stderr
    messages = [TEXT_LINE.fullmatch(line).group(4) for line in lines]
    assert re.fullmatch(r"dispatcher \S+: 1 workers, batch 7, queues default, kinds \S+",
                        messages[0]), messages
    assert re.fullmatch(r"finished: 5 succeeded, 0 failed and retried later, "
                        r"0 dead-lettered \(0 failed, 0 discarded, 0 cancelled\), "
                        r"0 snoozed, 0 handed back, 0 cut off by the shutdown, "
                        r"in [0-9.]+s \(\d+ jobs/s\); \d+ claims, \d+ ack flushes; batch 7",
                        messages[-1]), messages


def test_json_lines_carry_the_events_and_their_fields(db, dsn) -> None:
    pgpool.enqueue_many(db, "noop", [{}] * 5)
    done = run_pgpool(dsn, *RUN, "--procs", "1", "--queue", "default", "--queue", "other",
                      "--burst", "--log-format", "json")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    records = log_records(done.stderr)
    assert len(records) == len(lines), done.stderr  # every line is a JSON object
    for record in records:
        assert {"time", "level", "host", "logger", "pid", "message"} <= set(record)
        assert datetime.fromisoformat(record["time"]).utcoffset() == timedelta(0)
    started = only_event(done.stderr, "started")
    assert started["owner"].split(":")[1] == str(started["pid"])
    assert {k: started[k] for k in ("procs", "batch", "queues", "kinds")} == {
        "procs": 1, "batch": "auto", "queues": ["default", "other"],
        "kinds": sorted(started["kinds"])}
    assert "noop" in started["kinds"]
    finished = only_event(done.stderr, "finished")
    assert finished["logger"] == "pgpool.dispatcher" and finished["level"] == "INFO"
    assert {k: finished[k] for k in ("done", "retried", "dead", "released", "batch_auto")} == {
        "done": 5, "retried": 0, "dead": 0, "released": 0, "batch_auto": True}
    assert finished["claims"] >= 1 and finished["ack_flushes"] >= 1
    assert finished["batch"] >= 1 and finished["seconds"] > 0 and finished["jobs_per_s"] > 0
    # The message is the text format's, word for word.
    assert finished["message"].startswith("finished: 5 succeeded, 0 failed")


def test_the_shutdown_summary_counts_every_way_a_job_ends_or_is_put_off(db, dsn) -> None:
    pgpool.enqueue(db, "noop", {})
    pgpool.enqueue(db, "picky", {"raise": "ConnectionResetError"})  # retried in 30 s
    pgpool.enqueue(db, "picky", {"raise": "ValueError"})  # dead: its Retry does not retry it
    pgpool.enqueue(db, "ender", {"how": "discard", "reason": MARKER})
    pgpool.enqueue(db, "ender", {"how": "cancel", "reason": MARKER})
    pgpool.enqueue(db, "snoozer", {"until_claim": 1, "seconds": 3600})
    done = run_pgpool(dsn, *RUN, "--burst", **JSON_LOGS)
    assert done.returncode == 0, done.stderr
    finished = only_event(done.stderr, "finished")
    assert {k: finished[k] for k in ("done", "retried", "dead", "discarded", "cancelled",
                                     "snoozed", "dead_lettered", "released", "interrupted")
            } == {"done": 1, "retried": 1, "dead": 1, "discarded": 1, "cancelled": 1,
                  "snoozed": 1, "dead_lettered": 3, "released": 0, "interrupted": 0}, done.stderr
    assert finished["message"].startswith(
        "finished: 1 succeeded, 1 failed and retried later, 3 dead-lettered (1 failed, "
        "1 discarded, 1 cancelled), 1 snoozed, 0 handed back, 0 cut off by the shutdown, in ")


@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_the_environment_sets_the_format_and_the_option_wins(db, dsn) -> None:
    from_env = run_pgpool(dsn, *RUN, "--burst", **JSON_LOGS)
    assert from_env.returncode == 0, from_env.stderr
    assert only_event(from_env.stderr, "finished")["done"] == 0
    option_wins = run_pgpool(dsn, *RUN, "--burst", "--log-format", "TEXT", **JSON_LOGS)
    assert option_wins.returncode == 0, option_wins.stderr
    lines = option_wins.stderr.splitlines()
    assert lines and log_records(option_wins.stderr) == []
    assert all(TEXT_LINE.fullmatch(line) for line in lines)


def test_every_subcommand_takes_the_option(dsn) -> None:
    migrated = run_pgpool(dsn, "migrate", "--log-format", "json")
    assert migrated.returncode == 0, migrated.stderr
    status = run_pgpool(dsn, "status", "--json", "--log-format", "json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["hosts"] == []


def test_a_signal_is_the_stopping_event(db, dsn) -> None:
    host = start_pgpool(dsn, *RUN, "--procs", "1")
    host.event("started")
    assert host.stop(signal.SIGINT) == 0, host.stderr
    (stopping,) = host.events("stopping")
    assert stopping["signal"] == "SIGINT"
    assert stopping["message"].startswith("SIGINT: stopping")


def test_json_lines_about_an_attempt_name_the_job_and_never_its_payload(db, dsn) -> None:
    retried = pgpool.enqueue(db, "fail", {"secret": MARKER})
    dead = pgpool.enqueue(db, "fail", {"secret": MARKER}, max_attempts=1)
    done = run_pgpool(dsn, *RUN, "--procs", "1", "--burst", "--log-format", "json")
    assert done.returncode == 0, done.stderr
    assert MARKER not in done.stderr + done.stdout
    retry = next(e for e in events(done.stderr, "job_retry") if e["job_id"] == retried)
    assert (retry["kind"], retry["attempt"], retry["cause"], retry["level"]) == (
        "fail", 1, "ValueError", "WARNING")
    assert retry["delay"] > 0 and retry["host"] == socket.gethostname()
    buried = only_event(done.stderr, "job_dead")
    assert (buried["job_id"], buried["kind"], buried["attempt"], buried["level"]) == (
        dead, "fail", 1, "ERROR")
