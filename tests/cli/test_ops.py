"""Operator commands against a real database: jobs, dead (list, group, show, replay,
purge), cancel, retry, pause and resume, through the CLI and the Python API
(`pgpool.ops`). What a running dispatcher does about them is in tests/host/test_steer.py."""

from __future__ import annotations

import asyncio
import json
import re

import psycopg
import pytest
from commands import MARKER, assert_user_error, run_pgpool, status_json
from dbtools import one

import pgpool
from pgpool import ops
from pgpool.worker.main import format_error


def stored_error(exc: Exception) -> str:
    """The error text a worker stores for ``exc``, raised for real (with a traceback)."""
    try:
        raise exc
    except Exception as raised:
        return format_error(raised)


def bury(db: psycopg.Connection, job_id: int, kind: str, error: str, *, queue: str = "default",
         died_ago: str = "1 minute", payload: str = '{"n": 1}', unique_key: str | None = None
         ) -> None:
    """A dead job, as the ack's dead arm writes one."""
    db.execute(
        "INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, max_attempts, "
        "unique_key, last_error, created_at, died_at) "
        "VALUES (%s, %s, %s, %s, 0, 3, 3, %s, %s, now() - interval '1 day', "
        "now() - %s::interval)",
        (job_id, queue, kind, payload, unique_key, error, died_ago))


def lines(result) -> list[str]:
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def table(result) -> list[list[str]]:
    """The rows of a printed table (header first), split on runs of 2+ spaces."""
    return [re.split(r"\s{2,}", line) for line in lines(result) if not line.startswith("(")]


@pytest.fixture
def dlq(db):
    """Dead jobs of three signatures: 3 ValueErrors naming different orders, 2 KeyErrors
    (one died 3 days ago), 1 worker killed by a signal; in queues default and q2."""
    for i, order in enumerate((101, 202, 303)):
        bury(db, 1000 + i, "charge", stored_error(ValueError(f"order {order} declined")),
             payload=json.dumps({"secret": MARKER}))
    bury(db, 2000, "ship", stored_error(KeyError("addr_0x7f3a")))
    bury(db, 2001, "ship", stored_error(KeyError("addr_0x99")), died_ago="3 days")
    bury(db, 3000, "charge", "worker died: signal 9 (SIGKILL)", queue="q2")
    return db


# --- inspect ------------------------------------------------------------------------------

def test_jobs_lists_state_attempts_due_lease_owner_and_error_without_payloads(db, dsn):
    ready = pgpool.enqueue(db, "record", {"secret": MARKER})
    later = pgpool.enqueue(db, "record", {}, delay=600, queue="q2")
    running = pgpool.enqueue(db, "fail", {})
    db.execute("UPDATE pgpool_jobs SET state = 'running', attempts = 1, max_attempts = 3, "
               "locked_by = 'h:1:ab', lease_until = now() + interval '10 minutes', "
               "last_error = %s WHERE id = %s", (stored_error(ValueError("boom")), running))

    rows = table(run_pgpool(dsn, "jobs"))
    assert rows[0] == ["ID", "KIND", "QUEUE", "STATE", "ATTEMPTS", "DUE / LEASE", "OWNER",
                       "ERROR"]
    by_id = {int(r[0]): r for r in rows[1:]}
    assert by_id[ready][1:5] == ["record", "default", "ready", "0"]
    assert by_id[ready][5].startswith("due ")
    assert by_id[later][3:6] == ["scheduled", "0", "in 10m"]
    # Minutes, rounded: a slow start of the command cannot change what is printed.
    assert by_id[running][3:] == ["running", "1/3", "lease 10m left", "h:1:ab",
                                  "ValueError: boom"]
    assert MARKER not in run_pgpool(dsn, "jobs").stdout

    out = lines(run_pgpool(dsn, "jobs", "--state", "scheduled", "--json"))
    assert [json.loads(line)["id"] for line in out] == [later]
    assert json.loads(out[0])["payload"] is None
    out = lines(run_pgpool(dsn, "jobs", "--queue", "default", "--json", "--payload"))
    assert {json.loads(line)["id"]: json.loads(line)["payload"] for line in out} == {
        ready: {"secret": MARKER}, running: {}}
    assert lines(run_pgpool(dsn, "jobs", "--older-than", "1h")) == ["(no jobs match)"]
    limited = lines(run_pgpool(dsn, "jobs", "--limit", "1"))
    assert limited[-1] == "(1 jobs; more match: raise --limit)"


def test_jobs_show_prints_the_whole_error_and_the_payload_only_when_asked(db, dsn):
    job = pgpool.enqueue(db, "record", {"secret": MARKER})
    db.execute("UPDATE pgpool_jobs SET last_error = %s WHERE id = %s",
               (stored_error(ValueError("first\nsecond")), job))
    out = run_pgpool(dsn, "jobs", "show", str(job)).stdout
    assert out.startswith(f"job {job}\n")
    assert "Traceback (most recent call last):" in out and "ValueError: first" in out
    assert MARKER not in out and "(not shown: --payload shows it)" in out
    assert MARKER in run_pgpool(dsn, "jobs", "show", str(job), "--payload").stdout
    shown = json.loads(run_pgpool(dsn, "jobs", "show", str(job), "--json").stdout)
    assert (shown["id"], shown["state"], shown["error"]) == (job, "ready", "second")


def test_dead_list_filters_and_shows_signatures(dlq, dsn):
    rows = table(run_pgpool(dsn, "dead", "list"))
    assert rows[0] == ["ID", "KIND", "QUEUE", "REASON", "ATTEMPTS", "DIED", "ERROR"]
    assert [int(r[0]) for r in rows[1:]] == [3000, 2000, 1002, 1001, 1000, 2001]  # newest first
    assert rows[-1][5] == "3d ago" and rows[-1][6] == "KeyError: 'addr_0x99'"

    def ids(*args: str) -> list[int]:
        return sorted(json.loads(line)["id"]
                      for line in lines(run_pgpool(dsn, "dead", "list", "--json", *args)))

    assert ids("--kind", "ship") == [2000, 2001]
    assert ids("--error", "order 202") == [1001]
    assert ids("--since", "1d") == [1000, 1001, 1002, 2000, 3000]
    assert ids("--older-than", "1d") == [2001]
    assert ids("--queue", "q2") == [3000]
    assert ids("--signature", "ValueError: order # declined") == [1000, 1001, 1002]
    listed = json.loads(lines(run_pgpool(dsn, "dead", "list", "--json", "--id", "1000"))[0])
    assert listed["payload"] is None and listed["reason"] == "failed"
    assert MARKER not in run_pgpool(dsn, "dead", "list").stdout


def test_dead_list_group_counts_by_kind_and_error_signature(dlq, dsn):
    rows = table(run_pgpool(dsn, "dead", "list", "--group"))
    assert rows[0] == ["COUNT", "KIND", "REASON", "SIGNATURE", "LAST DIED", "FIRST DIED",
                       "EXAMPLE"]
    assert [(r[0], r[1], r[2], r[3], r[6]) for r in rows[1:]] == [
        ("3", "charge", "failed", "ValueError: order # declined", "1000"),
        # 0x7f3a and 0x99 are normalised alike: the same failure
        ("2", "ship", "failed", "KeyError: 'addr_#'", "2000"),
        ("1", "charge", "failed", "worker died: signal # (SIGKILL)", "3000"),
    ]
    assert lines(run_pgpool(dsn, "dead", "list", "--group"))[-1] == (
        "(6 dead jobs in 3 groups)")
    grouped = [json.loads(line) for line in
               lines(run_pgpool(dsn, "dead", "list", "--group", "--json", "--kind", "ship"))]
    assert [(g["signature"], g["count"]) for g in grouped] == [("KeyError: 'addr_#'", 2)]


def test_dead_show(dlq, dsn):
    out = run_pgpool(dsn, "dead", "show", "1001").stdout
    assert out.startswith("dead job 1001\n")
    assert "signature   ValueError: order # declined" in out
    assert "Traceback (most recent call last):" in out and MARKER not in out
    assert MARKER in run_pgpool(dsn, "dead", "show", "1001", "--payload").stdout


# --- replay and purge ---------------------------------------------------------------------

def test_replay_moves_matching_dead_jobs_back_with_their_ids_and_attempts_reset(dlq, dsn):
    dry = run_pgpool(dsn, "dead", "replay", "--kind", "charge", "--dry-run")
    assert lines(dry) == ["pgpool: dry run: would replay 4 dead jobs; nothing changed"]
    assert one(dlq, "SELECT count(*) FROM pgpool_dead") == (6,)

    done = run_pgpool(dsn, "dead", "replay", "--signature", "ValueError: order # declined")
    assert re.fullmatch(r"pgpool: replayed 3 dead jobs back to ready in \d+\.\d\ds "
                        r"\(1 batch\)\n", done.stdout), done.stdout
    assert dlq.execute("SELECT id, state, attempts, max_attempts, payload->>'secret', "
                       "run_at <= now() FROM pgpool_jobs ORDER BY id").fetchall() == [
        (i, "ready", 0, 3, MARKER, True) for i in (1000, 1001, 1002)]
    assert one(dlq, "SELECT count(*) FROM pgpool_dead") == (3,)


def test_replay_keeps_a_job_dead_when_a_live_job_holds_its_unique_key(db, dsn):
    pgpool.enqueue(db, "ship", {}, unique_key="order-7")
    bury(db, 5000, "ship", "x", unique_key="order-7")
    bury(db, 5001, "ship", "x", unique_key="order-8")
    done = run_pgpool(dsn, "dead", "replay", "--all")
    assert "replayed 1 dead job back" in done.stdout
    assert "1 stayed dead: a live job of the same kind holds its unique key" in done.stderr
    assert db.execute("SELECT id FROM pgpool_dead").fetchall() == [(5000,)]


def test_a_replay_at_a_rate_trickles(db, dsn):
    for i in range(50):
        bury(db, 6000 + i, "record", "x")
    done = run_pgpool(dsn, "dead", "replay", "--all", "--rate", "100")
    seconds = float(re.search(r"replayed 50 dead jobs back to ready in (\d+\.\d+)s "
                              r"\(\d+ batches at up to 100 jobs/s\)", done.stdout).group(1))
    # 50 jobs at 100/s go in batches of 10 (a tenth of a second's worth), the k-th no
    # sooner than k/10 s after the first: the fifth starts at 0.4 s at the earliest. No
    # upper bound but a loose one: a loaded machine may be slower, never faster.
    assert 0.4 <= seconds < 30
    # The database saw the same spread: batch k's now() is no earlier than the moment it
    # was allowed to start; the first may have started up to a batch interval late.
    spread = one(db, "SELECT extract(epoch FROM max(run_at) - min(run_at)) FROM pgpool_jobs")[0]
    assert spread >= 0.3
    assert one(db, "SELECT count(*), count(DISTINCT run_at) FROM pgpool_jobs") == (50, 5)


def test_purge_deletes_old_dead_jobs_in_batches_and_dry_run_changes_nothing(db, dsn):
    db.execute("INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, "
               "created_at, died_at) SELECT g, 'default', 'k', '{}', 0, 1, now(), "
               "now() - interval '10 days' FROM generate_series(1, 2500) g")
    bury(db, 9000, "k", "recent")
    dry = run_pgpool(dsn, "dead", "purge", "--older-than", "7d", "--dry-run")
    assert lines(dry) == ["pgpool: dry run: would delete 2500 dead jobs; nothing changed"]
    assert one(db, "SELECT count(*) FROM pgpool_dead") == (2501,)
    done = run_pgpool(dsn, "dead", "purge", "--older-than", "7d")
    assert re.fullmatch(r"pgpool: deleted 2500 dead jobs in \d+\.\d\ds \(3 batches\)\n",
                        done.stdout), done.stdout
    assert db.execute("SELECT id FROM pgpool_dead").fetchall() == [(9000,)]


# --- cancel, retry, pause -----------------------------------------------------------------

def test_cancel_moves_waiting_jobs_to_dead_with_a_trace(db, dsn):
    ready = pgpool.enqueue(db, "record", {})
    later = pgpool.enqueue(db, "record", {}, delay=600)
    assert lines(run_pgpool(dsn, "cancel", str(ready), "--dry-run")) == [
        f"pgpool: would cancel job {ready} (was ready; it will not run)",
        "pgpool: dry run: nothing changed"]
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (2,)

    out = lines(run_pgpool(dsn, "cancel", str(ready), str(later)))
    assert out[:2] == [f"pgpool: cancelled job {ready} (was ready; it will not run)",
                       f"pgpool: cancelled job {later} (was scheduled; it will not run)"]
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (0,)
    dead = db.execute("SELECT id, reason, last_error FROM pgpool_dead ORDER BY id").fetchall()
    assert [(i, r) for i, r, _ in dead] == [(ready, "cancelled"), (later, "cancelled")]
    assert re.fullmatch(r"cancelled by operator at \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ "
                        r"while ready", dead[0][2])
    cancelled = lines(run_pgpool(dsn, "dead", "list", "--reason", "cancelled", "--json"))
    assert len(cancelled) == 2


def test_retry_makes_a_job_waiting_out_its_backoff_due_now(db, dsn):
    waiting = pgpool.enqueue(db, "record", {}, delay=3600)
    due = pgpool.enqueue(db, "record", {})
    assert lines(run_pgpool(dsn, "retry", str(waiting), "--dry-run"))[0] == (
        f"pgpool: job {waiting} would run now")
    assert one(db, "SELECT run_at > now() FROM pgpool_jobs WHERE id = %s", waiting) == (True,)
    assert lines(run_pgpool(dsn, "retry", str(waiting), str(due))) == [
        f"pgpool: job {waiting} runs now", f"pgpool: job {due} was already due; unchanged"]
    assert one(db, "SELECT run_at <= now() FROM pgpool_jobs WHERE id = %s", waiting) == (True,)


def test_pause_and_resume_record_the_pause_and_status_shows_it(db, dsn):
    pgpool.enqueue(db, "record", {}, queue="q2")
    assert lines(run_pgpool(dsn, "pause", "q2", "--dry-run")) == [
        "pgpool: dry run: would pause queue q2; nothing changed"]
    assert one(db, "SELECT count(*) FROM pgpool_paused") == (0,)
    assert "paused queue q2" in run_pgpool(dsn, "pause", "q2").stdout
    assert lines(run_pgpool(dsn, "pause", "q2")) == ["pgpool: queue q2 is already paused"]
    queues = {q["queue"]: q for q in status_json(dsn)["queues"]}
    assert queues["q2"]["paused"] is True and queues["q2"]["paused_at"]
    text = run_pgpool(dsn, "status").stdout
    assert re.search(r"^  q2 \(paused\)\s+1\s+0\s+0\s+0\s+0\s+0\s", text, re.M), text
    # A queue nothing uses yet can be paused on purpose, before its first job.
    assert "paused queue fresh" in run_pgpool(dsn, "pause", "fresh", "--force").stdout
    assert lines(run_pgpool(dsn, "resume", "q2")) == ["pgpool: resumed queue q2"]
    assert lines(run_pgpool(dsn, "resume", "q2")) == ["pgpool: queue q2 was not paused"]
    assert db.execute("SELECT queue FROM pgpool_paused").fetchall() == [("fresh",)]


# --- bad input: one line, nothing changes ------------------------------------------------

def test_bad_ids_unknown_queues_and_conflicting_filters_are_one_line_errors(dlq, dsn):
    live = pgpool.enqueue(dlq, "record", {}, delay=600)
    before = (one(dlq, "SELECT count(*), max(run_at) FROM pgpool_jobs"),
              one(dlq, "SELECT count(*) FROM pgpool_dead"))

    assert_user_error(run_pgpool(dsn, "cancel", str(live), "999999"),
                      "no live job has id 999999", "nothing was changed")
    assert_user_error(run_pgpool(dsn, "cancel", "1000"), "job 1000 is dead",
                      "pgpool dead replay --id 1000")
    assert_user_error(run_pgpool(dsn, "retry", str(live), "abc"), "'abc' is not a job id")
    assert_user_error(run_pgpool(dsn, "retry", "0"), "'0' is not a job id")
    assert_user_error(run_pgpool(dsn, "jobs", "show", "424242"),
                      "job 424242 is not in the queue")
    assert_user_error(run_pgpool(dsn, "dead", "show", str(live)),
                      f"no dead job has id {live}", f"pgpool jobs show {live}")
    assert_user_error(run_pgpool(dsn, "pause", "nope"), "unknown queue 'nope'")
    assert_user_error(run_pgpool(dsn, "resume", "nope"), "unknown queue 'nope'")
    assert_user_error(run_pgpool(dsn, "jobs", "--queue", "nope"), "unknown queue 'nope'")
    assert_user_error(run_pgpool(dsn, "dead", "replay", "--queue", "nope"),
                      "unknown queue 'nope'")
    assert_user_error(run_pgpool(dsn, "pause", "bad name"), "invalid queue 'bad name'")
    assert_user_error(run_pgpool(dsn, "dead", "list", "--since", "1h", "--older-than", "2h"),
                      "conflicting filters")
    assert_user_error(run_pgpool(dsn, "dead", "replay", "--all", "--kind", "ship"),
                      "conflicting options: --all")
    assert_user_error(run_pgpool(dsn, "dead", "replay"), "say which dead jobs to replay")
    assert_user_error(run_pgpool(dsn, "dead", "purge"), "--older-than")
    assert_user_error(run_pgpool(dsn, "dead", "purge", "--older-than", "7 days"),
                      "'7 days' is not a duration")
    assert_user_error(run_pgpool(dsn, "dead", "replay", "--all", "--rate", "0"),
                      "'0' is not a positive number of jobs per second")
    assert_user_error(run_pgpool(dsn, "jobs", "--state", "dead"), "invalid choice: 'dead'")
    assert_user_error(run_pgpool(dsn, "run", "--dead-retention", "soon"),
                      "'soon' is not a duration")

    assert (one(dlq, "SELECT count(*), max(run_at) FROM pgpool_jobs"),
            one(dlq, "SELECT count(*) FROM pgpool_dead")) == before


def test_retry_of_a_running_job_changes_nothing(db):
    waiting = pgpool.enqueue(db, "record", {}, delay=600)
    running = pgpool.enqueue(db, "record", {})
    db.execute("UPDATE pgpool_jobs SET state = 'running', attempts = 1, locked_by = 'h' "
               "WHERE id = %s", (running,))
    with pytest.raises(ops.JobNotFound, match=f"job {running} is running, not waiting"):
        ops.retry(db, [waiting, running])
    assert one(db, "SELECT run_at > now() FROM pgpool_jobs WHERE id = %s", waiting) == (True,)


def test_retry_runs_a_parked_job_again_and_refuses_a_kept_one(db, dsn):
    # What pgpool.host.isolate leaves when the database refuses an ack
    # (tests/db/test_isolate.py).
    parked = pgpool.enqueue(db, "record", {})
    kept = pgpool.enqueue(db, "record", {})
    db.execute("UPDATE pgpool_jobs SET state = 'parked', attempts = 1, last_error = 'x' "
               "WHERE id = %s", (parked,))
    db.execute("UPDATE pgpool_jobs SET state = 'done', attempts = 1 WHERE id = %s", (kept,))
    listed = {json.loads(line)["id"]: json.loads(line)["state"]
              for line in lines(run_pgpool(dsn, "jobs", "--json"))}
    assert listed == {parked: "parked", kept: "done"}
    assert_user_error(run_pgpool(dsn, "retry", str(parked), str(kept)),
                      f"job {kept} succeeded (kept as done")
    assert one(db, "SELECT state FROM pgpool_jobs WHERE id = %s", parked) == ("parked",)
    assert lines(run_pgpool(dsn, "retry", str(parked))) == [f"pgpool: job {parked} runs now"]
    assert one(db, "SELECT state, run_at <= now() FROM pgpool_jobs WHERE id = %s",
               parked) == ("ready", True)


# --- the Python twins run in the caller's transaction -------------------------------------

def test_ops_run_in_the_callers_transaction(dsn, db):
    job = pgpool.enqueue(db, "record", {})
    bury(db, 7000, "record", "x")
    with psycopg.connect(dsn) as conn:  # not autocommit: the caller's transaction
        assert [c.id for c in ops.cancel(conn, [job])] == [job]
        ops.pause(conn, "default")
        assert ops.replay_dead(conn, ops.DeadFilter(ids=[7000])).moved == 1
        with pytest.raises(ops.JobNotFound):  # a savepoint: the transaction stays usable
            ops.cancel(conn, [123456])
        assert ops.paused(conn).keys() == {"default"}
        conn.rollback()
    assert one(db, "SELECT count(*) FROM pgpool_jobs WHERE id = %s", job) == (1,)
    assert one(db, "SELECT count(*) FROM pgpool_paused") == (0,)
    assert one(db, "SELECT count(*) FROM pgpool_dead") == (1,)
    with psycopg.connect(dsn) as conn, pytest.raises(pgpool.ConfigError, match="autocommit"):
        ops.replay_dead(conn, ops.DeadFilter(), rate=10)


def test_every_operation_has_an_async_twin_that_does_the_same(dsn, db):
    job = pgpool.enqueue(db, "record", {}, delay=600)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            assert (await ops.retry_async(conn, [job])).now == [job]
            listed = await ops.list_jobs_async(conn, ops.JobFilter(state="ready"))
            assert [j.id for j in listed.rows] == [job]
            assert await ops.pause_async(conn, "default")
            assert [c.was for c in await ops.cancel_async(conn, [job])] == ["ready"]
            assert (await ops.show_dead_async(conn, job)).reason == "cancelled"
            assert (await ops.replay_dead_async(conn, ops.DeadFilter(), rate=1000)).moved == 1
            assert (await ops.purge_dead_async(conn, ops.DeadFilter())).deleted == 0

    asyncio.run(main())
    assert one(db, "SELECT count(*) FROM pgpool_jobs") == (1,)
