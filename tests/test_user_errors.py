"""Errors a user can cause: one clear line, exit status 2, no traceback, nothing lost.

The CLI half runs the real ``python -m pgpool`` in a subprocess against the real test
PostgreSQL; the library half calls `pgpool.enqueue` / `pgpool.enqueue_many` on the ``db``
connection. Every failure case also checks that nothing was half-written: no job row, no
changed schema, no payload or password echoed back to the user.
"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import psycopg
import pytest
from conftest import (
    MARKER,
    RUN,
    SECRET,
    UNREACHABLE,
    assert_user_error,
    make_version_1_schema,
    run_pgpool,
    start_pgpool,
    without_password_warning,
)
from psycopg.conninfo import make_conninfo

import pgpool
from pgpool import ConfigError, PayloadError, PgpoolError, SchemaError

# --- helpers --------------------------------------------------------------------------------


def count(db: psycopg.Connection, table: str = "pgpool_jobs") -> int:
    return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def has_table(conn: psycopg.Connection, name: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()[0]


def stored_payloads(db: psycopg.Connection) -> list[object]:
    """Payloads as a worker will see them: the stored jsonb text, decoded by orjson."""
    rows = db.execute("SELECT payload::text FROM pgpool_jobs ORDER BY id").fetchall()
    return [orjson.loads(text) for (text,) in rows]


# --- CLI: the database cannot be reached or used ---------------------------------------------


@pytest.mark.parametrize("args", [
    ("run", "--handlers", "testjobs", "--burst"),
    ("migrate",),
    ("enqueue", "record", '{"a": 1}'),
], ids=["run", "migrate", "enqueue"])
def test_cli_unreachable_dsn(args: tuple[str, ...]) -> None:
    line = assert_user_error(run_pgpool(UNREACHABLE, *args), "cannot connect", "127.0.0.1:1")
    assert "refused" in line.lower()


def test_cli_unreachable_dsn_from_option() -> None:
    done = run_pgpool(UNREACHABLE, "migrate", "--dsn", UNREACHABLE)
    assert_user_error(without_password_warning(done), "cannot connect")


@pytest.mark.parametrize(("command", "source"), [
    (("migrate",), "PGPOOL_DSN"),
    (("migrate",), "--dsn"),
    (("enqueue", "record", "{}"), "PGPOOL_DSN"),
    (("run", "--handlers", "testjobs", "--burst"), "--dsn"),
], ids=["migrate-env", "migrate-option", "enqueue-env", "run-option"])
def test_cli_unparseable_dsn(command: tuple[str, ...], source: str) -> None:
    bad = "not a dsn ==="
    args = (*command, "--dsn", bad) if source == "--dsn" else command
    assert_user_error(run_pgpool(bad, *args),
                      f"{source} is not a valid PostgreSQL connection string")


@pytest.mark.parametrize(("command", "bad"), [
    (("migrate",), f"postgresql://x:{SECRET}@h:notaport/db"),
    (("enqueue", "record", "{}"), f"postgresql://x:{SECRET}@127.0.0.1:notaport/db"),
], ids=["migrate-named-host", "enqueue-ip-host"])
def test_cli_dsn_with_non_numeric_port(command: tuple[str, ...], bad: str) -> None:
    # A syntax mistake in the DSN, to be reported as one, naming the port: not as a failed
    # connection with "check that the server is running" (or a DNS error about "h").
    line = assert_user_error(run_pgpool(bad, *command),
                             "not a valid PostgreSQL connection string", "port")
    assert "notaport" in line


@pytest.mark.parametrize("bad", [
    f"host=127.0.0.1 password={SECRET} bogus_option=1",
    f"postgresql://u:{SECRET}@127.0.0.1:5432/db?nosuchparam=1",
    "host='unterminated",
], ids=["unknown-keyword", "unknown-uri-param", "unterminated-quote"])
def test_cli_malformed_dsn_variants(bad: str) -> None:
    assert_user_error(run_pgpool(bad, "migrate"), "not a valid PostgreSQL connection string")


@pytest.mark.parametrize("source", ["env", "option"])
def test_cli_empty_dsn(source: str) -> None:
    if source == "env":
        assert_user_error(run_pgpool("", "migrate"), "PGPOOL_DSN is empty")
    else:
        assert_user_error(run_pgpool("", "migrate", "--dsn", " "), "--dsn is empty")


@pytest.mark.parametrize("args", [
    ("migrate",),
    ("run", "--handlers", "testjobs", "--burst"),
], ids=["migrate", "run"])
def test_cli_database_does_not_exist(server_dsn: str, args: tuple[str, ...]) -> None:
    nope = make_conninfo(server_dsn, dbname="nope_db")
    assert_user_error(run_pgpool(nope, *args), "cannot connect", '"nope_db" does not exist')


def test_cli_user_does_not_exist(server_dsn: str) -> None:
    nope = make_conninfo(server_dsn, user="nope_user")
    assert_user_error(run_pgpool(nope, "migrate"), "cannot connect",
                      '"nope_user" does not exist')


@pytest.mark.own_schema
def test_cli_run_without_schema(dsn: str) -> None:
    assert_user_error(run_pgpool(dsn, "run", "--handlers", "testjobs", "--burst"),
                      "pgpool migrate")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert not has_table(conn, "pgpool_jobs"), "run must not create tables"
        assert not has_table(conn, "pgpool_schema_version")


@pytest.mark.own_schema
def test_cli_run_with_older_schema(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE pgpool_schema_version (version integer PRIMARY KEY, "
                     "description text NOT NULL, applied_at timestamptz DEFAULT now())")
    assert_user_error(run_pgpool(dsn, "run", "--handlers", "testjobs", "--burst"),
                      "pgpool migrate")


@pytest.mark.own_schema
def test_cli_enqueue_with_older_schema(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        make_version_1_schema(conn)
        assert_user_error(run_pgpool(dsn, "enqueue", "record", "{}"),
                          "run `pgpool migrate` to upgrade")
        assert conn.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0


@pytest.mark.own_schema
def test_cli_enqueue_without_schema(dsn: str) -> None:
    assert_user_error(run_pgpool(dsn, "enqueue", "record", "{}"), "pgpool migrate")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert not has_table(conn, "pgpool_jobs")


def test_cli_migrate_into_missing_schema(server_dsn: str) -> None:
    missing = make_conninfo(server_dsn, options="-c search_path=no_such_schema_xyz")
    assert_user_error(run_pgpool(missing, "migrate"), "search_path")


def test_cli_newer_schema_is_refused(dsn: str, db: psycopg.Connection) -> None:
    job = pgpool.enqueue(db, "record", {"keep": "me"})
    newer = pgpool.SCHEMA_VERSION + 1
    db.execute("INSERT INTO pgpool_schema_version (version, description) VALUES (%s, %s)",
               (newer, "from the future"))

    # Every command refuses it, reading ones too: a newer schema may mean something else by
    # the same columns, and enqueue's rows could lack what newer hosts rely on.
    for args in (("run", "--handlers", "testjobs", "--burst"), ("migrate",),
                 ("enqueue", "record", "{}"), ("status",), ("status", "--json")):
        line = assert_user_error(run_pgpool(dsn, *args), "newer", "upgrade pgpool")
        assert str(newer) in line

    # Nothing touched: the one job is still ready, the recorded version unchanged.
    assert db.execute("SELECT id, state, attempts FROM pgpool_jobs").fetchall() == [
        (job, "ready", 0)]
    assert db.execute("SELECT max(version) FROM pgpool_schema_version").fetchone()[0] == newer


# --- CLI: handler modules -------------------------------------------------------------------


def test_cli_run_handler_module_not_found(dsn: str) -> None:
    assert_user_error(run_pgpool(dsn, "run", "--handlers", "no_such_module_xyz", "--burst"),
                      "no_such_module_xyz", "not found")


def test_cli_run_handler_module_invalid_name(dsn: str) -> None:
    assert_user_error(run_pgpool(dsn, "run", "--handlers", "bad-name!", "--burst"),
                      "invalid handler module name")


def test_cli_run_without_handlers(dsn: str) -> None:
    assert_user_error(run_pgpool(dsn, "run", "--burst"), "no handlers registered")
    assert_user_error(run_pgpool(dsn, "run", "--burst", PGPOOL_HANDLERS=" , "),
                      "no handlers registered")


BROKEN_MODULES = {
    "raises": ('raise RuntimeError("boom at import")\n',
               ["failed to import", "RuntimeError", "boom at import", "line 1"]),
    "missing_dependency": ("import no_such_dependency_xyz\n",
                           ["failed to import", "ModuleNotFoundError", "no_such_dependency_xyz"]),
    "multiline_message": ('raise RuntimeError("first line\\nsecond line")\n',
                          ["failed to import", "RuntimeError", "first line", "second line"]),
    "syntax_error": ("def broken(:\n    pass\n",
                     ["failed to import", "SyntaxError", ".py", "line 1"]),
    "sys_exit": ("import sys\nsys.exit(3)\n", ["failed to import", "SystemExit"]),
    "duplicate_kind": (
        "import pgpool\n\n"
        "@pgpool.handler('twice')\ndef one(payload): pass\n\n"
        "@pgpool.handler('twice')\ndef two(payload): pass\n",
        ["registered twice", "twice"],
    ),
    "bad_kind": ("import pgpool\n\n@pgpool.handler('bad kind')\ndef f(payload): pass\n",
                 ["failed to import", "invalid kind"]),
}


@pytest.mark.parametrize("case", sorted(BROKEN_MODULES))
def test_cli_run_handler_module_fails_to_import(dsn: str, tmp_path: Path, case: str) -> None:
    source, needles = BROKEN_MODULES[case]
    module = f"broken_{case}"
    (tmp_path / f"{module}.py").write_text(source)
    result = run_pgpool(dsn, "run", "--handlers", module, "--burst", PYTHONPATH=str(tmp_path))
    line = assert_user_error(result, *needles)
    if case != "duplicate_kind":
        assert module in line
    # The location shown is the user's file, never importlib's internals.
    assert "<frozen" not in line


# --- CLI: option values ---------------------------------------------------------------------


@pytest.mark.parametrize("option", [
    ("--procs", "0"), ("--procs", "-1"), ("--procs", "abc"),
    ("--batch", "0"),
    ("--lease", "0"), ("--lease", "abc"), ("--lease", "0.5"),
    ("--grace", "-1"),
    ("--timeout", "0"),
    ("--poll", "nan"),
    ("--queue", "bad name!"),
], ids=lambda o: f"{o[0]}={o[1]}")
def test_cli_run_invalid_option(dsn: str, option: tuple[str, str]) -> None:
    name, value = option
    assert_user_error(run_pgpool(dsn, "run", "--handlers", "testjobs", "--burst",
                                 f"{name}={value}"), name)


def test_cli_run_invalid_log_level(dsn: str) -> None:
    assert_user_error(run_pgpool(dsn, "run", "--handlers", "testjobs", "--log-level", "LOUD"),
                      "--log-level")
    assert_user_error(run_pgpool(dsn, "run", "--handlers", "testjobs", PGPOOL_LOG_LEVEL="LOUD"),
                      "PGPOOL_LOG_LEVEL")


@pytest.mark.parametrize("command", [RUN, ("migrate",), ("status",)],
                         ids=["run", "migrate", "status"])
def test_cli_invalid_log_format(dsn: str, command: tuple[str, ...]) -> None:
    assert_user_error(run_pgpool(dsn, *command, "--log-format", "xml"), "--log-format",
                      "'text', 'json'")
    line = assert_user_error(run_pgpool(dsn, *command, PGPOOL_LOG_FORMAT="xml"),
                             "PGPOOL_LOG_FORMAT")
    assert line == "pgpool: error: PGPOOL_LOG_FORMAT='xml' is not one of text, json"


@pytest.mark.parametrize("option", [("--lease", "1e15"), ("--batch", "99999999999999999999")],
                         ids=["lease-beyond-interval-range", "batch-beyond-bigint"])
def test_cli_run_option_the_database_cannot_represent(
    dsn: str, db: psycopg.Connection, option: tuple[str, str]
) -> None:
    # Values that parse as numbers but that PostgreSQL cannot use must be refused up front,
    # before the dispatcher starts: once started, every claim would fail and be retried
    # forever. Its `started` event, if it comes, is the proof that it was accepted.
    job = pgpool.enqueue(db, "record", {"n": 1})
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--burst", *option)
    if host.event("started", timeout=60, end_ok=True) is not None:
        pytest.fail(f"`pgpool run {' '.join(option)}` was accepted (the dispatcher started) "
                    f"instead of exiting 2:\n{host.stderr}")
    status = host.wait()
    assert_user_error(subprocess.CompletedProcess([], status, host.stdout, host.stderr),
                      option[0])
    assert db.execute("SELECT id, state, attempts FROM pgpool_jobs").fetchall() == [
        (job, "ready", 0)]


# --- CLI: enqueue ---------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "env", "needles"), [
    (("record", '{"secret": "PAYLOAD-MARKER-123", '), {}, ["not valid JSON"]),
    (("record", '{"a": NaN}'), {}, ["not valid JSON"]),
    (("record", '["PAYLOAD-MARKER-123"]'), {}, ["must be a dict", "list"]),
    (("record", '"PAYLOAD-MARKER-123"'), {}, ["must be a dict", "str"]),
    (("record", '{"s": "PAYLOAD-MARKER-123 \\u0000"}'), {}, ["NUL"]),
    (("bad kind", "{}"), {}, ["invalid kind"]),
    (("record", "{}", "--queue", "bad queue!"), {}, ["invalid queue"]),
    (("record", "{}", "--delay", "-1"), {}, ["--delay"]),
    (("record", "{}", "--delay", "1e300"), {}, ["delay"]),
    (("record", "{}", "--priority", "99999999999"), {}, ["priority"]),
    (("record", "{}", "--max-attempts", "0"), {}, ["--max-attempts"]),
    (("record", "{}", "--unique-key", ""), {}, ["--unique-key", "empty"]),
    (("record", '{"secret": "PAYLOAD-MARKER-123", "pad": "' + "x" * 200 + '"}'),
     {"PGPOOL_MAX_PAYLOAD_BYTES": "100"}, ["100-byte limit", "PGPOOL_MAX_PAYLOAD_BYTES"]),
    (("record", "{}"), {"PGPOOL_MAX_PAYLOAD_BYTES": "abc"},
     ["PGPOOL_MAX_PAYLOAD_BYTES", "not a positive integer"]),
], ids=[
    "invalid-json", "json-nan", "json-array", "json-string", "nul-char", "bad-kind",
    "bad-queue", "negative-delay", "huge-delay", "priority-out-of-range", "max-attempts-0",
    "empty-unique-key", "payload-over-limit", "limit-not-a-number",
])
def test_cli_enqueue_rejected(dsn: str, db: psycopg.Connection, args: tuple[str, ...],
                              env: dict[str, str], needles: list[str]) -> None:
    assert_user_error(run_pgpool(dsn, "enqueue", *args, **env), *needles)
    assert count(db) == 0, "a failed enqueue left a row behind"


def test_cli_enqueue_prints_id(dsn: str, db: psycopg.Connection) -> None:
    result = run_pgpool(dsn, "enqueue", "record", '{"a": 1}')
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    job_id = int(result.stdout.strip())
    assert result.stdout == f"{job_id}\n"
    assert db.execute("SELECT id, kind, queue, payload FROM pgpool_jobs").fetchall() == [
        (job_id, "record", "default", {"a": 1})]


def test_cli_enqueue_unique_key_twice(dsn: str, db: psycopg.Connection) -> None:
    first = run_pgpool(dsn, "enqueue", "record", '{"a": 1}', "--unique-key", "k1")
    assert first.returncode == 0, first.stderr
    job_id = int(first.stdout)
    second = run_pgpool(dsn, "enqueue", "record", '{"a": 2}', "--unique-key", "k1")
    assert second.returncode == 0, second.stderr
    assert second.stdout == ""
    assert "Traceback" not in second.stderr
    assert db.execute("SELECT id, payload FROM pgpool_jobs").fetchall() == [
        (job_id, {"a": 1})]


def test_cli_enqueue_big_integer_is_not_silently_rounded(dsn: str,
                                                          db: psycopg.Connection) -> None:
    digits = "123456789012345678901234567890"  # beyond 64 bits
    result = run_pgpool(dsn, "enqueue", "record", f'{{"n": {digits}}}')
    if result.returncode == 0:
        stored = db.execute("SELECT payload->>'n' FROM pgpool_jobs").fetchone()[0]
        assert stored == digits, f"the CLI stored {stored} for {digits}: silently rounded"
    else:
        line = assert_user_error(result)
        assert "integer" in line.lower()
        assert count(db) == 0


def test_cli_enqueue_literal_backslash_u0000_text_is_not_a_nul(dsn: str,
                                                                db: psycopg.Connection) -> None:
    # JSON "\\u0000" is the six characters \u0000, not a NUL: it must be stored as given.
    result = run_pgpool(dsn, "enqueue", "record", '{"path": "C:\\\\u0000dir"}')
    assert result.returncode == 0, result.stderr
    assert stored_payloads(db) == [{"path": "C:\\u0000dir"}]


# --- library: enqueue -----------------------------------------------------------------------


BAD_PAYLOADS = {
    "set": {"secret": MARKER, "s": {1, 2}},
    "bytes": {"secret": MARKER, "b": b"raw"},
    "list": [MARKER],
    "str": MARKER,
    "none": None,
    "tuple": (MARKER,),
    "nan-nested-list": {"secret": MARKER, "a": [1, [2, float("nan")]]},
    "inf-nested-dict": {"secret": MARKER, "a": {"b": {"c": float("inf")}}},
    "-inf-in-tuple": {"secret": MARKER, "a": [(1.0, float("-inf"))]},
    "lone-surrogate": {"secret": MARKER, "s": "\ud800"},
    "lone-surrogate-key": {"\udfff": MARKER},
    "nul-char": {"secret": MARKER, "s": "a\x00b"},
    "nul-in-key": {"k\x00": MARKER},
    "int-key": {1: MARKER},
    "tuple-key": {(1, 2): MARKER},
    "int-beyond-64-bit": {"secret": MARKER, "n": 2**64},
}


def nested(depth: int) -> dict[str, object]:
    """A payload ``depth`` levels deep (itself the first), alternating objects and arrays."""
    inner: object = MARKER
    for level in range(depth - 1):
        inner = [inner] if level % 2 else {"a": inner}
    return {"secret": inner}


def circular() -> dict[str, object]:
    payload: dict[str, object] = {"secret": MARKER}
    payload["self"] = [payload]
    return payload


def test_enqueue_payload_nesting_limit(db: psycopg.Connection) -> None:
    job = pgpool.enqueue(db, "record", nested(254))
    assert db.execute("SELECT payload = %s::jsonb FROM pgpool_jobs WHERE id = %s",
                      (orjson.dumps(nested(254)).decode(), job)).fetchone() == (True,)
    for payload in (nested(255), nested(5000), circular()):
        with pytest.raises(PayloadError) as info:
            pgpool.enqueue(db, "record", payload)
        assert str(info.value) == (
            "payload is nested more than 254 levels deep (objects and arrays within each "
            "other), or contains itself: flatten it")
    assert count(db) == 1


@pytest.mark.parametrize("case", list(BAD_PAYLOADS))
def test_enqueue_bad_payload(db: psycopg.Connection, case: str) -> None:
    with pytest.raises(PayloadError) as info:
        pgpool.enqueue(db, "record", BAD_PAYLOADS[case])
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, PgpoolError)
    message = str(info.value)
    assert message and "\n" not in message
    assert MARKER not in message, "payload data leaked into the error message"
    assert count(db) == 0


def test_enqueue_many_bad_payloads(db: psycopg.Connection) -> None:
    for case, bad in BAD_PAYLOADS.items():
        with pytest.raises(PayloadError, match=r"payload #1\b") as info:
            pgpool.enqueue_many(db, "record", [{"ok": 0}, bad, {"ok": 2}])
        assert MARKER not in str(info.value), case
        assert count(db) == 0, case
    assert pgpool.enqueue_many(db, "record", [{"ok": 1}]) == 1, "connection left unusable"


def test_payload_size_limit(db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPOOL_MAX_PAYLOAD_BYTES", "100")
    exactly = {"p": "x" * (100 - len(b'{"p":""}'))}
    assert len(orjson.dumps(exactly)) == 100
    over = {"p": "x" * (101 - len(b'{"p":""}'))}
    with pytest.raises(PayloadError, match="100-byte limit"):
        pgpool.enqueue(db, "record", over)
    with pytest.raises(PayloadError, match=r"payload #1\b.*100-byte limit"):
        pgpool.enqueue_many(db, "record", [exactly, over])
    assert count(db) == 0
    assert pgpool.enqueue(db, "record", exactly) is not None
    assert pgpool.enqueue_many(db, "record", [exactly, exactly]) == 2
    assert count(db) == 3


def test_payload_size_limit_misconfigured(db: psycopg.Connection,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("abc", "0", "-1", "", "1.5"):
        monkeypatch.setenv("PGPOOL_MAX_PAYLOAD_BYTES", value)
        with pytest.raises(ConfigError, match="PGPOOL_MAX_PAYLOAD_BYTES"):
            pgpool.enqueue(db, "record", {"a": 1})
        with pytest.raises(ConfigError, match="PGPOOL_MAX_PAYLOAD_BYTES"):
            pgpool.enqueue_many(db, "record", [{"a": 1}])
    assert count(db) == 0


NOW = datetime.now(UTC)

BAD_OPTIONS = {
    "naive-run_at": {"run_at": datetime(2030, 1, 1)},
    "run_at-not-datetime": {"run_at": "2030-01-01T00:00:00Z"},
    "run_at-and-delay": {"run_at": NOW + timedelta(minutes=1), "delay": 5},
    "negative-delay": {"delay": -1},
    "negative-timedelta": {"delay": timedelta(seconds=-1)},
    "nan-delay": {"delay": float("nan")},
    "inf-delay": {"delay": float("inf")},
    "str-delay": {"delay": "5"},
    "bool-delay": {"delay": True},
    "delay-beyond-timestamp-range": {"delay": 1e300},
    "timedelta-beyond-timestamp-range": {"delay": timedelta(days=999_999_999)},
    "priority-too-big": {"priority": 2**31},
    "priority-too-small": {"priority": -(2**31) - 1},
    "priority-bool": {"priority": True},
    "priority-float": {"priority": 1.5},
    "max_attempts-0": {"max_attempts": 0},
    "max_attempts-negative": {"max_attempts": -3},
    "max_attempts-bool": {"max_attempts": True},
    "max_attempts-too-big": {"max_attempts": 2**31},
    "bad-queue": {"queue": "bad queue!"},
    "empty-queue": {"queue": ""},
    "empty-unique_key": {"unique_key": ""},
    "nul-unique_key": {"unique_key": "a\x00b"},
}


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
def test_enqueue_bad_option(db: psycopg.Connection, case: str) -> None:
    with pytest.raises(ConfigError) as info:
        pgpool.enqueue(db, "record", {"secret": MARKER}, **BAD_OPTIONS[case])
    assert isinstance(info.value, ValueError)
    assert MARKER not in str(info.value)
    assert count(db) == 0


def test_enqueue_bad_kind(db: psycopg.Connection) -> None:
    for kind in ("bad kind", "", "x" * 129, "-leading-dash", "ünïcode", 42, None):
        with pytest.raises(ConfigError, match="invalid kind"):
            pgpool.enqueue(db, kind, {"a": 1})  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="invalid kind"):
            pgpool.enqueue_many(db, kind, [{"a": 1}])  # type: ignore[arg-type]
    assert count(db) == 0


def test_enqueue_many_bad_options(db: psycopg.Connection) -> None:
    for case in ("naive-run_at", "run_at-not-datetime", "priority-too-big", "priority-bool",
                 "max_attempts-0", "max_attempts-bool", "bad-queue"):
        with pytest.raises(ConfigError):
            pgpool.enqueue_many(db, "record", [{"a": 1}, {"a": 2}], **BAD_OPTIONS[case])
        assert count(db) == 0, case


def test_bad_payload_keeps_the_callers_transaction(db: psycopg.Connection) -> None:
    # "Validation happens before anything is sent": the caller's transaction goes on.
    with db.transaction():
        pgpool.enqueue(db, "record", {"n": 1})
        with pytest.raises(PayloadError):
            pgpool.enqueue(db, "record", {"n": float("nan")})
        with pytest.raises(ConfigError):
            pgpool.enqueue(db, "record", {"n": 2}, priority=True)
        pgpool.enqueue(db, "record", {"n": 3})
    assert stored_payloads(db) == [{"n": 1}, {"n": 3}]


def test_enqueue_many_bad_payload_keeps_the_callers_transaction(db: psycopg.Connection) -> None:
    # The same promise for the bulk path: a refused batch must not abort the caller's
    # transaction and so lose the rows it already wrote.
    with db.transaction():
        pgpool.enqueue(db, "record", {"n": 1})
        with pytest.raises(PayloadError, match=r"payload #1\b"):
            pgpool.enqueue_many(db, "record", [{"ok": 1}, {"bad": {1}}])
        pgpool.enqueue(db, "record", {"n": 3})
    assert stored_payloads(db) == [{"n": 1}, {"n": 3}]


def test_enqueue_many_one_bad_payload_among_1000_in_a_transaction(
    db: psycopg.Connection,
) -> None:
    payloads: list[object] = [{"i": i} for i in range(1000)]
    payloads[500] = {"i": 500, "bad": {"a", "set"}}
    with pytest.raises(PayloadError) as info, db.transaction():
        pgpool.enqueue_many(db, "record", payloads)
    assert "payload #500" in str(info.value)
    assert count(db) == 0
    # The connection is healthy afterwards.
    assert pgpool.enqueue_many(db, "record", [{"i": i} for i in range(1000)]) == 1000


def test_enqueue_many_bad_payload_after_data_was_streamed(db: psycopg.Connection) -> None:
    # ~8 KB payloads: the first 1 MiB chunks are already on the server when #300 fails.
    pad = "y" * 8000
    payloads: list[object] = [{"i": i, "pad": pad} for i in range(400)]
    payloads[300] = {"i": 300, "pad": pad, "bad": float("nan")}
    with pytest.raises(PayloadError, match=r"payload #300\b"):
        pgpool.enqueue_many(db, "record", payloads)
    assert count(db) == 0


def test_enqueue_many_iterable_that_raises_writes_nothing(db: psycopg.Connection) -> None:
    def payloads():
        for i in range(50):
            if i == 30:
                raise RuntimeError("producer failed")
            yield {"i": i}

    with pytest.raises(RuntimeError, match="producer failed"):
        pgpool.enqueue_many(db, "record", payloads())
    assert count(db) == 0


@pytest.mark.own_schema
def test_enqueue_without_schema(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(SchemaError, match="pgpool migrate"):
            pgpool.enqueue(conn, "record", {"a": 1})
        with pytest.raises(SchemaError, match="pgpool migrate"):
            pgpool.enqueue_many(conn, "record", [{"a": 1}, {"a": 2}])
        assert not has_table(conn, "pgpool_jobs")


# --- nothing corrupted: what goes in comes out ----------------------------------------------


TRICKY = {
    "backslash": "a\\b\\\\c\\",
    "copy-null-marker": "\\N",
    "copy-escapes": "\\t\\n\\r\\.",
    "controls": "tab\tnewline\nreturn\rbell\x07",
    "quotes": "\"'`",
    "unicode": "héllo ☃ 😀 \u2028 \ufeff",
    "nested": [1, -2, 2.5, None, True, False, {"x": [], "y": {}}],
    "u64-max": 2**64 - 1,
    "i64-min": -(2**63),
    "null-only": None,
    "empty-key": {"": "empty key"},
}


def test_tricky_payloads_round_trip(db: psycopg.Connection) -> None:
    payload = dict(TRICKY)
    one = pgpool.enqueue(db, "record", payload)
    assert one is not None
    assert pgpool.enqueue_many(db, "record", [payload, {"only": "\\"}]) == 2
    assert stored_payloads(db) == [payload, payload, {"only": "\\"}]


def test_literal_backslash_u0000_text_is_stored(db: psycopg.Connection) -> None:
    # The six characters \u0000 are ordinary text, not a NUL: refusing them loses data.
    payload = {"path": "C:\\u0000dir", "regex": "\\\\u0000"}
    pgpool.enqueue(db, "record", payload)
    pgpool.enqueue_many(db, "record", [payload])
    assert stored_payloads(db) == [payload, payload]


# --- handlers whose errors are hostile ------------------------------------------------------


def test_unprintable_and_huge_handler_errors(dsn: str, db: psycopg.Connection) -> None:
    payload = {"secret": MARKER}
    ids = {
        "unprintable": pgpool.enqueue(db, "unprintable", payload),
        "huge_error": pgpool.enqueue(db, "huge_error", payload),
    }
    result = run_pgpool(dsn, "run", "--handlers", "testjobs", "--procs", "1", "--burst")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert MARKER not in result.stderr and MARKER not in result.stdout, "payload was logged"
    assert "x" * 100 not in result.stderr, "the 5 MB error message was logged"

    assert count(db) == 0
    rows = db.execute(
        "SELECT id, kind, attempts, payload, last_error FROM pgpool_dead ORDER BY id"
    ).fetchall()
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (ids["unprintable"], "unprintable", 1), (ids["huge_error"], "huge_error", 1)]
    for _, kind, _, stored, last_error in rows:
        assert stored == payload, f"{kind}: payload changed on its way to pgpool_dead"
        assert last_error and last_error.strip(), f"{kind}: empty last_error"
        assert len(last_error) <= 5000, f"{kind}: last_error is {len(last_error)} chars"
    assert "_Unprintable" in rows[0][4]
    assert "ValueError" in rows[1][4]
