"""``pgpool web``'s HTTP API, without a browser: a real ``pgpool web`` process on a free
port, real HTTP (urllib), real PostgreSQL. The page itself is tested in a browser in
tests/web (``make web-test``)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from commands import MARKER, assert_user_error, clean_env, run_pgpool
from dbtools import listeners, one, queue_counts
from places import HANDLERS, ROOT
from prometheus_client.parser import text_string_to_metric_families
from waits import wait_until

import pgpool
from pgpool import ops
from pgpool.web.config import MISSING_EXTRA, READ_ONLY
from pgpool.web.snapshots import APPLICATION_NAME

#: Seconds an answer may take: generous, the machine is shared with other test runs.
TIMEOUT = 20
#: Every action the API has, each with a body it would accept.
ACTIONS = [
    ("/api/jobs/{job}/cancel", {}),
    ("/api/jobs/{job}/retry", {}),
    ("/api/queues/alpha/pause", {}),
    ("/api/queues/alpha/resume", {}),
    ("/api/dead/replay", {"all": True}),
    ("/api/dead/purge", {"all": True}),
    ("/api/limits/set", {"kind": "noop", "concurrency": 2}),
    ("/api/limits/reset", {"kind": "noop"}),
]
USER, PASSWORD = "alice", "correct horse"
#: The `web` fixture: starts a ``pgpool web``; (process, base URL).
Web = Callable[..., tuple[Any, str]]
AUTH_ENV = {"PGPOOL_WEB_USER": USER, "PGPOOL_WEB_PASSWORD": PASSWORD}


def http(url: str, body: Any = None, headers: dict[str, str] | None = None,
         auth: tuple[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    """(status, headers, parsed JSON or text) of a GET, or of a POST when ``body`` is given."""
    headers = dict(headers or {})
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers,
                                     method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            status, got, text = answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as exc:
        status, got, text = exc.code, dict(exc.headers), exc.read().decode()
    if got.get("Content-Type", "").startswith("application/json"):
        return status, got, json.loads(text)
    return status, got, text


def get(url: str, **kwargs: Any) -> Any:
    """The JSON of a GET that must answer 200."""
    status, _, body = http(url, **kwargs)
    assert status == 200, (url, status, body)
    return body


def token(base: str, **kwargs: Any) -> dict[str, str]:
    """The CSRF header of the session."""
    return {"X-CSRF-Token": get(base + "/api/session", **kwargs)["csrf_token"]}


def sse(url: str) -> Iterator[tuple[str, Any]]:
    """The (event, data) of a server-sent event stream; each read waits at most TIMEOUT."""
    with urllib.request.urlopen(url, timeout=TIMEOUT) as stream:
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        name, data = None, []
        for raw in stream:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data.append(line[len("data: "):])
            elif not line and data:
                yield name, json.loads("\n".join(data))
                name, data = None, []


def queue_of(snapshot: dict[str, Any], name: str) -> dict[str, Any]:
    return next(q for q in snapshot["queues"] if q["queue"] == name)


def seed(db: psycopg.Connection) -> dict[str, list[int]]:
    """Jobs in two queues: ready ones, a delayed one, and dead ones (cancelled); every
    payload holds MARKER, which must never show unless payloads are allowed."""
    payload = {"secret": MARKER}
    ready = [pgpool.enqueue(db, "noop", payload, queue="alpha") for _ in range(3)]
    ready += [pgpool.enqueue(db, "noop", payload, queue="beta") for _ in range(2)]
    later = [pgpool.enqueue(db, "noop", payload, queue="beta", delay=3600)]
    dead = [pgpool.enqueue(db, "flaky", payload, queue="beta") for _ in range(4)]
    ops.cancel(db, dead)
    return {"ready": ready, "later": later, "dead": dead}


def test_snapshot_counts_match_the_database(db: psycopg.Connection, web: Web) -> None:
    seed(db)
    _, base = web()
    snapshot = get(base + "/api/snapshot")
    for queue in ("alpha", "beta"):
        got = queue_of(snapshot, queue)
        expected = queue_counts(db, queue)
        assert {k: got[k] for k in expected} == expected, (queue, got)
        assert got["lag"] is not None and got["lag"] >= 0
        assert snapshot["lag_history"][queue][-1][1] == got["lag"]
    assert queue_of(snapshot, "beta")["dead"] == 4 and queue_of(snapshot, "beta")["scheduled"]
    assert set(snapshot) >= {"hosts", "fleet", "vacuum", "unhandled", "lag_history"}
    # The page reads a queue's counts by their names in this JSON (`q.parked_done`...).
    page = (ROOT / "pgpool" / "web" / "static" / "app.js").read_text()
    assert set(re.findall(r"\bq\.(\w+)", page)) <= set(queue_of(snapshot, "alpha"))


def test_events_push_a_new_snapshot_after_an_enqueue(db: psycopg.Connection,
                                                    web: Web) -> None:
    _, base = web()
    stream = sse(base + "/api/events")
    name, first = next(stream)
    assert name == "snapshot" and first["queues"] == []
    job_id = pgpool.enqueue(db, "noop", {}, queue="gamma")
    # Each read waits at most TIMEOUT; a snapshot comes at least every PERIOD seconds, so
    # the loop ends within a few events once the job is in one.
    for name, data in stream:
        assert name == "snapshot", data
        if [q["ready"] for q in data["queues"] if q["queue"] == "gamma"] == [1]:
            break
    assert get(f"{base}/api/jobs/{job_id}")["state"] == "ready"


def test_every_stream_shares_one_snapshot_loop(db: psycopg.Connection, web: Web) -> None:
    """20 open streams all get the new snapshot, and the server holds no more database
    sessions for them than for none: they share its one loop."""
    _, base = web()

    def sessions() -> int:
        return one(db, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                       "AND datname = current_database()", APPLICATION_NAME)[0]

    get(base + "/api/snapshot")  # the loop runs: its connections are open
    wait_until(lambda: listeners(db), "the server's LISTEN", TIMEOUT)
    before = sessions()
    streams = [sse(base + "/api/events") for _ in range(20)]
    for stream in streams:
        assert next(stream)[0] == "snapshot"
    pgpool.enqueue(db, "noop", {}, queue="delta")
    for stream in streams:
        for _, data in stream:
            if any(q["queue"] == "delta" for q in data["queues"]):
                break
    assert sessions() == before


def test_read_only_refuses_every_action(db: psycopg.Connection, web: Web) -> None:
    jobs = seed(db)
    _, base = web()
    headers = token(base)
    for path, body in ACTIONS:
        status, _, answer = http(base + path.format(job=jobs["ready"][0]), body, headers)
        assert (status, answer) == (403, {"error": READ_ONLY}), path
    assert queue_counts(db, "alpha") == {"ready": 3, "scheduled": 0, "running": 0, "dead": 0}
    assert queue_counts(db, "beta")["dead"] == 4
    assert one(db, "SELECT count(*) FROM pgpool_paused")[0] == 0
    assert one(db, "SELECT count(*) FROM pgpool_limits")[0] == 0
    assert get(base + "/api/session")["read_write"] is False


def test_authentication_is_required_when_configured(db: psycopg.Connection,
                                                    web: Web) -> None:
    # Off loopback, actions are allowed once a login is required.
    _, base = web("--host", "0.0.0.0", "--read-write", **AUTH_ENV)
    for path in ("/api/session", "/api/snapshot", "/api/jobs", "/metrics", "/"):
        status, headers, _ = http(base + path)
        assert status == 401, path
        assert headers["WWW-Authenticate"].startswith("Basic ")
    assert http(base + "/api/session", auth=(USER, "wrong"))[0] == 401
    assert http(base + "/api/session", auth=("bob", PASSWORD))[0] == 401
    session = get(base + "/api/session", auth=(USER, PASSWORD))
    assert (session["user"], session["read_write"]) == (USER, True)
    assert http(base + "/api/queues/alpha/pause", {})[0] == 401
    assert get(base + "/healthz") == {"ok": True}  # probes carry no credentials


def test_actions_off_loopback_need_authentication(dsn: str) -> None:
    for flag in ("--read-write", "--allow-payloads"):
        done = run_pgpool(dsn, "web", "--host", "0.0.0.0", flag)
        assert_user_error(done, flag, "0.0.0.0", "PGPOOL_WEB_USER", "PGPOOL_WEB_PASSWORD")
    done = run_pgpool(dsn, "web", "--read-write", PGPOOL_WEB_USER=USER)
    assert_user_error(done, "PGPOOL_WEB_PASSWORD")


def test_without_the_web_extra_one_line_says_how_to_install_it(dsn: str) -> None:
    # sys.modules[name] = None makes `import aiohttp` fail as if it were not installed.
    code = ("import sys; sys.modules['aiohttp'] = None; from pgpool.cli import main; "
            "sys.exit(main(['web']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=HANDLERS, capture_output=True,
                          text=True, timeout=60, env={**clean_env(), "PGPOOL_DSN": dsn})
    assert assert_user_error(done) == f"pgpool: error: {MISSING_EXTRA}"


def test_an_action_needs_the_csrf_token_and_the_same_origin(db: psycopg.Connection,
                                                            web: Web) -> None:
    seed(db)
    _, base = web("--read-write")
    pause = base + "/api/queues/alpha/pause"
    status, _, answer = http(pause, {})
    assert status == 403 and "X-CSRF-Token" in answer["error"]
    assert http(pause, {}, {"X-CSRF-Token": "0" * 64})[0] == 403
    headers = {**token(base), "Origin": "http://evil.example"}
    status, _, answer = http(pause, {}, headers)
    assert status == 403 and "cross-origin" in answer["error"]
    # DNS rebinding: a page of another name that resolves to 127.0.0.1.
    assert http(base + "/api/session", headers={"Host": "evil.example"})[0] == 421
    assert one(db, "SELECT count(*) FROM pgpool_paused")[0] == 0
    status, _, answer = http(pause, {}, {**token(base), "Origin": base})
    assert (status, answer["paused"]) == (200, True)


def test_actions_work_and_are_logged_with_the_user(db: psycopg.Connection, web: Web) -> None:
    jobs = seed(db)
    proc, base = web("--read-write", **AUTH_ENV)
    auth = (USER, PASSWORD)
    headers = token(base, auth=auth)

    def act(path: str, body: Any = None) -> Any:
        status, _, answer = http(base + path, body or {}, headers, auth)
        assert status == 200, (path, status, answer)
        return answer

    def logged(action: str) -> dict[str, Any]:
        found = [e for e in proc.events("web_action") if e["action"] == action]
        return found[0] if found else {}

    assert act("/api/queues/alpha/pause") == {"queue": "alpha", "paused": True,
                                              "changed": True}
    assert one(db, "SELECT queue FROM pgpool_paused") == ("alpha",)
    cancelled = jobs["ready"][0]
    assert act(f"/api/jobs/{cancelled}/cancel")["cancelled"][0]["id"] == cancelled
    assert one(db, "SELECT reason FROM pgpool_dead WHERE id = %s", cancelled) == ("cancelled",)
    group = next(g for g in get(base + "/api/dead/groups", auth=auth)["groups"]
                 if g["kind"] == "flaky")
    assert group["count"] == len(jobs["dead"])
    where = {"kind": "flaky", "signature": group["signature"]}
    assert act("/api/dead/replay", {**where, "dry_run": True}) == {"count": 4, "dry_run": True}
    assert one(db, "SELECT count(*) FROM pgpool_dead WHERE kind = 'flaky'")[0] == 4
    assert act("/api/dead/replay", where)["count"] == 4
    assert one(db, "SELECT count(*) FROM pgpool_jobs WHERE id = ANY(%s)", jobs["dead"])[0] == 4
    assert one(db, "SELECT count(*) FROM pgpool_dead WHERE kind = 'flaky'")[0] == 0
    assert act("/api/queues/alpha/resume")["changed"] is True
    # A replay at a rate answers at once with the count and trickles in the background.
    beta = jobs["ready"][3:]
    ops.cancel(db, beta)
    status, _, answer = http(base + "/api/dead/replay", {"ids": beta, "rate": 50}, headers,
                             auth)
    assert (status, answer["count"], answer["started"]) == (202, 2, True)
    trickled = wait_until(lambda: [e for e in proc.events("web_action")
                                   if e["action"] == "replay" and "rate" in e],
                          "the rate replay's end in the log", TIMEOUT)
    assert (trickled[0]["user"], trickled[0]["count"]) == (USER, 2)
    assert one(db, "SELECT count(*) FROM pgpool_jobs WHERE id = ANY(%s)", beta)[0] == 2
    purge = {"ids": [cancelled]}
    assert act("/api/dead/purge", {**purge, "dry_run": True}) == {
        "count": 1, "kept": 0, "notes": [], "dry_run": True}
    assert act("/api/dead/purge", purge) == {"count": 1, "kept": 0, "notes": []}
    assert one(db, "SELECT count(*) FROM pgpool_dead WHERE id = %s", cancelled)[0] == 0

    pause = wait_until(lambda: logged("pause"), "the pause in the log", TIMEOUT)
    assert (pause["user"], pause["queue"]) == (USER, "alpha")
    cancel = wait_until(lambda: logged("cancel"), "the cancel in the log", TIMEOUT)
    assert (cancel["user"], cancel["ids"]) == (USER, [cancelled])
    replay = wait_until(lambda: logged("replay"), "the replay in the log", TIMEOUT)
    assert (replay["user"], replay["count"], replay["filter_kind"]) == (USER, 4, "flaky")
    assert wait_until(lambda: logged("resume"), "the resume in the log", TIMEOUT)
    purged = wait_until(lambda: logged("purge"), "the purge in the log", TIMEOUT)
    assert (purged["user"], purged["count"], purged["filter_ids"]) == (USER, 1, [cancelled])
    assert MARKER not in proc.stderr


def test_payloads_are_hidden_unless_allowed(db: psycopg.Connection, web: Web) -> None:
    job_id = pgpool.enqueue(db, "noop", {"secret": MARKER}, queue="alpha")
    dead_id = pgpool.enqueue(db, "noop", {"secret": MARKER}, queue="alpha")
    ops.cancel(db, [dead_id])
    hidden, base = web()
    paths = (f"/api/jobs/{job_id}", "/api/jobs", f"/api/dead/{dead_id}", "/api/dead",
             "/api/snapshot")
    for path in paths:
        status, _, text = http(base + path)
        assert status == 200 and MARKER not in json.dumps(text), path
    assert "payload" not in get(f"{base}/api/jobs/{job_id}")
    _, allowed = web("--allow-payloads")
    assert get(f"{allowed}/api/jobs/{job_id}")["payload"] == {"secret": MARKER}
    assert get(f"{allowed}/api/dead/{dead_id}")["payload"] == {"secret": MARKER}
    assert get(f"{allowed}/api/session")["allow_payloads"] is True
    assert MARKER not in hidden.stderr


def test_jobs_page_through_a_long_list(db: psycopg.Connection, web: Web) -> None:
    ids = [pgpool.enqueue(db, "noop", {}, queue="alpha") for _ in range(5)]
    _, base = web()
    seen, after = [], ""
    for _ in range(len(ids)):  # bounded: a cursor that does not advance must fail, not loop
        page = get(f"{base}/api/jobs?queue=alpha&limit=2&after={after}")
        seen += [j["id"] for j in page["jobs"]]
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert seen == ids
    status, _, answer = http(f"{base}/api/jobs?state=sleeping")
    assert status == 400 and "state must be one of" in answer["error"]
    assert http(f"{base}/api/jobs/{ids[-1] + 100}")[0] == 404
    status, headers, answer = http(f"{base}/api/nothing")
    assert status == 404 and "/api/nothing" in answer["error"]
    assert headers["X-Frame-Options"] == "DENY"  # no page may frame an action
    # Only the page's own shipped script and styles run (the browser tests fail on any
    # violation of it).
    assert "script-src 'self'" in headers["Content-Security-Policy"]


def test_metrics_and_healthz(db: psycopg.Connection, web: Web) -> None:
    seed(db)
    _, base = web()
    assert get(base + "/healthz") == {"ok": True}
    status, headers, text = http(base + "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    gauges = {(s.name, s.labels.get("queue"), s.labels.get("state")): s.value
              for s in samples if s.name != "pgpool_queue_dead_jobs"}
    assert gauges[("pgpool_queue_metrics_reporter", None, None)] == 1
    for queue in ("alpha", "beta"):
        expected = queue_counts(db, queue)
        for state in ("ready", "scheduled", "running"):
            assert gauges[("pgpool_queue_jobs", queue, state)] == expected[state]
        # By reason: failed, cancelled, discarded (each served, 0 when none).
        dead = {s.labels["reason"]: s.value for s in samples
                if s.name == "pgpool_queue_dead_jobs" and s.labels["queue"] == queue}
        assert sorted(dead) == ["cancelled", "discarded", "failed"]
        assert sum(dead.values()) == expected["dead"]


def test_finished_jobs_groups_and_successes_are_served(db: psycopg.Connection, dsn: str,
                                                       web: Web) -> None:
    # A real host runs a kept job and a group of two to the end; a second group then waits.
    kept = pgpool.enqueue(db, "out.child", {"secret": MARKER})
    ran = pgpool.group(db, "out.score", [{"doc": 1}, {"doc": 2}], then=("out.combine", {}))
    done = run_pgpool(dsn, "run", "--handlers", "outcomejobs", "--burst")
    assert done.returncode == 0, done.stderr
    waiting = pgpool.group(db, "out.score", [{"doc": 3}, {"doc": 4}],
                           then=("out.combine", {}), queue="later")
    members = [i for (i,) in db.execute("SELECT id FROM pgpool_jobs WHERE group_id = %s "
                                        "ORDER BY id", (waiting.id,))]
    hidden, base = web()

    shown = get(f"{base}/api/jobs/{kept}")
    assert (shown["state"], shown["kind"], shown["attempts"]) == ("done", "out.child", 1)
    assert "result" not in shown and shown["finished_at"] is not None
    callback = get(f"{base}/api/jobs/{ran.id}")["group"]
    assert (callback["finished"], callback["total"], callback["callback"]) == (2, 2, "done")
    progress = get(f"{base}/api/jobs/{waiting.id}")
    assert progress["state"] == "waiting"
    assert {k: progress["group"][k] for k in ("total", "done", "dead", "callback")} == {
        "total": 2, "done": 0, "dead": 0, "callback": "waiting"}
    listed = get(f"{base}/api/jobs?group={waiting.id}")["jobs"]
    assert [(j["id"], j["group_id"]) for j in listed] == [(m, waiting.id) for m in members]
    assert [j["id"] for j in get(f"{base}/api/jobs?state=waiting")["jobs"]] == [waiting.id]
    for bad in ("abc", "0", "-1", "%C2%B2", "9" * 30):
        status, _, answer = http(f"{base}/api/jobs?group={bad}")
        assert status == 400 and "is not a job id" in answer["error"], (bad, answer)

    snapshot = get(base + "/api/snapshot")
    assert snapshot["groups"]["in_progress"] == 1
    assert [(g["id"], g["finished"], g["total"], g["callback"])
            for g in snapshot["groups"]["oldest"]] == [(waiting.id, 0, 2, "waiting")]
    assert {s["kind"]: s["last_hour"] for s in snapshot["succeeded"]} == {
        "out.child": 1, "out.combine": 1, "out.score": 2}
    assert MARKER not in json.dumps(snapshot)

    _, allowed = web("--allow-payloads")
    assert get(f"{allowed}/api/jobs/{kept}")["result"] == {"secret": MARKER}
    assert get(f"{allowed}/api/jobs/{ran.id}")["result"]["members"] == 2
    assert MARKER not in hidden.stderr



def test_a_replay_or_purge_of_group_members_says_what_the_cli_says(db: psycopg.Connection, dsn: str,
                                                          web: Web) -> None:
    # One member of a complete group whose callback has not run (it stays dead), one of a
    # group that waits (back into it): the dashboard's replay is the CLI's, words and all.
    pending = pgpool.group(db, "out.score", [{"doc": 1}], then=("out.combine", {}))
    waiting = pgpool.group(db, "out.score", [{"doc": 2}, {"doc": 3}],
                           then=("out.combine", {}))
    refused, back = [one(db, "SELECT min(id) FROM pgpool_jobs WHERE group_id = %s", g.id)[0]
                     for g in (pending, waiting)]
    ops.cancel(db, [refused, back])
    cli = run_pgpool(dsn, "dead", "replay", "--id", str(refused), "--dry-run")
    assert cli.stdout == "pgpool: dry run: would replay 1 dead job; nothing changed\n"
    _, base = web("--read-write")
    status, _, answer = http(base + "/api/dead/replay", {"ids": [refused, back]},
                             token(base))
    assert status == 200, answer
    assert (answer["count"], answer["refused"], answer["outside"]) == (1, 1, 0)
    assert answer["notes"] == [
        f"1 stayed dead: member of group {pending.id}, whose callback has not run yet (it "
        "reads the member's end): replay it after the callback has run"]
    assert one(db, "SELECT group_id FROM pgpool_jobs WHERE id = %s", back) == (waiting.id,)
    cli = run_pgpool(dsn, "dead", "replay", "--id", str(refused))
    assert cli.stderr == f"pgpool: {answer['notes'][0]}\n"
    # Its purge keeps the member too, and says so as the CLI does.
    status, _, answer = http(base + "/api/dead/purge", {"ids": [refused]}, token(base))
    assert (status, answer["count"], answer["kept"]) == (200, 0, 1), answer
    cli = run_pgpool(dsn, "dead", "purge", "--id", str(refused), "--older-than", "0s")
    assert cli.stderr == f"pgpool: {answer['notes'][0]}\n"
    assert one(db, "SELECT count(*) FROM pgpool_dead WHERE id = %s", refused) == (1,)


def test_a_limit_is_set_and_reset_as_the_cli_does_and_logged(db: psycopg.Connection,
                                                             web: Web) -> None:
    pgpool.enqueue_many(db, "sync", [{"secret": MARKER}] * 3)
    proc, base = web("--read-write")
    set_, reset = base + "/api/limits/set", base + "/api/limits/reset"
    wanted = {"kind": "sync", "concurrency": 2, "rate": 50, "per": "1m"}
    # As every action: the session's CSRF token, from the page's own origin.
    assert http(set_, wanted)[0] == 403
    assert http(set_, wanted, {**token(base), "Origin": "http://evil.example"})[0] == 403
    assert one(db, "SELECT count(*) FROM pgpool_limits")[0] == 0
    headers = {**token(base), "Origin": base}
    status, _, answer = http(set_, wanted, headers)
    assert (status, answer["described"]) == (200, "concurrency 2, rate 50/60s")
    assert one(db, "SELECT concurrency, rate, per FROM pgpool_limits WHERE kind = 'sync'") == (
        2, 50, 60.0)
    # The page shows it from the snapshot: in force, overridden, and the jobs waiting.
    shown = wait_until(lambda: [u for u in get(base + "/api/snapshot")["limits"]
                                if u["override"]], "the limit in a snapshot", TIMEOUT)
    assert (shown[0]["kind"], shown[0]["in_force"], shown[0]["ready"]) == (
        "sync", {"concurrency": 2, "rate": 50, "per": 60.0}, 3)
    assert http(reset, {"kind": "sync"}, headers)[2] == {"kind": "sync", "changed": True}
    assert http(reset, {"kind": "sync"}, headers)[2] == {"kind": "sync", "changed": False}
    assert one(db, "SELECT count(*) FROM pgpool_limits")[0] == 0
    def limit_actions() -> list[tuple[str, str]]:
        return [(e["action"], e["kind"]) for e in proc.events("web_action")
                if e["action"].startswith("limit")]

    # All three: the log is read while the server may still be writing the last one.
    logged = wait_until(lambda: len(actions := limit_actions()) >= 3 and actions,
                        "the three limit actions in the log", TIMEOUT)
    assert logged == [("limit_set", "sync"), ("limit_reset", "sync"), ("limit_reset", "sync")]
    assert MARKER not in proc.stderr


def test_a_bad_limit_is_refused_in_one_line_naming_what_is_wrong(db: psycopg.Connection,
                                                                 web: Web) -> None:
    _, base = web("--read-write")
    headers = token(base)
    for body, error in [
        ({"kind": "sync", "concurrency": 0}, "concurrency must be a positive integer"),
        ({"kind": "sync", "concurrency": True}, "concurrency must be a positive integer"),
        ({"kind": "sync", "rate": "many"}, "rate must be a positive integer"),
        ({"kind": "sync", "rate": 5, "per": "soon"}, "per: 'soon' is not a duration"),
        ({"kind": "sync", "rate": 5, "per": [1]}, "per must be a number of seconds"),
        ({"kind": "sync", "concurrency": 1, "per": 60}, "per needs a rate"),
        ({"kind": "sync"}, "give concurrency=N"),
        ({"kind": "no such kind!", "concurrency": 1}, "invalid kind 'no such kind!'"),
        ({"concurrency": 1}, 'say which kind: give "kind"'),
        ({"kind": "sync", "concurrency": 1, "tenant": "a"}, "unknown field 'tenant'"),
        ([1], "the request body must be a JSON object"),
    ]:
        status, _, answer = http(base + "/api/limits/set", body, headers)
        assert status == 400 and error in answer["error"], (body, status, answer)
        assert "\n" not in answer["error"]
    status, _, answer = http(base + "/api/limits/reset", {"kind": 7}, headers)
    assert status == 400 and "invalid kind 7" in answer["error"]
    assert one(db, "SELECT count(*) FROM pgpool_limits")[0] == 0
