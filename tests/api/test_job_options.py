"""A job's options are one type, `JobOptions`: checked once when made, the handler's
defaults, and what every enqueue path takes; a name that is not an option is a
`ConfigError` saying which ones there are, on every path (no TypeError from Python)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import pgpool
from pgpool.enqueue import array_params, function_params
from pgpool.job import MANY, NAMES, JobOptions
from pgpool.worker.followups import Attempt, RunningJob


def test_options_are_checked_once_when_made_and_become_columns_in_one_place() -> None:
    at = datetime(2030, 1, 1, tzinfo=UTC)
    options = JobOptions("reports", 5, run_at=at, max_attempts=3, tenant="acme",
                         concurrency_key="acct-1")
    assert options.columns() == {
        "queue": "reports", "priority": 5, "run_at": at, "delay": 0.0, "unique_key": None,
        "max_attempts": 3, "tenant": "acme", "concurrency_key": "acct-1"}
    # No tenant is the fairness group '' in the table; a timedelta delay is kept in seconds.
    assert JobOptions(delay=timedelta(minutes=2)).columns()["delay"] == 120.0
    assert JobOptions(delay=timedelta(minutes=2)).delay == 120.0
    assert JobOptions().columns()["tenant"] == ""
    for bad, needle in [({"queue": "no spaces"}, "invalid queue"),
                        ({"priority": True}, "priority must be an integer"),
                        ({"run_at": datetime(2030, 1, 1)}, "naive datetime"),
                        ({"run_at": at, "delay": 5}, "either run_at or delay"),
                        ({"delay": -1}, "delay must be a number of seconds"),
                        ({"unique_key": ""}, "unique_key must be a non-empty string"),
                        ({"max_attempts": 0}, "max_attempts must be a positive integer"),
                        ({"tenant": "x\x00"}, "tenant must be None or a non-empty string")]:
        with pytest.raises(pgpool.ConfigError, match=needle):
            JobOptions(**bad)


def test_of_fills_in_from_defaults_and_names_the_options_there_are() -> None:
    defaults = JobOptions("reports", 5, tenant="acme")
    assert JobOptions.of({}, over=defaults) is defaults  # nothing given: nothing made
    assert JobOptions.of({"priority": 9}, over=defaults) == JobOptions("reports", 9,
                                                                      tenant="acme")
    with pytest.raises(pgpool.ConfigError, match=r"enqueue takes .*queue.*, not prio$"):
        JobOptions.of({"prio": 9})
    with pytest.raises(pgpool.ConfigError, match="not delay, unique_key"):
        JobOptions.of({"unique_key": "k", "delay": 1}, allowed=MANY)
    assert NAMES - {"unique_key", "delay"} == MANY
    with pytest.raises(pgpool.ConfigError, match="cannot apply a unique_key"):
        JobOptions(unique_key="k").for_many("enqueue_many")


@pgpool.handler("options.defaults", queue="reports", priority=3, tenant="acme",
                concurrency_key=lambda p: f"acct-{p['acct']}")
def defaults(payload: dict) -> None: ...


def test_a_handlers_defaults_are_one_checked_job_options() -> None:
    assert defaults.defaults == JobOptions("reports", 3, tenant="acme")
    _, chosen = defaults.prepare({"acct": 7}, {})
    assert chosen == JobOptions("reports", 3, tenant="acme", concurrency_key="acct-7")
    _, chosen = defaults.prepare({"acct": 7}, {"concurrency_key": "given", "queue": "q2"})
    assert (chosen.queue, chosen.concurrency_key, chosen.priority) == ("q2", "given", 3)
    with pytest.raises(pgpool.ConfigError, match=r"options\.defaults\.enqueue takes"):
        defaults.prepare({"acct": 7}, {"queu": "q2"})


def test_every_path_refuses_an_unknown_option_with_the_same_error() -> None:
    # The SQL function's parameters (other drivers, follow-ups), a group's members, a
    # follow-up: each says which options there are.
    assert function_params("k", {}, JobOptions(tenant="t"))["tenant"] == "t"
    assert array_params("k", [{}], JobOptions())["tenant"] == ""
    with pytest.raises(pgpool.ConfigError, match="a group's members takes"):
        pgpool.groups.group_params("k", [{}], ("cb", {}), unique_key="x")
    job = RunningJob(1, "k", "default", 1, 3, 1, Attempt(1))
    with pytest.raises(pgpool.ConfigError, match=r"current_job\(\).enqueue takes"):
        job.enqueue("k", {}, priorty=1)


def test_pgpool_enqueue_and_its_kin_refuse_an_unknown_option_alike(db) -> None:
    # The public functions take **options (a Handler's defaults need to know which were
    # given): a misspelt one is the same ConfigError, not Python's TypeError.
    with pytest.raises(pgpool.ConfigError, match=r"^enqueue takes .*queue.*, not qeue$"):
        pgpool.enqueue(db, "k", {}, qeue="q")  # type: ignore[call-overload]
    with pytest.raises(pgpool.ConfigError, match=r"^enqueue_many takes .*, not delay$"):
        pgpool.enqueue_many(db, "k", [{}], delay=5)  # type: ignore[call-overload]
    with pytest.raises(pgpool.ConfigError, match=r"^options\.defaults\.enqueue takes"):
        pgpool.enqueue(db, defaults, {"acct": 1}, queu="q")  # type: ignore[call-overload]
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone() == (0,)
