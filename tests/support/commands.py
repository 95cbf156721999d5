"""The real ``pgpool`` command, as a test runs it: its environment (`pgpool_env`), a
command run to its end (`run_pgpool`, in this process where that shows what a process
would), and the user-error contract (`assert_user_error`)."""

from __future__ import annotations

import argparse
import functools
import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from places import HANDLERS, TESTS

from pgpool.cli.passwords import masked_args

#: The command line of a dispatcher running the test handlers (tests/handlers/testjobs.py).
RUN = ("run", "--handlers", "testjobs")


#: Environment for a `pgpool` whose log a test reads: one JSON object per line.
JSON_LOGS = {"PGPOOL_LOG_FORMAT": "json"}


#: A DSN nobody answers, with a password that must never reach the user's screen.
SECRET = "s3cret-pw"


UNREACHABLE = f"postgresql://u:{SECRET}@127.0.0.1:1/db"


#: Put in payloads that must never be logged or echoed.
MARKER = "PAYLOAD-MARKER-123"


def clean_env() -> dict[str, str]:
    """This process's environment without PGPOOL_* and PG* settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PGPOOL_", "PG"))}


def pgpool_env(dsn: str, record_dir: Path | None = None, **extra: str) -> dict[str, str]:
    env = clean_env()
    env["PGPOOL_DSN"] = dsn
    env["PGPOOL_HOME"] = str(TESTS / ".never-used")  # fail loudly if the default is touched
    # One worker unless the test asks for more (--procs, or PGPOOL_PROCS in ``extra``): the
    # workers are most of what starting a host costs, and one per core (the default) is
    # what test_config checks, not something the hosts here need.
    env["PGPOOL_PROCS"] = "1"
    if record_dir is not None:
        env["TESTJOBS_RECORD"] = str(record_dir)
    env.update(extra)
    return env


def pgpool_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pgpool", *args]


#: The commands `run_pgpool` runs as a real process: they start worker processes or a
#: server (`run`, `web`, `bench`), or the embedded PostgreSQL (`dsn`).
OWN_PROCESS = frozenset({"run", "web", "bench", "dsn"})


def run_pgpool(dsn: str, *args: str, record_dir: Path | None = None, timeout: float = 120,
               **env: str) -> subprocess.CompletedProcess[str]:
    """`run_cli` with ``args`` and the environment of `pgpool_env`. Pass ``**JSON_LOGS`` to
    read its events with `events` / `only_event`."""
    return run_cli(args, pgpool_env(dsn, record_dir, **env), timeout)


def run_cli(args: Sequence[str], env: dict[str, str], timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
    """Run the CLI with ``args`` and ``env`` as its whole environment, from tests/handlers/
    (so ``--handlers testjobs`` imports): its exit status and output.

    A command whose subject is its output and what it did to the database runs in this
    process (`cli_in_process`): the suite pays for importing psycopg once, not once per
    check. A real subprocess runs the rest: `OWN_PROCESS`, a command with no DSN (which
    falls back to the embedded server), and one whose ``--dsn`` holds a password (the
    process title is rewritten, and a warning printed)."""
    has_dsn = env.get("PGPOOL_DSN") or any(a.startswith("--d") for a in args)
    in_process = (has_dsn and masked_args(args) == list(args)
                  and (_subcommand(args) not in OWN_PROCESS or _refused_by_the_parser(args)))
    if in_process:
        return cli_in_process(args, env)
    return subprocess.run(pgpool_cmd(*args), cwd=HANDLERS, env=env, capture_output=True,
                          text=True, timeout=timeout)


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """The command line parser, built once: parsing leaves it as it was."""
    from pgpool.cli import command as cli

    return cli.build_parser()


def _subcommand(args: Sequence[str]) -> str | None:
    """The subcommand ``args`` name, as the command line parser reads them (options and
    their values may come first); None if the parser refuses them."""
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        try:
            return _parser().parse_args(list(args)).command
        except SystemExit:
            return None


def _refused_by_the_parser(args: Sequence[str]) -> bool:
    """Whether the command line parser ends the command (a bad option, ``--help``): then
    even `OWN_PROCESS` starts nothing, and `cli_in_process` shows what a process would."""
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        try:
            _parser().parse_args(list(args))
        except SystemExit:
            return True
    return False


def cli_in_process(args: Sequence[str], env: dict[str, str]
                   ) -> subprocess.CompletedProcess[str]:
    """``cli.main(args)`` in this process as ``python -m pgpool`` would run it: ``env`` as
    the whole environment, tests/handlers/ as the working directory, stdout and stderr
    captured, and a `SystemExit` (argparse's) turned into the exit status. The environment,
    the directory and logging are put back afterwards."""
    from pgpool.cli import command as cli

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    root = logging.getLogger()
    saved_logging = (root.level, root.handlers[:])
    root.handlers[:] = []  # as in a new process: else `logs.configure` would add nothing
    os.environ.clear()
    os.environ.update(env)
    os.chdir(HANDLERS)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = cli.main(list(args))
            except SystemExit as exc:
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
                code = 1 if isinstance(exc.code, str) else exc.code or 0
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        for handler in root.handlers:
            if handler not in saved_logging[1]:
                handler.close()
        root.setLevel(saved_logging[0])
        root.handlers[:] = saved_logging[1]
    return subprocess.CompletedProcess(["pgpool", *args], code, out.getvalue(),
                                       err.getvalue())


def assert_user_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The CLI contract for user errors (exit 2, exactly one line ``pgpool: error: ...`` on
    stderr naming each of ``needles``, no traceback, no password or payload echoed);
    returns the line for further checks."""
    where = f"exit {result.returncode}\nstdout: {result.stdout!r}\nstderr: {result.stderr!r}"
    assert result.returncode == 2, where
    assert "Traceback" not in result.stderr, where
    assert result.stderr.startswith("pgpool: error:"), where
    assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1, (
        f"not exactly one line on stderr\n{where}"
    )
    assert result.stdout == "", where
    line = result.stderr.rstrip("\n")
    for needle in needles:
        assert needle in line, f"{needle!r} missing from the error line\n{where}"
    assert SECRET not in line, f"the password leaked into the error\n{where}"
    assert MARKER not in line, f"the payload leaked into the error\n{where}"
    return line


def without_password_warning(result: subprocess.CompletedProcess[str]
                             ) -> subprocess.CompletedProcess[str]:
    """``result`` without the warning that a password was given on the command line, which
    must be its first stderr line (then `assert_user_error` applies to the rest)."""
    warning, _, rest = result.stderr.partition("\n")
    assert warning.startswith("pgpool: warning: --dsn holds a password"), result.stderr
    assert SECRET not in warning, result.stderr
    return subprocess.CompletedProcess(result.args, result.returncode, result.stdout, rest)


def status_json(dsn: str) -> dict[str, Any]:
    """``pgpool status --json``, parsed."""
    done = run_pgpool(dsn, "status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
