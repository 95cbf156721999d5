"""Errors a user can cause at the command line: one clear line, exit status 2, no
traceback, nothing lost.

The real ``python -m pgpool`` runs against the real test PostgreSQL (in this process where
that shows what a process would: `run_pgpool`). Every failure case also checks that nothing
was half-written: no job row, no changed schema, no payload or password echoed back to the
user. The same for `pgpool.enqueue` called by an application: tests/api/test_enqueue_errors.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
import pytest
from commands import (
    MARKER,
    RUN,
    SECRET,
    UNREACHABLE,
    assert_user_error,
    run_pgpool,
    without_password_warning,
)
from dbtools import count, has_table, make_version_1_schema, stored_payloads
from processes import start_pgpool
from psycopg.conninfo import make_conninfo

import pgpool

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
    # The log shows the first line of an error, at most 300 characters of it.
    assert "x" * 300 not in result.stderr, "the 5 MB error message was logged"
    assert max(len(line) for line in result.stderr.splitlines()) < 1000

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
