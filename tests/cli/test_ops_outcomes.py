"""What operators see of outcomes (issue 24), against real PostgreSQL and real hosts:
`pgpool jobs show` of a job kept as done (its result only when asked for), of a group's
callback (its group's progress) and of a member (its group); `pgpool jobs --state waiting`
and `--group ID`; and `pgpool.ops.show_job` behind them."""

from __future__ import annotations

import json
import threading

import outcomejobs  # noqa: F401  (registers the handlers)
import psycopg
from commands import MARKER, assert_user_error, run_pgpool
from dbtools import one
from waits import wait_until

import pgpool
from pgpool import ops, testing
from pgpool.host.attempt import Job
from pgpool.host.completer import Ack, ack_statement

RUN = ("run", "--handlers", "outcomejobs", "--burst", "--procs", "2")


def shown(dsn: str, job_id: int, *args: str) -> dict:
    done = run_pgpool(dsn, "jobs", "show", str(job_id), "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def fields(dsn: str, job_id: int, *args: str) -> dict[str, str]:
    """The ``name  value`` lines of `jobs show`'s text."""
    done = run_pgpool(dsn, "jobs", "show", str(job_id), *args)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"job {job_id}"
    return {line[2:14].strip(): line[14:] for line in lines[1:] if line[2:14].strip()}


def member_ids(db: psycopg.Connection, group: int) -> list[int]:
    return [i for (i,) in db.execute("SELECT id FROM pgpool_jobs WHERE group_id = %s "
                                     "ORDER BY id", (group,))]


def test_jobs_show_a_kept_success_with_its_result_only_when_asked(db, dsn):
    kept = pgpool.enqueue(db, "out.child", {"secret": MARKER}, tenant="acme")
    loose = pgpool.enqueue(db, "out.loose", {"n": 1})
    dead = pgpool.enqueue(db, "out.square", {"n": 1, "fail": True}, max_attempts=1)
    assert run_pgpool(dsn, *RUN).returncode == 0

    text = fields(dsn, kept)
    assert (text["kind"], text["queue"], text["state"], text["attempts"], text["tenant"]) == (
        "out.child", "default", "done", "1", "acme")
    assert text["result"] == "(not shown: --result shows it)"
    assert text["payload"] == "(not kept once a job succeeds)"
    assert text["finished"].endswith(" ago)") and text["kept until"].endswith("Z")
    assert "member of" not in text and "group" not in text
    assert MARKER not in run_pgpool(dsn, "jobs", "show", str(kept)).stdout
    assert fields(dsn, kept, "--result")["result"] == json.dumps({"secret": MARKER})

    hidden = shown(dsn, kept)
    assert (hidden["state"], hidden["result"], hidden["attempts"], hidden["group_id"]) == (
        "done", None, 1, None)
    assert shown(dsn, kept, "--result")["result"] == {"secret": MARKER}

    # In no table: what is known, in plain words, and how successes are kept; a look
    # changes nothing, and says nothing of changes.
    line = assert_user_error(
        run_pgpool(dsn, "jobs", "show", str(loose)),
        f"job {loose} is not in the queue, not dead-lettered and not kept: either it "
        "finished and nothing kept it", "keep=", "--keep-done", "or it never existed")
    assert "changed" not in line
    line = assert_user_error(run_pgpool(dsn, "jobs", "show", str(dead)),
                             f"job {dead} is dead-lettered", f"pgpool dead show {dead}")
    assert "changed" not in line

    # The Python API behind it.
    found = ops.show_job(db, kept)
    assert isinstance(found, ops.DoneJob) and found.result is None
    assert ops.show_job(db, kept, result=True).result == {"secret": MARKER}


def test_jobs_show_a_groups_progress_and_jobs_lists_waiting_callbacks_and_members(db, dsn):
    group = pgpool.group(db, "out.score", [{"doc": 1}, {"doc": 2}],
                         then=("out.combine", {}))
    first, second = member_ids(db, group.id)
    plain = pgpool.enqueue(db, "out.square", {"n": 1})

    text = fields(dsn, group.id)
    assert text["state"] == "waiting"
    assert text["due / lease"] == "when its group finishes"
    assert text["group"] == "0/2 members finished (0 done, 0 dead or cancelled); callback waiting"
    assert fields(dsn, first)["member of"].startswith(f"group {group.id} ")

    def listed(*args: str) -> list[dict]:
        done = run_pgpool(dsn, "jobs", "--json", *args)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    assert [j["id"] for j in listed("--state", "waiting")] == [group.id]
    members = listed("--group", str(group.id))
    assert [(j["id"], j["group_id"]) for j in members] == [(first, group.id),
                                                           (second, group.id)]
    assert plain not in [j["id"] for j in listed("--group", str(group.id))]
    assert_user_error(run_pgpool(dsn, "jobs", "--group", str(plain)),
                      f"no group has id {plain}", "callback")
    assert_user_error(run_pgpool(dsn, "jobs", "--group", "0"), "'0' is not a job id")

    # A waiting callback is not a job to retry: it runs when its group has finished.
    assert_user_error(run_pgpool(dsn, "retry", str(group.id)),
                      f"job {group.id} is a group's callback waiting for its members",
                      f"pgpool jobs show {group.id}")

    assert run_pgpool(dsn, "cancel", str(second)).returncode == 0
    assert fields(dsn, group.id)["group"].startswith("1/2 members finished (0 done, 1 dead")

    assert run_pgpool(dsn, *RUN).returncode == 0
    callback = shown(dsn, group.id)
    assert callback["state"] == "done" and callback["result"] is None
    progress = callback["group"]
    assert {k: progress[k] for k in ("id", "total", "done", "dead", "finished", "callback")} == {
        "id": group.id, "total": 2, "done": 1, "dead": 1, "finished": 2, "callback": "done"}
    assert progress["completed_at"] is not None
    assert fields(dsn, group.id)["group"].startswith(
        "2/2 members finished (1 done, 1 dead or cancelled); callback done; completed ")
    # A member that succeeded is kept (its callback reads it): shown done, in its group.
    member = shown(dsn, first, "--result")
    assert (member["state"], member["group_id"], member["result"]) == ("done", group.id, 0.5)


# --- replaying the members and callbacks of groups ----------------------------------------


def replayed(dsn: str, job_id: int) -> tuple[list[str], list[str]]:
    """`pgpool dead replay --id` of one job: its stdout and stderr lines."""
    done = run_pgpool(dsn, "dead", "replay", "--id", str(job_id))
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines(), done.stderr.splitlines()


def test_a_replayed_member_of_an_unfinished_group_goes_back_into_it(db, dsn, monkeypatch):
    monkeypatch.setenv("PGPOOL_DSN", dsn)  # the callback reads its members
    group = pgpool.group(db, "out.score", [{"doc": 1}, {"doc": 2}],
                         then=("out.combine", {}))
    first, second = member_ids(db, group.id)
    assert run_pgpool(dsn, "cancel", str(second)).returncode == 0
    assert pgpool.group_status(db, group.id).dead == 1

    out, err = replayed(dsn, second)
    assert out[0].startswith("pgpool: replayed 1 dead job back to ready") and err == []
    # Back in its group, and no longer counted: the group waits for its new end.
    assert pgpool.job_status(db, second).group_id == group.id
    progress = pgpool.group_status(db, group.id)
    assert (progress.done, progress.dead, progress.callback) == (0, 0, "waiting")
    testing.drain(db)
    assert pgpool.job_status(db, group.id).result == {"label": None, "members": 2,
                                                      "total": 1.5, "failed": 0}
    assert [m.id for m in pgpool.group_members(db, group.id)] == [first, second]


def test_a_member_of_a_group_whose_callback_has_not_run_stays_dead(db, dsn):
    group = pgpool.group(db, "out.score", [{"doc": 1}], then=("out.combine", {}))
    (member,) = member_ids(db, group.id)
    assert run_pgpool(dsn, "cancel", str(member)).returncode == 0
    assert pgpool.job_status(db, group.id).state == "ready"  # its group is complete

    out, err = replayed(dsn, member)
    assert out[0].startswith("pgpool: replayed 0 dead jobs back to ready")
    assert err == [f"pgpool: 1 stayed dead: member of group {group.id}, whose callback has "
                   "not run yet (it reads the member's end): replay it after the callback "
                   "has run"]
    assert pgpool.job_status(db, member).state == "cancelled"
    assert pgpool.group_status(db, group.id).dead == 1


def test_a_member_whose_callback_has_run_is_replayed_outside_its_group(db, dsn, monkeypatch):
    monkeypatch.setenv("PGPOOL_DSN", dsn)
    group = pgpool.group(db, "out.score", [{"doc": 1}], then=("out.combine", {}))
    (member,) = member_ids(db, group.id)
    assert run_pgpool(dsn, "cancel", str(member)).returncode == 0
    testing.drain(db)
    assert pgpool.job_status(db, group.id).result["failed"] == 1

    out, err = replayed(dsn, member)
    assert out[0].startswith("pgpool: replayed 1 dead job back to ready")
    assert err == ["pgpool: 1 replayed outside its group: the callback of group "
                   f"{group.id} has run already, and nothing reads the replayed job's end"]
    assert pgpool.job_status(db, member).group_id is None
    assert pgpool.group_status(db, group.id).dead == 1


def test_a_replayed_callback_waits_again_for_its_unfinished_group(db, dsn, monkeypatch):
    monkeypatch.setenv("PGPOOL_DSN", dsn)
    group = pgpool.group(db, "out.score", [{"doc": 1}, {"doc": 2}],
                         then=("out.combine", {}))
    assert run_pgpool(dsn, "cancel", str(group.id)).returncode == 0
    out, err = replayed(dsn, group.id)
    assert pgpool.job_status(db, group.id).state == "waiting"
    assert out[0].startswith("pgpool: replayed 1 dead job back")
    assert err == [f"pgpool: 1 of them waits again: the callback of group {group.id} runs "
                   "once its members have all finished"]
    testing.drain(db)
    assert pgpool.job_status(db, group.id).result["members"] == 2

    # The callback of a group complete meanwhile is ready at once.
    done = pgpool.group(db, "out.score", [{"doc": 3}], then=("out.combine", {}))
    assert run_pgpool(dsn, "cancel", str(done.id)).returncode == 0
    testing.drain(db)
    assert pgpool.group_status(db, done.id).completed_at is not None
    out, err = replayed(dsn, done.id)
    assert out[0].startswith("pgpool: replayed 1 dead job back") and err == []
    assert pgpool.job_status(db, done.id).state == "ready"
    testing.drain(db)
    assert pgpool.job_status(db, done.id).result["members"] == 1


def test_a_callback_replayed_while_its_last_member_is_acked_is_released(db, dsn):
    # Issue 31 C3: the ack of the last member begins (its snapshot taken) while the replay
    # of the cancelled callback holds the group's row; the replay commits, the ack counts
    # the member and completes the group. Its snapshot cannot see the callback back: made
    # ready by the ack's own statement, it stayed waiting forever.
    group = pgpool.group(db, "out.score", [{"doc": 1}, {"doc": 2}],
                         then=("out.combine", {}))
    first, last = member_ids(db, group.id)
    ops.cancel(db, [first, group.id])  # one member dead, the callback cancelled waiting
    db.execute("UPDATE pgpool_jobs SET state = 'running', attempts = 1, locked_by = 'host', "
               "lease_until = now() + interval '1 minute' WHERE id = %s", (last,))
    job = Job(last, "out.score", "default", 1, 0, 1, b"{}", None, group_id=group.id)
    query, params = ack_statement([Ack.done(job, 0.0)], "host")

    with psycopg.connect(dsn) as replay, psycopg.connect(dsn, autocommit=True) as ack:
        assert ops.replay_dead(replay, ops.DeadFilter(ids=[group.id])).waiting == [group.id]
        acked: list[object] = []
        thread = threading.Thread(
            target=lambda: acked.append(ack.execute(query, params).fetchone()[0]))
        thread.start()
        try:
            wait_until(lambda: one(db, "SELECT wait_event_type = 'Lock' FROM "
                                       "pg_stat_activity WHERE pid = %s",
                                   ack.info.backend_pid)[0],
                       "the ack to wait for the replay's lock on the group")
        finally:
            replay.commit()
            thread.join(30)
    assert acked == [1]
    progress = pgpool.group_status(db, group.id)
    assert (progress.done, progress.dead, progress.completed_at is not None) == (1, 1, True)
    assert pgpool.job_status(db, group.id).state == "ready"


def test_purge_keeps_the_members_whose_callback_has_not_run_unless_forced(db, dsn):
    group = pgpool.group(db, "out.score", [{"doc": 1}, {"doc": 2}],
                         then=("out.combine", {}))
    first, second = member_ids(db, group.id)
    loose = pgpool.enqueue(db, "out.square", {"n": 1})
    ops.cancel(db, [first, second, loose])
    db.execute("UPDATE pgpool_dead SET died_at = now() - interval '2 days'")
    kept = (f"2 dead jobs stay: members of group {group.id}, whose callback has not run yet "
            "(it reads their ends): --force deletes them too")

    dry = run_pgpool(dsn, "dead", "purge", "--older-than", "1d", "--dry-run")
    assert dry.stdout == "pgpool: dry run: would delete 1 dead job; nothing changed\n"
    assert dry.stderr == f"pgpool: {kept}\n"
    done = run_pgpool(dsn, "dead", "purge", "--older-than", "1d")
    assert done.stdout.startswith("pgpool: deleted 1 dead job in ")
    assert done.stderr == f"pgpool: {kept}\n"
    assert [i for (i,) in db.execute("SELECT id FROM pgpool_dead ORDER BY id")] == [first, second]
    forced = run_pgpool(dsn, "dead", "purge", "--older-than", "1d", "--force")
    assert forced.stdout.startswith("pgpool: deleted 2 dead jobs in ") and forced.stderr == ""
    assert one(db, "SELECT count(*) FROM pgpool_dead") == (0,)


def test_the_notes_of_a_replay_or_purge_name_the_groups_in_words():
    replayed = ops.Replayed(refused=3, refused_groups=[4, 9], outside=2, outside_groups=[7],
                            waiting=[12, 15])
    assert replayed.notes() == [
        "3 stayed dead: members of groups 4, 9, whose callbacks have not run yet (they read "
        "their ends): replay them after the callbacks have run",
        "2 replayed outside their group: the callback of group 7 has run already, and "
        "nothing reads the replayed jobs' ends",
        "2 of them wait again: the callbacks of groups 12, 15 run once their members have "
        "all finished"]
    assert ops.Replayed(refused=2, refused_groups=[4], outside=3,
                        outside_groups=[5, 6]).notes() == [
        "2 stayed dead: members of group 4, whose callback has not run yet (it reads their "
        "ends): replay them after the callback has run",
        "3 replayed outside their groups: the callbacks of groups 5, 6 have run already, and "
        "nothing reads the replayed jobs' ends"]
    assert ops.Purged(kept=1, kept_groups=[4]).notes() == [
        "1 dead job stays: member of group 4, whose callback has not run yet (it reads the "
        "member's end): --force deletes it too"]
    assert ops.Purged(deleted=5).notes() == ops.Replayed(moved=5).notes() == []
