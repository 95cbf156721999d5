"""The ``pgpool`` command line itself: its version, where options go, their help, reading a
payload from stdin or a file, and the notice for a job no live host will run.

Each runs the real ``python -m pgpool`` against the real test PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import psycopg
import pytest
from commands import MARKER, RUN, assert_user_error, pgpool_cmd, pgpool_env, run_pgpool
from jsonlogs import only_event
from places import HANDLERS

import pgpool
from pgpool.cli import command as cli
from pgpool.enqueue import DEFAULT_MAX_PAYLOAD_BYTES


def enqueue_from_stdin(dsn: str, data: bytes, **env: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(pgpool_cmd("enqueue", "record", "-"), input=data,
                          env=pgpool_env(dsn, **env), capture_output=True, timeout=120)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(),
                                       done.stderr.decode())


def payload_of_size(size: int) -> bytes:
    """A payload whose compact JSON encoding (what the limit counts) is ``size`` bytes."""
    head = ('{"secret":"' + MARKER + '","pad":"').encode()
    return head + b"x" * (size - len(head) - 2) + b'"}'


def insert_host(db: psycopg.Connection, *, queues: list[str], kinds: list[str],
                seen_ago: float, lease: float = 30) -> None:
    db.execute(
        "INSERT INTO pgpool_hosts (owner, hostname, pid, procs, queues, kinds, lease, "
        "started_at, last_seen) VALUES (%s, 'h', 1, 4, %s, %s, %s, now() - interval '1 day', "
        "now() - make_interval(secs => %s))",
        (f"h:{seen_ago}:{','.join(queues)}", queues, kinds, lease, seen_ago))


# --- version ------------------------------------------------------------------------------


def test_version_comes_from_the_installed_distribution() -> None:
    assert pgpool.__version__ == version("pgpool")
    done = subprocess.run(pgpool_cmd("--version"), capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"pgpool {version('pgpool')}\n",
                                                          "")


# --- options ------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.soak  # real processes, 5-8 s: in `make soak-test` for make test's budget
def test_log_options_go_before_or_after_the_subcommand(dsn: str, db: psycopg.Connection,
                                                       where: str) -> None:
    def burst(*options: str) -> str:
        args = [*options, *RUN, "--burst"] if where == "before" else [*RUN, "--burst", *options]
        done = run_pgpool(dsn, *args)
        assert done.returncode == 0, done.stderr
        return done.stderr

    # The dispatcher's INFO events, as JSON lines; none at WARNING.
    assert only_event(burst("--log-format", "json"), "started")["procs"] >= 1
    assert burst("--log-level", "warning", "--log-format", "json") == ""


def test_the_log_option_after_the_subcommand_wins(dsn: str, db: psycopg.Connection) -> None:
    done = run_pgpool(dsn, "--log-level", "INFO", *RUN, "--burst", "--log-level", "ERROR")
    assert (done.returncode, done.stderr) == (0, "")
    assert_user_error(run_pgpool(dsn, "--log-level", "LOUD", "status"), "--log-level")


def every_action(parser: argparse.ArgumentParser, prog: str = "pgpool"
                 ) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += every_action(sub, f"{prog} {name}")
        found.append((prog, action))
    return found


def test_every_option_and_argument_has_help() -> None:
    missing = [f"{prog} {'/'.join(a.option_strings) or a.dest}"
               for prog, a in every_action(cli.build_parser())
               if not a.help and a.help != argparse.SUPPRESS]
    assert missing == []


def test_an_empty_unique_key_is_refused_in_the_commands_words(dsn: str,
                                                             db: psycopg.Connection) -> None:
    line = assert_user_error(run_pgpool(dsn, "enqueue", "record", "{}", "--unique-key", ""),
                             "--unique-key", "empty")
    assert "unique_key" not in line and "None" not in line
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0


# --- the payload from stdin or a file -----------------------------------------------------


def test_payload_at_the_limit_from_stdin_and_from_a_file(dsn: str, db: psycopg.Connection,
                                                        tmp_path: Path) -> None:
    data = payload_of_size(DEFAULT_MAX_PAYLOAD_BYTES)
    assert len(data) > 128 * 1024  # more than a shell argument can carry
    done = enqueue_from_stdin(dsn, data + b"\n")
    assert done.returncode == 0, done.stderr
    first = int(done.stdout)

    path = tmp_path / "payload.json"
    path.write_bytes(data)
    done = run_pgpool(dsn, "enqueue", "record", f"@{path}")
    assert done.returncode == 0, done.stderr
    second = int(done.stdout)

    sent = json.loads(data)
    assert db.execute("SELECT id, payload FROM pgpool_jobs ORDER BY id").fetchall() == [
        (first, sent), (second, sent)]


def test_payload_just_over_the_limit_from_stdin_or_a_file_is_refused(
    dsn: str, db: psycopg.Connection, tmp_path: Path
) -> None:
    data = payload_of_size(DEFAULT_MAX_PAYLOAD_BYTES + 1)
    path = tmp_path / "payload.json"
    path.write_bytes(data)
    for done in (enqueue_from_stdin(dsn, data), run_pgpool(dsn, "enqueue", "record", f"@{path}")):
        line = assert_user_error(done, "payload is 1,048,577 bytes", "1,048,576-byte limit",
                                 "PGPOOL_MAX_PAYLOAD_BYTES")
        assert str(tmp_path) not in line  # the size was the problem, not the file
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0


def test_stdin_far_over_the_limit_is_refused_without_reading_it_all(
    dsn: str, db: psycopg.Connection
) -> None:
    # Not valid JSON either: only the size check, before parsing, can give this message.
    done = enqueue_from_stdin(dsn, b"[" * (5 * 2**20), PGPOOL_MAX_PAYLOAD_BYTES="1000")
    assert_user_error(done, "stdin", "4 times the 1,000-byte limit")


@pytest.mark.parametrize(("make", "needles"), [
    (lambda tmp: f"@{tmp}/missing.json", ["cannot read the payload", "missing.json",
                                          "No such file"]),
    (lambda tmp: f"@{tmp}", ["cannot read the payload", "Is a directory"]),
    (lambda tmp: "@", ["@ must be followed by a file name"]),
], ids=["missing", "directory", "no-name"])
def test_an_unreadable_payload_file_is_a_one_line_error(dsn: str, db: psycopg.Connection,
                                                        tmp_path: Path, make,
                                                        needles: list[str]) -> None:
    assert_user_error(run_pgpool(dsn, "enqueue", "record", make(tmp_path)), *needles)


def test_invalid_json_from_a_file_names_no_shell_quoting(dsn: str, db: psycopg.Connection,
                                                        tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"secret": "' + MARKER + '",')
    line = assert_user_error(run_pgpool(dsn, "enqueue", "record", f"@{path}"),
                             "not valid JSON")
    assert "shell" not in line


# --- payload nesting ----------------------------------------------------------------------


@pytest.mark.parametrize("depth", [255, 2000])
def test_payload_nested_too_deep_is_one_line(dsn: str, db: psycopg.Connection,
                                             depth: int) -> None:
    text = '{"a": ' * depth + "1" + "}" * depth  # 2000: past Python's own recursion limit
    assert_user_error(run_pgpool(dsn, "enqueue", "record", text),
                      "nested more than 254 levels deep")
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0
    deepest = '{"a": ' * 254 + "1" + "}" * 254
    assert run_pgpool(dsn, "enqueue", "record", deepest).returncode == 0


# --- a kind no live host serves -----------------------------------------------------------


def test_enqueue_says_when_no_live_host_serves_the_kind(dsn: str, db: psycopg.Connection) -> None:
    def enqueue(*args: str) -> str:
        done = run_pgpool(dsn, "enqueue", *args)
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) > 0
        return done.stderr

    notice = enqueue("record", "{}")
    assert notice.startswith("pgpool: notice: no live host serves kind record on queue "
                             "default: the job waits"), notice
    assert notice.count("\n") == 1

    insert_host(db, queues=["default"], kinds=["record"], seen_ago=1)
    assert enqueue("record", "{}") == ""
    assert "no live host" in enqueue("other", "{}")  # a kind it has no handler for
    assert "--queue q2" in enqueue("record", "{}", "--queue", "q2")  # a queue it does not serve

    # A stale host (3 leases past its last beat) serves nothing.
    insert_host(db, queues=["q3"], kinds=["record"], seen_ago=10, lease=3)
    assert "no live host" in enqueue("record", "{}", "--queue", "q3")
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 5


# --- start-up -----------------------------------------------------------------------------


def test_run_starts_its_workers_before_it_imports_psycopg(dsn: str) -> None:
    # The workers' start (a fresh interpreter each, importing the handler modules) overlaps
    # the dispatcher's import of psycopg (about 45 ms) only if they are launched first: on 2
    # cores, first job 261 -> 236 ms (issue 34's closing note). Any module imported on the
    # way to the launch that imports psycopg at its top undoes it.
    code = ("import sys\n"
            "from pgpool.host import pool\n"
            "def launch(*args, **kwargs):\n"
            "    print(sorted(m for m in sys.modules if m.split('.')[0] == 'psycopg'))\n"
            "    raise SystemExit(0)\n"
            "pool.launch = launch\n"
            "from pgpool.cli import main\n"
            "main(['run', '--handlers', 'testjobs'])\n")
    done = subprocess.run([sys.executable, "-c", code], env=pgpool_env(dsn), cwd=HANDLERS,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"
