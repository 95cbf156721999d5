"""``pgpool web`` shows nothing it should not, and its actions are bounded: a real
``pgpool web`` process, real HTTP (raw request targets on a socket, so no client normalises
them), real PostgreSQL.

- The static route serves only the page's own files, whatever the request target encodes
  (a secret file planted for the test is never sent), and never follows a symlink planted
  in ``static/``.
- Error text (which often quotes the payload) is hidden like payloads unless
  ``--allow-payloads``; dead-letter groups stay actionable through an opaque token.
- A purge or replay runs in bounded batches, each its own transaction; at most
  `server.BULK_ACTIONS` of them and `server.RATE_REPLAYS` replays at a rate run at once, and
  one more is refused (429)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import psycopg
import pytest
from dbtools import one
from waits import wait_until

import pgpool
from pgpool import ops
from pgpool.sql import ops as sql
from pgpool.web import server
from pgpool.web.snapshots import APPLICATION_NAME

#: Seconds an answer may take: generous, the machine is shared with other test runs.
TIMEOUT = 20
#: The `web` fixture: starts a ``pgpool web``; (process, base URL).
Web = Callable[..., tuple[Any, str]]
STATIC = Path(server.__file__).parent / "static"
#: In the error text of the jobs below; no digits, so the error signature keeps it whole.
ERROR_MARKER = "card holder Zebra Quokka"
#: The rest of a replay's answer when no job was skipped, and none was a group's member.
NO_GROUPS = {"skipped": 0, "refused": 0, "outside": 0, "notes": []}


def raw_get(base: str, target: str) -> tuple[int, bytes]:
    """(status, the whole response) of ``GET target`` sent byte for byte as given."""
    where = urlsplit(base)
    with socket.create_connection((where.hostname, where.port), timeout=TIMEOUT) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: {where.netloc}\r\n"
                     "Connection: close\r\n\r\n".encode("latin-1"))
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    answer = b"".join(chunks)
    return int(answer.split(b" ", 2)[1]), answer


def http(url: str, body: Any = None, headers: dict[str, str] | None = None
         ) -> tuple[int, Any]:
    """(status, parsed JSON) of a GET, or of a POST when ``body`` is given."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers or {},
                                     method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(url: str) -> Any:
    status, body = http(url)
    assert status == 200, (url, status, body)
    return body


def csrf(base: str) -> dict[str, str]:
    return {"X-CSRF-Token": get(base + "/api/session")["csrf_token"]}


def plant_secret(directory: Path) -> tuple[Path, str]:
    """A file only this test knows the content of: (its path, its content)."""
    secret = f"SECRET-{uuid.uuid4().hex}"
    path = directory / "secret.txt"
    path.write_text(secret + "\n")
    return path, secret


def traversals(secret: Path) -> list[str]:
    """Request targets that name ``secret`` (or /proc/self/environ) from /static/ in every
    encoding there is: a decoded slash, dot-dot, double encoding, backslashes, an absolute
    path, NUL, overlong UTF-8, absolute-form."""
    absolute = str(secret)
    relative = os.path.relpath(secret, STATIC)
    assert relative.startswith("..")

    def slashes(path: str, slash: str) -> str:
        return path.replace("/", slash)

    dots = relative.replace("..", "%2e%2e")
    targets = [
        slashes(absolute, "%2F"), slashes(absolute, "%2f"),
        slashes(relative, "%2F"), slashes(relative, "%2f"),
        slashes(dots, "%2F"), slashes(dots.replace("%2e", "%2E"), "%2f"),
        slashes(relative.replace("..", ".%2e"), "%2F"),
        slashes(absolute, "%252F"), slashes(relative, "%252F"),
        slashes(relative.replace("..", "%252e%252e"), "%252f"),
        slashes(relative, "\\"), slashes(relative, "%5C"), slashes(absolute, "%5c"),
        slashes(relative, "%c0%af"), slashes(relative, "%e0%80%af"),
        slashes(absolute, "%2F") + "%00", slashes(absolute, "%2F") + "%00.js",
        quote(absolute, safe=""), quote(relative, safe=""),
        relative, absolute, "." + absolute, "app.js%2F" + slashes(relative, "%2F"),
        "%2Fproc%2Fself%2Fenviron", "..%2F" * 12 + "proc%2Fself%2Fenviron",
        "%2e%2e%2F" * 12 + "proc%2Fself%2Fenviron",
    ]
    return ["/static/" + t for t in targets] + ["/static//" + t for t in targets[:4]] + [
        "/" + slashes(relative, "%2F"), "/static/../../../../../../../../" + absolute,
        "/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e" + absolute,
    ]


def test_no_request_target_reads_a_file_outside_static(db: psycopg.Connection, tmp_path: Path,
                                                       web: Web) -> None:
    secret_path, secret = plant_secret(tmp_path)
    # The server's own environment holds a secret too, as PGPOOL_DSN would.
    _, base = web(PGPOOL_WEB_TEST_SECRET=secret)
    port = urlsplit(base).port
    # Nothing outside static/ is served, however it is named.
    targets = traversals(secret_path)
    targets.append(f"http://127.0.0.1:{port}/static/" + str(secret_path).replace("/", "%2F"))
    leaked = []
    for target in targets:
        status, answer = raw_get(base, target)
        if secret.encode() in answer or status < 400:
            leaked.append((target, status, answer[:200]))
    assert not leaked, [(t, s) for t, s, _ in leaked]
    # The page's files are, each with its own type and exact content.
    for name, kind in (("app.js", "text/javascript"), ("app.css", "text/css"),
                       ("index.html", "text/html")):
        status, answer = raw_get(base, f"/static/{name}")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert status == 200, (name, answer[:300])
        assert f"content-type: {kind}".encode() in head.lower(), head
        assert body == (STATIC / name).read_bytes(), name
    assert raw_get(base, "/")[1].endswith((STATIC / "index.html").read_bytes())


def test_a_symlink_planted_in_static_is_not_followed(db: psycopg.Connection, tmp_path: Path,
                                                     web: Web) -> None:
    secret_path, secret = plant_secret(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(Path(pgpool.__file__).parent, copy / "pgpool",
                    ignore=shutil.ignore_patterns("__pycache__"))
    static = copy / "pgpool" / "web" / "static"
    (static / "extra.txt").write_text("a regular file of the copy\n")
    (static / "leak.txt").symlink_to(secret_path)
    (static / "leak.js").symlink_to(secret_path)
    (static / "dir").symlink_to(tmp_path, target_is_directory=True)
    (static / ".hidden").write_text(secret)
    _, base = web(PYTHONPATH=str(copy))
    # The copy is what serves: its own extra file is there.
    status, answer = raw_get(base, "/static/extra.txt")
    assert status == 200 and answer.endswith(b"a regular file of the copy\n"), answer[:300]
    for target in ("/static/leak.txt", "/static/leak.js", "/static/dir%2Fsecret.txt",
                   "/static/dir", "/static/.hidden", "/static/dir/secret.txt"):
        status, answer = raw_get(base, target)
        assert status == 404 and secret.encode() not in answer, (target, answer[:300])
    assert raw_get(base, "/static/app.js")[0] == 200


def failed_jobs(db: psycopg.Connection) -> tuple[int, int]:
    """A live job waiting to retry and a dead one, each failed with an error that quotes
    its payload (ERROR_MARKER), as handlers' errors do: (live id, dead id)."""
    error = ("Traceback (most recent call last):\n  File \"jobs.py\", line 9, in charge\n"
             f"ValueError: no card for {ERROR_MARKER}")
    live = pgpool.enqueue(db, "charge", {"holder": ERROR_MARKER}, queue="alpha", delay=3600)
    db.execute("UPDATE pgpool_jobs SET attempts = 1, last_error = %s WHERE id = %s",
               (error, live))
    dead = [pgpool.enqueue(db, "charge", {"holder": ERROR_MARKER}, queue="alpha")
            for _ in range(2)]
    ops.cancel(db, dead)
    db.execute("UPDATE pgpool_dead SET reason = 'failed', last_error = %s", (error,))
    return live, dead[0]


def test_error_text_is_hidden_unless_payloads_are_allowed(db: psycopg.Connection,
                                                          web: Web) -> None:
    live, dead = failed_jobs(db)
    (signature,) = one(db, f"SELECT DISTINCT {sql.SIGNATURE} FROM pgpool_dead")
    assert ERROR_MARKER in signature
    proc, base = web("--read-write")
    paths = ("/api/jobs", f"/api/jobs/{live}", "/api/dead", f"/api/dead/{dead}",
             "/api/dead/groups", "/api/snapshot", "/api/session")
    for path in paths:
        status, answer = raw_get(base, path)
        assert status == 200 and ERROR_MARKER.encode() not in answer, (path, answer)
    detail = get(f"{base}/api/jobs/{live}")
    assert "error" not in detail and "last_error" not in detail and "payload" not in detail
    assert not {"error", "last_error"} & set(get(f"{base}/api/dead/{dead}"))
    # A group is still named, by a token, and acted on through it.
    (group,) = get(base + "/api/dead/groups")["groups"]
    token = group["signature"]
    assert group["count"] == 2 and token != signature
    listed = get(f"{base}/api/dead?kind=charge&signature={quote(token)}")["dead"]
    assert len(listed) == 2
    assert http(base + "/api/dead/purge", {"kind": "charge", "signature": token,
                                           "dry_run": True}, csrf(base)) == (
        200, {"count": 2, "kept": 0, "notes": [], "dry_run": True})
    # Filters that would tell the text by what they match are refused.
    for query in (f"error={quote('Zebra')}", f"kind=charge&signature={quote(signature)}"):
        status, answer = http(f"{base}/api/dead?{query}")
        assert status == 403 and "--allow-payloads" in answer["error"], (query, answer)
    status, answer = http(base + "/api/dead/purge", {"error": "Zebra"}, csrf(base))
    assert status == 403 and "--allow-payloads" in answer["error"], answer
    status, answer = http(base + "/api/dead/purge", {"signature": "hmac256:" + "0" * 32},
                          csrf(base))
    assert status == 404 and "reload" in answer["error"], answer
    assert one(db, "SELECT count(*) FROM pgpool_dead")[0] == 2
    # With --allow-payloads, the whole text.
    _, allowed = web("--allow-payloads")
    assert ERROR_MARKER in get(f"{allowed}/api/jobs/{live}")["last_error"]
    assert ERROR_MARKER in get(f"{allowed}/api/jobs?queue=alpha")["jobs"][0]["error"]
    assert ERROR_MARKER in get(f"{allowed}/api/dead/{dead}")["last_error"]
    assert get(f"{allowed}/api/dead/groups")["groups"][0]["signature"] == signature
    assert len(get(f"{allowed}/api/dead?error={quote('Zebra')}")["dead"]) == 2
    # The group's token replays it; the log names the token, never the text.
    assert http(base + "/api/dead/replay", {"signature": token}, csrf(base)) == (
        200, {"count": 2, **NO_GROUPS})
    assert one(db, "SELECT count(*) FROM pgpool_dead")[0] == 0
    (logged,) = wait_until(lambda: proc.events("web_action"), "the replay in the log",
                           TIMEOUT)
    assert (logged["filter_kind"], logged["filter_signature"]) == ("charge", token)
    assert ERROR_MARKER not in proc.stderr


def dead_rows(db: psycopg.Connection, kind: str, count: int, first_id: int) -> list[int]:
    """``count`` dead jobs of ``kind`` with ids from ``first_id``, written directly."""
    db.execute("INSERT INTO pgpool_dead (id, queue, kind, payload, priority, attempts, "
               "last_error, created_at) SELECT i, 'bulkq', %s, '{}', 0, 1, 'gave up', now() "
               "FROM generate_series(%s::bigint, %s::bigint) AS i",
               (kind, first_id, first_id + count - 1))
    return list(range(first_id, first_id + count))


@pytest.mark.own_schema
def test_purge_and_replay_run_in_bounded_batches(db: psycopg.Connection, web: Web) -> None:
    many = 2 * ops.BATCH + ops.BATCH // 2  # three batches
    dead_rows(db, "bulk-replay", many, 1_000_000)
    dead_rows(db, "bulk-purge", many, 2_000_000)
    proc, base = web("--read-write")
    headers = csrf(base)
    assert http(base + "/api/dead/replay", {"kind": "bulk-replay"}, headers) == (
        200, {"count": many, **NO_GROUPS})
    # Each batch committed on its own: the revived rows carry three transaction ids.
    assert one(db, "SELECT count(*), count(DISTINCT xmin::text) FROM pgpool_jobs "
                   "WHERE kind = 'bulk-replay'") == (many, 3)
    # A purge likewise: a trigger records the transaction of each DELETE.
    db.execute("""
        CREATE TABLE purge_seen (xid xid8 NOT NULL);
        CREATE FUNCTION purge_seen() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN INSERT INTO purge_seen VALUES (pg_current_xact_id()); RETURN NULL; END $$;
        CREATE TRIGGER purge_seen AFTER DELETE ON pgpool_dead
            FOR EACH STATEMENT EXECUTE FUNCTION purge_seen();
    """)
    assert http(base + "/api/dead/purge", {"kind": "bulk-purge", "dry_run": True},
                headers) == (200, {"count": many, "kept": 0, "notes": [], "dry_run": True})
    assert one(db, "SELECT count(*) FROM purge_seen")[0] == 0
    assert http(base + "/api/dead/purge", {"kind": "bulk-purge"}, headers) == (
        200, {"count": many, "kept": 0, "notes": []})
    assert one(db, "SELECT count(*), count(DISTINCT xid::text) FROM purge_seen") == (3, 3)
    assert one(db, "SELECT count(*) FROM pgpool_dead")[0] == 0
    logged = wait_until(lambda: [e for e in proc.events("web_action")
                                 if e["action"] == "purge"], "the purge in the log", TIMEOUT)
    assert (logged[0]["count"], logged[0]["batches"]) == (many, 3)


def test_concurrent_purges_and_replays_are_capped(db: psycopg.Connection, dsn: str,
                                                  web: Web) -> None:
    ids = dead_rows(db, "held", 10, 3_000_000)
    others = dead_rows(db, "other", 5, 4_000_000)
    _, base = web("--read-write")
    headers = csrf(base)

    def waiting() -> int:
        return one(db, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                       "AND datname = current_database() AND wait_event_type = 'Lock'",
                   APPLICATION_NAME)[0]

    # A row the purges need is locked: each waits on it, holding its place.
    with psycopg.connect(dsn) as locker, ThreadPoolExecutor(server.BULK_ACTIONS) as run:
        locker.execute("SELECT id FROM pgpool_dead WHERE id = %s FOR UPDATE", (ids[0],))
        purges = [run.submit(http, base + "/api/dead/purge", {"kind": "held"}, headers)
                  for _ in range(server.BULK_ACTIONS)]
        wait_until(lambda: waiting() == server.BULK_ACTIONS, "the purges to wait on the lock",
                   TIMEOUT)
        for path in ("/api/dead/purge", "/api/dead/replay"):
            status, answer = http(base + path, {"kind": "other"}, headers)
            assert status == 429 and "at once" in answer["error"], (path, answer)
        # Reads still have connections meanwhile.
        assert len(get(base + "/api/dead?kind=other")["dead"]) == len(others)
        locker.rollback()
        done = [p.result(TIMEOUT) for p in purges]
    assert [status for status, _ in done] == [200] * len(done), done
    assert sum(answer["count"] for _, answer in done) == len(ids), done
    assert one(db, "SELECT count(*) FROM pgpool_dead")[0] == len(others)
    # The places are free again.
    assert http(base + "/api/dead/replay", {"kind": "other"}, headers) == (
        200, {"count": len(others), **NO_GROUPS})


def test_replays_at_a_rate_are_capped(db: psycopg.Connection, web: Web) -> None:
    quick = dead_rows(db, "quick", 1, 5_000_000)
    slow = {kind: dead_rows(db, kind, 50, first)
            for kind, first in (("slow-a", 6_000_000), ("slow-b", 7_000_000),
                                ("slow-c", 8_000_000))}
    proc, base = web("--read-write")
    headers = csrf(base)

    def replay(body: dict[str, Any]) -> tuple[int, Any]:
        return http(base + "/api/dead/replay", body, headers)

    # One that ends gives its place back.
    assert replay({"ids": quick, "rate": 1000})[0] == 202
    wait_until(lambda: [e for e in proc.events("web_action")
                        if e["action"] == "replay" and "rate" in e],
               "the quick replay's end in the log", TIMEOUT)
    # Slow ones (half a job a second) hold theirs; one more than the cap is refused.
    kinds = sorted(slow)
    for kind in kinds[:server.RATE_REPLAYS]:
        status, answer = replay({"kind": kind, "rate": 0.5})
        assert (status, answer["started"]) == (202, True), answer
    status, answer = replay({"kind": kinds[server.RATE_REPLAYS], "rate": 0.5})
    assert status == 429 and "at once" in answer["error"], answer
    assert one(db, "SELECT count(*) FROM pgpool_dead WHERE kind = %s",
               kinds[server.RATE_REPLAYS])[0] == 50


def test_a_job_id_is_ascii_digits_in_a_path_or_a_query(db: psycopg.Connection,
                                                       web: Web) -> None:
    # "²" is a digit to str.isdigit() but not to int(): refused in one line, not a 500.
    _, base = web()
    for target in ("/api/jobs/%C2%B2", "/api/jobs/%D9%A3", "/api/jobs?group=%C2%B2",
                   "/api/jobs?group=" + "9" * 400, "/api/dead/%C2%B2"):
        status, answer = raw_get(base, target)
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert status == 400 and "is not a job id" in body["error"], (target, body)
        assert len(body["error"]) < 120, body  # the input is not echoed whole
