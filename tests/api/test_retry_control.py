"""Retry control per handler (`pgpool.Retry`) and from inside a handler (`pgpool.Snooze`,
`pgpool.Discard`, `pgpool.Cancel`), end to end: real `pgpool run` hosts and workers, the
rows they leave, their JSON log events, their metrics and `pgpool dead list`.

The handlers are tests/handlers/testjobs.py's `picky`, `snoozer`, `ender` and
`snooze_killed`.
"""

from __future__ import annotations

import json
import re
import signal
from datetime import timedelta

import psycopg
import pytest
from claims import claimer, run_with_pool
from commands import JSON_LOGS, RUN, run_pgpool
from dbtools import one
from jsonlogs import events
from processes import start_pgpool
from records import read_records
from scraping import scrape, value, with_metrics
from waits import wait_until

import pgpool
from pgpool import ops
from pgpool.errors import HandlerError
from pgpool.host.attempt import AttemptEnd, Job
from pgpool.host.completer import Ack, Completer, decide
from pgpool.retry import MAX_SNOOZES, Retry


def job_row(db: psycopg.Connection, job_id: int) -> dict[str, object] | None:
    """The job's row in pgpool_jobs as a dict, with ``delay``: seconds from its last claim
    to its ``run_at`` (the ack comes after the claim: the delay given, plus the time the
    attempt and its ack took)."""
    cur = db.execute(
        "SELECT state, attempts, interruptions, snoozes, max_attempts, last_error,"
        " extract(epoch FROM run_at - claimed_at)::float8 AS delay"
        " FROM pgpool_jobs WHERE id = %s", (job_id,))
    row = cur.fetchone()
    return None if row is None else dict(zip([c.name for c in cur.description], row,
                                             strict=True))


def dead_row(db: psycopg.Connection, job_id: int) -> tuple | None:
    return one(db, "SELECT reason, attempts, snoozes, max_attempts, last_error"
                   " FROM pgpool_dead WHERE id = %s", job_id)


def by_job(found: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    return {e["job_id"]: e for e in found}


# --- Retry per handler --------------------------------------------------------------------

@pytest.mark.soak  # long, with real hosts: the soak tier, which CI runs after make test
def test_a_handlers_retry_decides_what_is_retried_and_when(db, dsn, record_dir):
    retried = pgpool.enqueue(db, "picky", {"raise": "ConnectionResetError"})
    never = pgpool.enqueue(db, "picky", {"raise": "TimeoutError"})
    not_on = pgpool.enqueue(db, "picky", {"raise": "ValueError"})
    burst = run_pgpool(dsn, *RUN, "--procs", "1", "--burst", record_dir=record_dir,
                       **JSON_LOGS)
    assert burst.returncode == 0, burst.stderr
    # TimeoutError is an OSError, which `on` retries, but `never` names it: dead at once.
    # ValueError is not in `on`: dead at once too. Each used 1 of the handler's 4 attempts.
    for job_id, error in ((never, "TimeoutError: picky failed"),
                          (not_on, "ValueError: picky failed")):
        reason, attempts, snoozes, max_attempts, last_error = dead_row(db, job_id)
        assert (reason, attempts, snoozes, max_attempts) == ("failed", 1, 0, 4)
        assert error in last_error
    dead = by_job(events(burst.stderr, "job_dead"))
    assert set(dead) == {never, not_on}
    assert all(e["permanent"] is True and e["attempt"] == 1 for e in dead.values())
    assert dead[never]["cause"] == "TimeoutError"
    # ConnectionResetError is an OSError (a subclass counts): retried after exactly the
    # handler's base (jitter=False), not the default schedule's 0.5 to 1 s.
    (retry,) = events(burst.stderr, "job_retry")
    assert (retry["job_id"], retry["delay"], retry["attempt"]) == (retried, 30.0, 1)
    row = job_row(db, retried)
    assert (row["state"], row["attempts"], row["max_attempts"]) == ("scheduled", 1, 4)
    assert 30.0 <= row["delay"] < 30.0 + 10
    # Its second failure: base * 2 = 60 s, capped at the handler's 45.
    ops.retry(db, [retried])
    again = run_pgpool(dsn, *RUN, "--procs", "1", "--burst", record_dir=record_dir,
                       **JSON_LOGS)
    assert again.returncode == 0, again.stderr
    (retry,) = events(again.stderr, "job_retry")
    assert (retry["job_id"], retry["delay"], retry["attempt"]) == (retried, 45.0, 2)
    row = job_row(db, retried)
    assert (row["state"], row["attempts"]) == ("scheduled", 2)
    assert 45.0 <= row["delay"] < 45.0 + 10


@pytest.mark.parametrize(("options", "message"), [
    ({"attempts": 0}, "attempts must be a positive integer or None, got 0"),
    ({"attempts": True}, "attempts must be a positive integer or None, got True"),
    ({"base": 0}, "base must be a number of seconds above 0"),
    ({"base": "1"}, "base must be a number of seconds above 0"),
    ({"cap": float("inf")}, "cap must be a number of seconds above 0"),
    ({"base": 10, "cap": 5}, "cap (5) is below base (10)"),
    ({"jitter": "no"}, "jitter must be True or False, got 'no'"),
    ({"on": ValueError()}, "on must be exception types (a type or a tuple of them)"),
    ({"never": (KeyError, "KeyError")}, "never must be exception types"),
    ({"never": pgpool.Snooze}, "never names Snooze, which is not a failure"),
    ({"on": [KeyError], "never": (KeyError,)}, "KeyError is in both on and never"),
])
def test_retry_refuses_each_bad_field_in_one_line(options, message):
    with pytest.raises(HandlerError) as refused:
        Retry(**options)
    assert message in str(refused.value)
    assert str(refused.value).startswith("pgpool.Retry: ")
    assert "\n" not in str(refused.value)


def _handler(payload: dict) -> None:
    pass


def test_retry_takes_one_type_or_several_and_a_handler_takes_its_attempts():
    assert Retry(on=KeyError, never=[TimeoutError]).on == (KeyError,)
    assert Retry(never=[TimeoutError]).never == (TimeoutError,)
    assert Retry(base=2, cap=5, jitter=False).delay(1) == 2.0
    assert Retry(base=2, cap=5, jitter=False).delay(3) == 5.0
    assert 1.0 <= Retry(base=2).delay(1) <= 2.0
    from pgpool import registry

    with registry.isolated():
        pgpool.handler("retry.attempts", retry=Retry(attempts=3))(_handler)
        assert registry.registered()["retry.attempts"].max_attempts == 3
        with pytest.raises(HandlerError, match=r"^handler 'retry.both': max_attempts and "
                           r"retry=Retry\(attempts=...\) both set the attempts: give only one"):
            pgpool.handler("retry.both", max_attempts=2, retry=Retry(attempts=3))
        with pytest.raises(HandlerError, match=r"retry must be a pgpool\.Retry"):
            pgpool.handler("retry.bad", retry={"attempts": 3})  # type: ignore[arg-type]


@pytest.mark.parametrize(("raised", "message"), [
    (lambda: pgpool.Snooze(0), "pgpool.Snooze: seconds must be a number or a timedelta above 0"),
    (lambda: pgpool.Snooze(timedelta(days=-1)), "pgpool.Snooze: seconds must be"),
    (lambda: pgpool.Snooze(float("nan")), "pgpool.Snooze: seconds must be"),
    (lambda: pgpool.Snooze(True), "pgpool.Snooze: seconds must be"),
    (lambda: pgpool.Discard(""), "pgpool.Discard: reason must be a non-empty string"),
    (lambda: pgpool.Cancel(None), "pgpool.Cancel: reason must be a non-empty string"),
])
def test_control_exceptions_refuse_bad_arguments_in_one_line(raised, message):
    with pytest.raises(HandlerError, match=re.escape(message)):
        raised()
    assert pgpool.Snooze(timedelta(minutes=2)).seconds == 120.0


def _snoozed(snoozes: int, attempt: int = 1) -> AttemptEnd:
    job = Job(1, "k", "default", attempt + snoozes, 0, 2, b"{}", None, snoozes=snoozes)
    return AttemptEnd(job, "snoozed for 5s", 0.1, cause="Snooze", verdict="snooze", delay=5.0)


def test_a_snooze_past_the_bound_counts_as_a_failed_attempt():
    retry = Retry(base=1.0, jitter=False)
    ack = decide(_snoozed(MAX_SNOOZES - 1), retry)
    assert (ack.kind, ack.delay) == ("snooze", 5.0)
    ack = decide(_snoozed(MAX_SNOOZES), retry)
    assert (ack.kind, ack.delay) == ("retry", 1.0)
    assert ack.error == (f"its handler snoozed it again after {MAX_SNOOZES} snoozes, the "
                         "most a job may: this snooze counts as a failed attempt")
    assert decide(_snoozed(MAX_SNOOZES, attempt=2), retry).kind == "dead"


# --- Snooze -------------------------------------------------------------------------------

def attempts_seen(record_dir) -> list[tuple[int, str]]:
    """(claim, event) of every record, in claim order."""
    return sorted((claim, ev) for _, claim, _, ev in read_records(record_dir))


def test_a_snooze_moves_run_at_uses_no_attempt_and_the_job_runs_again(db, dsn, record_dir):
    host = start_pgpool(dsn, *RUN, "--procs", "1", record_dir=record_dir)
    host.event("started")
    # Snoozed for an hour on its first claim: scheduled, run_at an hour on, no attempt used.
    later = pgpool.enqueue(db, "snoozer", {"until_claim": 1, "seconds": 3600})
    snoozed = host.event("job_snoozed")
    assert {k: snoozed[k] for k in ("job_id", "kind", "attempt", "delay", "snoozes")} == {
        "job_id": later, "kind": "snoozer", "attempt": 1, "delay": 3600.0, "snoozes": 1}
    wait_until(lambda: job_row(db, later)["state"] == "scheduled", "the snooze to be acked")
    row = job_row(db, later)
    assert (row["attempts"], row["snoozes"], row["interruptions"]) == (1, 1, 0)
    assert row["last_error"] is None  # a snooze is no error
    assert 3600.0 <= row["delay"] < 3600.0 + 30
    # Due now: it runs again as attempt 1 of its 2, and succeeds.
    ops.retry(db, [later])
    wait_until(lambda: job_row(db, later) is None, "the snoozed job to run again and succeed")
    # Short snoozes run again by themselves (the host's stager is woken by its own ack):
    # twice snoozed, then done, still on its first attempt.
    soon = pgpool.enqueue(db, "snoozer", {"until_claim": 2, "seconds": 0.05})
    wait_until(lambda: job_row(db, soon) is None, "the twice-snoozed job to succeed")
    assert host.stop() == 0, host.stderr
    runs = {}
    for job_id, claim, _, ev in read_records(record_dir):
        runs.setdefault(job_id, []).append((claim, ev))
    assert sorted(runs[later]) == [(1, "attempt=1"), (2, "attempt=1"), (2, "end")]
    assert sorted(runs[soon]) == [(1, "attempt=1"), (2, "attempt=1"), (3, "attempt=1"),
                                  (3, "end")]
    assert one(db, "SELECT count(*) FROM pgpool_dead") == (0,)
    assert [e["job_id"] for e in host.events("job_snoozed")] == [later, soon, soon]
    assert host.events("job_retry") == [] and host.events("job_dead") == []


def test_a_job_snoozed_100_times_fails_its_next_snooze(db, dsn, record_dir):
    forever = pgpool.enqueue(db, "snoozer", {"until_claim": 10**6, "seconds": 0.05})
    # As if 99 claims had snoozed already (each claim adds an attempt and a snooze).
    db.execute("UPDATE pgpool_jobs SET attempts = 99, snoozes = 99 WHERE id = %s", (forever,))
    host = start_pgpool(dsn, *RUN, "--procs", "1", record_dir=record_dir)
    wait_until(lambda: dead_row(db, forever), "the always-snoozing job to be dead-lettered")
    reason, attempts, snoozes, max_attempts, last_error = dead_row(db, forever)
    # The 100th snooze was one; the next two counted as the job's 2 attempts.
    assert (reason, attempts, snoozes, max_attempts) == ("failed", 102, 100, 2)
    assert last_error == ("its handler snoozed it again after 100 snoozes, the most a job "
                          "may: this snooze counts as a failed attempt")
    assert host.stop() == 0, host.stderr
    assert [e["snoozes"] for e in host.events("job_snoozed")] == [100]
    (retry,) = host.events("job_retry")
    assert (retry["cause"], retry["attempt"], retry["delay"]) == ("Snooze", 1, 0.05)
    (dead,) = host.events("job_dead")
    assert (dead["cause"], dead["attempt"], dead["permanent"]) == ("Snooze", 2, False)


# --- Discard and Cancel -------------------------------------------------------------------

#: A reason a handler gives: it may quote payload data, so logs show it only as
#: ``--log-errors`` allows (here ``none``: not at all).
SECRET = "card 4111-1111 refused"


def test_discard_and_cancel_dead_letter_with_their_reasons_everywhere(db, dsn, record_dir):
    discarded = [pgpool.enqueue(db, "ender", {"how": "discard", "reason": f"{SECRET} #{i}"})
                 for i in range(2)]
    cancelled = pgpool.enqueue(db, "ender", {"how": "cancel", "reason": "order withdrawn"})
    snoozed = pgpool.enqueue(db, "snoozer", {"until_claim": 1, "seconds": 3600})
    failed = pgpool.enqueue(db, "picky", {"raise": "ValueError"})
    host, port = with_metrics(dsn, "--procs", "2", "--log-errors", "none")
    wait_until(lambda: one(db, "SELECT count(*) FROM pgpool_dead")[0] == 4
               and job_row(db, snoozed)["state"] == "scheduled", "every job to end its way")
    # pgpool_dead: the reason, and the handler's words as last_error; one attempt each.
    for job_id, i in zip(discarded, range(2), strict=True):
        assert dead_row(db, job_id) == ("discarded", 1, 0, 20, f"{SECRET} #{i}")
    assert dead_row(db, cancelled) == ("cancelled", 1, 0, 20, "order withdrawn")
    assert dead_row(db, failed)[0] == "failed"
    # Metrics: the host's outcomes by kind, the queue's dead letters by reason.
    m = scrape(port)
    finished = "pgpool_jobs_finished_total"
    assert value(m, finished, kind="ender", outcome="discarded") == 2
    assert value(m, finished, kind="ender", outcome="cancelled") == 1
    assert value(m, finished, kind="ender", outcome="dead") == 0
    assert value(m, finished, kind="snoozer", outcome="snoozed") == 1
    assert value(m, finished, kind="picky", outcome="dead") == 1
    dead = "pgpool_queue_dead_jobs"
    assert value(m, dead, queue="default", reason="discarded") == 2
    assert value(m, dead, queue="default", reason="cancelled") == 1
    assert value(m, dead, queue="default", reason="failed") == 1
    assert host.stop() == 0, host.stderr
    # Events: one per job, with its id, kind and attempt; with --log-errors none, never
    # the handler's reason.
    assert sorted(e["job_id"] for e in host.events("job_discarded")) == discarded
    (event,) = host.events("job_cancelled")
    assert {k: event[k] for k in ("job_id", "kind", "attempt")} == {
        "job_id": cancelled, "kind": "ender", "attempt": 1}
    assert [e["job_id"] for e in host.events("job_dead")] == [failed]
    assert SECRET not in host.stderr and "withdrawn" not in host.stderr
    finished_event = host.events("finished")[0]
    assert {k: finished_event[k] for k in ("discarded", "cancelled", "snoozed", "dead")} == {
        "discarded": 2, "cancelled": 1, "snoozed": 1, "dead": 1}
    # pgpool dead list: the reason column, and the filter on it.
    listed = run_pgpool(dsn, "dead", "list")
    assert listed.returncode == 0, listed.stderr
    reasons = {int(line.split()[0]): line.split()[3] for line in listed.stdout.splitlines()[1:]
               if line[:1].isdigit()}
    assert reasons == {discarded[0]: "discarded", discarded[1]: "discarded",
                       cancelled: "cancelled", failed: "failed"}

    def ids(reason: str) -> list[int]:
        result = run_pgpool(dsn, "dead", "list", "--reason", reason, "--json")
        assert result.returncode == 0, result.stderr
        return sorted(json.loads(line)["id"] for line in result.stdout.splitlines())

    assert ids("discarded") == discarded
    assert ids("cancelled") == [cancelled]
    grouped = run_pgpool(dsn, "dead", "list", "--group", "--json")
    groups = sorted((g["reason"], g["count"]) for g in map(json.loads,
                                                           grouped.stdout.splitlines()))
    # The two discards' reasons differ only in digits: one signature, one group.
    assert groups == [("cancelled", 1), ("discarded", 2), ("failed", 1)]
    # A discarded job can be replayed like any dead job.
    assert ops.replay_dead(db, ops.DeadFilter(reason="discarded")).moved == 2


def test_dead_list_refuses_an_unknown_reason(dsn):
    refused = run_pgpool(dsn, "dead", "list", "--reason", "snoozed")
    assert refused.returncode == 2
    assert "invalid choice: 'snoozed'" in refused.stderr
    assert "discarded" in refused.stderr


# --- at least once ------------------------------------------------------------------------

def test_a_worker_killed_while_raising_snooze_still_runs_its_job(db, dsn, record_dir):
    job_id = pgpool.enqueue(db, "snooze_killed", {})
    host = start_pgpool(dsn, *RUN, "--procs", "1", record_dir=record_dir)
    wait_until(lambda: job_row(db, job_id) is None, "the job to run again and succeed")
    assert host.stop() == 0, host.stderr
    # The snooze never reached the dispatcher: the worker's death failed the attempt (it
    # counts), and the job was retried on the handler's schedule and succeeded.
    assert attempts_seen(record_dir) == [(1, "start"), (2, "end"), (2, "start")]
    assert host.events("job_snoozed") == []
    (retry,) = host.events("job_retry")
    assert (retry["job_id"], retry["cause"]) == (job_id, "worker died: signal 9 (SIGKILL)")
    assert one(db, "SELECT count(*) FROM pgpool_dead") == (0,)


@pytest.mark.soak  # a dispatcher SIGKILLed, a second host: the soak tier, run by CI
def test_a_host_killed_after_a_snooze_leaves_its_job_to_run_again(db, dsn, record_dir):
    job_id = pgpool.enqueue(db, "snoozer", {"until_claim": 1, "seconds": 0.05})
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--lease", "2", record_dir=record_dir)
    host.event("job_snoozed")
    host.kill()  # its ack may or may not have been written: either way the job ends
    host.wait()
    other = start_pgpool(dsn, *RUN, "--procs", "1", "--lease", "2", record_dir=record_dir)
    wait_until(lambda: job_row(db, job_id) is None, "the job to run again and succeed")
    assert other.stop(signal.SIGTERM) == 0, other.stderr
    runs = attempts_seen(record_dir)
    assert runs[-1][1] == "end" and runs[0] == (1, "attempt=1")
    assert one(db, "SELECT count(*) FROM pgpool_dead") == (0,)


# --- the grouped ack ----------------------------------------------------------------------

def test_a_flush_with_what_handlers_asked_for_is_still_one_statement(db, dsn):
    ids = [pgpool.enqueue(db, "k", {"n": i}) for i in range(6)]

    async def scenario(pool):
        jobs = await claimer(pool, "host-a").claim(6)
        completer = Completer(pool, "host-a")
        stolen = await Completer(pool, "host-b").flush([Ack.snooze(jobs[1], 60),
                                                        Ack.discard(jobs[2], "no")])
        result = await completer.flush([
            Ack.done(jobs[0]), Ack.snooze(jobs[1], 60), Ack.discard(jobs[2], "bad input"),
            Ack.cancel(jobs[3], "not wanted"), Ack.dead(jobs[4], "gave up"),
            Ack.retry(jobs[5], 60, "boom"),
        ])
        return stolen, result, completer.stats.flushes

    stolen, result, flushes = run_with_pool(dsn, scenario)
    assert (stolen.snoozed, stolen.dead, stolen.stale) == (0, 0, 2)  # not host-b's to ack
    assert flushes == 1 and result.timeouts == 0
    assert (result.done, result.snoozed, result.dead, result.retried, result.stale) == (
        1, 1, 3, 1, 0)
    snoozed = one(db, "SELECT state, attempts, snoozes, locked_by, last_error,"
                      " run_at > now() + interval '50 seconds' FROM pgpool_jobs WHERE id = %s",
                  ids[1])
    assert snoozed == ("scheduled", 1, 1, None, None, True)
    assert db.execute("SELECT id, reason, last_error FROM pgpool_dead ORDER BY id"
                      ).fetchall() == [(ids[2], "discarded", "bad input"),
                                       (ids[3], "cancelled", "not wanted"),
                                       (ids[4], "failed", "gave up")]
    # Its next claim: attempt 2 as a token, still attempt 1 as counted.
    (again,) = run_with_pool(dsn, lambda pool: _claim_snoozed(pool, db, ids[1]))
    assert (again.attempt, again.snoozes, again.counted) == (2, 1, 1)
    assert again.wire().uncounted == 1


async def _claim_snoozed(pool, db, job_id):
    db.execute("UPDATE pgpool_jobs SET state = 'ready', run_at = now() WHERE id = %s",
               (job_id,))
    return await claimer(pool, "host-a").claim(1)
