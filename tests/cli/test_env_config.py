"""`pgpool run` configured from the environment (containers): every option has a variable,
a flag wins over it, and a bad value gets the flag's one-line error naming the variable."""

from __future__ import annotations

import argparse

import psycopg
import pytest
from commands import JSON_LOGS, RUN, assert_user_error, run_pgpool
from jsonlogs import only_event

from pgpool.cli import command as cli
from pgpool.errors import ConfigError

#: run's options read from elsewhere than `cli.RUN_ENVIRONMENT`, or not configuration.
NOT_IN_THE_TABLE = {"help", "dsn", "handlers", "log_level", "log_format", "func", "command"}

#: A valid value of each variable (not the default) and what the option then holds.
GOOD = {
    "PGPOOL_PROCS": ("3", 3), "PGPOOL_BATCH": ("7", 7), "PGPOOL_QUEUES": ("a, b", ["a", "b"]),
    "PGPOOL_LEASE": ("12", 12.0), "PGPOOL_TIMEOUT": ("2.5", 2.5), "PGPOOL_GRACE": ("0", 0.0),
    "PGPOOL_POLL": ("0.5", 0.5), "PGPOOL_IDLE_POLL": ("20", 20.0),
    "PGPOOL_MAX_TASKS_PER_CHILD": ("9", 9), "PGPOOL_SPARE_WORKERS": ("0", 0),
    "PGPOOL_MAX_MEMORY": ("256", 256), "PGPOOL_MAX_CLAIMS_PER_SEC": ("50", 50.0),
    "PGPOOL_BURST": ("true", True), "PGPOOL_METRICS_PORT": ("9187", 9187),
    "PGPOOL_METRICS_HOST": ("127.0.0.1", "127.0.0.1"),
    "PGPOOL_DEAD_RETENTION": ("7d", 7 * 86400.0), "PGPOOL_KINDS": ("a, b", ["a", "b"]),
    "PGPOOL_TENANT_CAP": ("4", 4), "PGPOOL_KEEP_DONE": ("1h", 3600.0),
    "PGPOOL_LOG_ERRORS": ("Traceback", "traceback"), "PGPOOL_LOG_JOBS": ("yes", True),
    "PGPOOL_LOG_SUMMARY": ("5s", 5.0), "PGPOOL_FAIR_BY": ("CPU", "cpu"),
}
#: A value of each variable the flag refuses (none for the free-form address).
BAD = {
    "PGPOOL_PROCS": "0", "PGPOOL_BATCH": "many", "PGPOOL_QUEUES": "a,bad name!",
    "PGPOOL_LEASE": "0.5", "PGPOOL_TIMEOUT": "0", "PGPOOL_GRACE": "-1", "PGPOOL_POLL": "nan",
    "PGPOOL_IDLE_POLL": "0",
    "PGPOOL_MAX_TASKS_PER_CHILD": "0", "PGPOOL_SPARE_WORKERS": "65", "PGPOOL_MAX_MEMORY": "10",
    "PGPOOL_MAX_CLAIMS_PER_SEC": "-5", "PGPOOL_BURST": "maybe", "PGPOOL_METRICS_PORT": "nine",
    "PGPOOL_DEAD_RETENTION": "soon", "PGPOOL_KINDS": "a,bad kind!", "PGPOOL_TENANT_CAP": "0",
    "PGPOOL_KEEP_DONE": "a while", "PGPOOL_LOG_ERRORS": "all", "PGPOOL_LOG_JOBS": "loud",
    "PGPOOL_LOG_SUMMARY": "60", "PGPOOL_FAIR_BY": "bogus",
}
#: The switches: their flag takes no value.
SWITCHES = {"PGPOOL_BURST", "PGPOOL_LOG_JOBS"}
TABLE = {variable: (dest, default) for dest, variable, _, default in cli.RUN_ENVIRONMENT}


def parse_run(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], *flags: str
              ) -> argparse.Namespace:
    for variable in TABLE:
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    args = cli.build_parser().parse_args(["run", *flags])
    cli.apply_environment(args)
    return args


def flag_of(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def test_every_run_option_has_a_variable() -> None:
    run = cli.build_parser()._subparsers._group_actions[0].choices["run"]
    options = {a.dest for a in run._actions} - NOT_IN_THE_TABLE
    assert options == {dest for dest, _ in TABLE.values()}
    assert set(GOOD) == set(TABLE)


def test_without_flags_or_variables_the_defaults_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse_run(monkeypatch, {})
    assert {dest: getattr(args, dest) for dest, _ in TABLE.values()} == {
        dest: default for dest, default in TABLE.values()}
    assert (args.procs, args.lease, args.queue, args.burst) == ("auto", 30.0, ("default",), False)


@pytest.mark.parametrize("variable", sorted(GOOD))
def test_each_variable_sets_its_option(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    text, value = GOOD[variable]
    assert getattr(parse_run(monkeypatch, {variable: text}), TABLE[variable][0]) == value


@pytest.mark.parametrize("variable", sorted(set(GOOD) - SWITCHES - {"PGPOOL_QUEUES"}))
def test_a_flag_wins_over_its_variable_even_a_bad_one(monkeypatch: pytest.MonkeyPatch,
                                                      variable: str) -> None:
    dest = TABLE[variable][0]
    text, value = GOOD[variable]
    given = parse_run(monkeypatch, {}, flag_of(dest), text)
    assert getattr(given, dest) == value
    bad = BAD.get(variable, "")
    assert getattr(parse_run(monkeypatch, {variable: bad}, flag_of(dest), text), dest) == value


def test_the_queue_flag_and_the_switches_win_too(monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse_run(monkeypatch, {"PGPOOL_QUEUES": "a,b", "PGPOOL_BURST": "0",
                                   "PGPOOL_LOG_JOBS": "0"}, "--queue", "c", "--burst",
                     "--log-jobs")
    assert (args.queue, args.burst, args.log_jobs) == (["c"], True, True)


@pytest.mark.parametrize("variable", sorted(BAD))
def test_a_bad_variable_gets_the_flags_message_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str
) -> None:
    dest = TABLE[variable][0]
    with pytest.raises(ConfigError) as refused:
        parse_run(monkeypatch, {variable: BAD[variable]})
    assert str(refused.value).startswith(f"{variable}: ")
    if variable in SWITCHES:  # its flag takes no value to refuse
        assert f"{BAD[variable]!r} is not a boolean" in str(refused.value)
        return
    with pytest.raises(SystemExit):
        parse_run(monkeypatch, {}, flag_of(dest), BAD[variable].split(",")[-1])
    flag_error = capsys.readouterr().err
    # "pgpool: error: argument --x: <why> (see ...)" and "PGPOOL_X: <why>": the same why.
    assert str(refused.value).removeprefix(f"{variable}: ") in flag_error


@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_a_real_run_takes_its_settings_from_the_environment(dsn: str,
                                                            db: psycopg.Connection) -> None:
    # Burst mode from the environment: with nothing queued it exits 0 right after starting.
    done = run_pgpool(dsn, *RUN, **JSON_LOGS, PGPOOL_BURST="1", PGPOOL_PROCS="2",
                      PGPOOL_BATCH="7", PGPOOL_QUEUES="one,two")
    assert done.returncode == 0, done.stderr
    started = only_event(done.stderr, "started")
    assert (started["procs"], started["batch"], started["queues"]) == (2, 7, ["one", "two"])
    flagged = run_pgpool(dsn, *RUN, "--procs", "1", "--queue", "three", **JSON_LOGS,
                         PGPOOL_BURST="1", PGPOOL_PROCS="2", PGPOOL_QUEUES="one,two")
    assert flagged.returncode == 0, flagged.stderr
    started = only_event(flagged.stderr, "started")
    assert (started["procs"], started["queues"]) == (1, ["three"])


def test_a_real_run_refuses_a_bad_variable_in_one_line(dsn: str) -> None:
    line = assert_user_error(run_pgpool(dsn, *RUN, PGPOOL_GRACE="-1"), "PGPOOL_GRACE")
    assert line == "pgpool: error: PGPOOL_GRACE: '-1' is not a non-negative number of seconds"
