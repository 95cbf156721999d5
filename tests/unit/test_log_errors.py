"""What a log line shows of a failed job's error (`pgpool.logs.error_message`): the first
line of its exception's type and message, secrets masked (`pgpool.logs.mask_secrets`),
control characters escaped, at most 300 characters; and the summary's percentiles and
durations."""

from __future__ import annotations

import io
import json
import logging

import pytest
from commands import SECRET

from pgpool import logs
from pgpool.horizon import run_time
from pgpool.host.summary import KEEP, MOST_SETS, RunTimes
from pgpool.worker.main import MAX_ERROR_CHARS, format_error


def error_of(raise_it) -> str:
    """The error text a worker stores for what ``raise_it()`` raises."""
    try:
        raise_it()
    except Exception as exc:  # any, as a handler's
        return format_error(exc)
    raise AssertionError("it did not raise")


@pytest.mark.parametrize(("given", "shown"), [
    # Every form of DSN `pgpool.cli.passwords.mask_password` masks in --dsn, alone...
    (f"postgresql://u:{SECRET}@h/db", "postgresql://u:***@h/db"),
    (f"postgres://u:{SECRET}@h1,h2:5/db?sslmode=require&password={SECRET}",
     "postgres://u:***@h1,h2:5/db?sslmode=require&password=***"),
    (f"host=h password={SECRET} user=u", "host=h password=*** user=u"),
    (f"password = '{SECRET} \\' x' host=h", "password = *** host=h"),
    # ... and inside a message, with any scheme and a password holding an @.
    (f"could not connect to 'postgresql://app:{SECRET}@db:5432/prod': refused",
     "could not connect to 'postgresql://app:***@db:5432/prod': refused"),
    (f"redis://:{SECRET}@cache:6379/0 and amqp://u:p@{SECRET}@mq/vhost",
     "redis://:***@cache:6379/0 and amqp://u:***@mq/vhost"),
    # Named secrets: key/value pairs, query parameters, a dict's and a JSON object's.
    (f"settings {{'password': '{SECRET}', 'user': 'app'}}",
     "settings {'password': ***, 'user': 'app'}"),
    (f'{{"db_password": "{SECRET}", "port": 5432}}', '{"db_password": ***, "port": 5432}'),
    (f"DB_PASSWORD={SECRET}; API_KEY={SECRET}", "DB_PASSWORD=***; API_KEY=***"),
    (f"GET /x?access_token={SECRET}&page=2 (secret_key={SECRET})",
     "GET /x?access_token=***&page=2 (secret_key=***)"),
    # What is not a secret stays as it is.
    ("password authentication failed for user \"app\"",
     "password authentication failed for user \"app\""),
    ("no password supplied; passwordless=1 tokens=3",
     "no password supplied; passwordless=1 tokens=3"),
    ("postgresql://app@db/prod?sslmode=require", "postgresql://app@db/prod?sslmode=require"),
    ("see https://example.com/a:b@c", "see https://example.com/a:b@c"),
], ids=["uri", "uri-query-multihost", "key-value", "key-value-quoted", "uri-in-text",
        "other-schemes", "dict", "json", "env-style", "query-and-parens", "auth-failure",
        "look-alikes", "uri-without-password", "colon-in-path"])
def test_secrets_are_masked_as_the_dsns_password_is(given: str, shown: str) -> None:
    assert logs.mask_secrets(given) == shown


def test_the_message_is_the_first_line_of_the_exception_after_its_frames() -> None:
    def nested() -> None:
        raise KeyError("DATABASE_URL")

    error = error_of(nested)
    assert error.startswith(logs.TRACEBACK_HEADER) and "in nested" in error
    assert logs.error_message(error) == "KeyError: 'DATABASE_URL'"

    def two_lines() -> None:
        exc = ValueError(f"bad dsn postgresql://a:{SECRET}@db/x\nsecond line")
        exc.add_note("a note")
        raise exc

    assert logs.error_message(error_of(two_lines)) == "ValueError: bad dsn postgresql://a:***@db/x"

    def custom() -> None:
        class RenderError(Exception):
            pass

        raise RenderError()

    assert logs.error_message(error_of(custom)).endswith("RenderError")


def test_a_long_tracebacks_frames_are_cut_at_a_line_so_the_message_is_found() -> None:
    def ping(n: int) -> None:  # two functions in turns: Python shortens no repeat
        if n:
            pong(n - 1)
        raise RuntimeError("at the bottom")

    def pong(n: int) -> None:
        ping(n)

    error = error_of(lambda: ping(100))
    assert len(error) <= MAX_ERROR_CHARS + 100
    header, cut, *frames, message = error.splitlines()
    assert (header, cut, message) == (logs.TRACEBACK_HEADER, "  ...", "RuntimeError: at the bottom")
    assert all(line.startswith("  ") for line in frames)  # whole lines, indented
    assert logs.error_message(error) == "RuntimeError: at the bottom"


def test_text_that_is_no_traceback_shows_its_first_line() -> None:
    # Timeouts, a dead worker, a Discard's reason, a payload that does not fit its type...
    assert logs.error_message("timeout: killed after 1s") == "timeout: killed after 1s"
    assert logs.error_message("\n  the reason\nmore") == "the reason"
    assert logs.error_message("") == ""


def test_the_message_is_bounded_and_escapes_control_characters() -> None:
    long = logs.error_message(error_of(lambda: (_ for _ in ()).throw(ValueError("x" * 5000))))
    assert len(long) == logs.MAX_MESSAGE_CHARS and long.endswith("...")
    assert long.startswith("ValueError: xxx")
    # Masked before it is cut: a password that straddles the end never shows in part.
    edge = "y" * (logs.MAX_MESSAGE_CHARS - 20) + f" password={SECRET}"
    assert SECRET[:3] not in logs.error_message(edge)
    assert logs.error_message("red \x1b[31malert\x07") == "red \\x1b[31malert\\x07"


def emitted(formatter: logging.Formatter, level: int) -> str:
    """What an event at ``level`` with a formatted traceback writes through ``formatter``
    to a logger at INFO."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"pgpool.test_log_errors.{id(out)}")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logs.event(logger, level, "x", "job %d failed", 7, exc_text="Traceback\n  here", job_id=7)
    logger.removeHandler(handler)
    return out.getvalue()


def test_an_events_formatted_traceback_goes_where_a_records_would() -> None:
    line, *under = emitted(logs.TextFormatter(), logging.WARNING).splitlines()
    assert line.endswith("WARNING pgpool.test_log_errors." + line.split(".")[-1])
    assert line.endswith(": job 7 failed") and under == ["Traceback", "  here"]
    record = json.loads(emitted(logs.JsonFormatter(), logging.WARNING))
    assert (record["message"], record["exception"], record["job_id"]) == (
        "job 7 failed", "Traceback\n  here", 7)
    assert emitted(logs.TextFormatter(), logging.DEBUG) == ""  # below the logger's level


def test_run_times_give_each_kinds_exact_percentiles() -> None:
    runs = RunTimes()
    for i in range(100, 0, -1):
        runs.add("a", i / 1000)  # 1 to 100 ms
    runs.add("b", 2.5)
    runs.fold()  # few: kept as they are
    runs.add("b", 0.5)
    assert runs.take() == {"a": (100, 0.050, 0.095), "b": (2, 0.5, 2.5)}
    assert runs.take() == {}  # afresh


def test_past_a_fold_of_more_than_keep_run_times_are_sampled_fairly() -> None:
    # A busy kind: 3 folds of 10 x KEEP fast runs, a fold of half slow ones, and enough
    # folds after it that the samples are merged. Each sample stands for the runs it was
    # drawn from: the slow runs are 1.4% of all, past the p95 (5.6% of the samples).
    runs = RunTimes()
    for _ in range(3):
        for i in range(10 * KEEP):
            runs.add("busy", 0.001 + (i % 100) * 1e-6)
        runs.fold()
    for i in range(KEEP + 1):
        runs.add("busy", 1.0 if i % 2 else 0.001)
    runs.fold()
    for _ in range(MOST_SETS - 3):  # one set more than are kept apart: merged, weighed
        for _ in range(KEEP + 1):
            runs.add("busy", 0.001)
        runs.fold()
    n, p50, p95 = runs.take()["busy"]
    assert n == 30 * KEEP + (MOST_SETS - 2) * (KEEP + 1)
    assert p50 < 0.0011 and p95 < 0.0011


@pytest.mark.parametrize(("seconds", "shown"), [
    (0.0000042, "0.0042ms"), (0.00042, "0.42ms"), (0.0015, "1.5ms"), (0.0123, "12.3ms"),
    (0.2123, "212.3ms"), (1.254, "1.25s"), (14.23, "14.2s"), (90, "90.0s"), (600, "10m"),
])
def test_run_times_are_written_short_and_precise(seconds: float, shown: str) -> None:
    assert run_time(seconds) == shown
