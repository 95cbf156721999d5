"""The ``pgpool web`` HTTP server (aiohttp): the page, its JSON API, ``/metrics``,
``/healthz``.

Reads come from the shared snapshot loop (`pgpool.web.snapshots.Hub`: ``/api/snapshot``,
``/api/events``) or from the operator functions of `pgpool.ops` (jobs, dead letters). Every
action goes through those same functions: cancel, retry, pause, resume and a limit's set
and reset in one transaction; a purge or replay in bounded batches, each its own transaction, as the
commands do (a replay at a rate trickles them in the background), with at most
`BULK_ACTIONS` and `RATE_REPLAYS` of them at once. Each is logged as a ``web_action`` event
naming the user and what it affected (ids, queues, counts; never a payload).

Protection, in the order a request meets it (`_guard`): on a loopback address the Host
header must name a loopback host (a DNS-rebinding page cannot reach the API); HTTP basic
authentication when ``PGPOOL_WEB_USER``/``PGPOOL_WEB_PASSWORD`` are set (everything but
``/healthz``; compared in constant time); then for a POST: refused in read-only mode (the
default), refused when the Origin header names another host, and refused without the CSRF
token of ``/api/session`` in ``X-CSRF-Token``. The page's files are a fixed set read at
start (`read_static`): no request names a path. Payloads, results (what a handler returned,
kept with a job's success) and error text (which often quotes the payload) are sent only
with ``--allow-payloads``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import logging
import mimetypes
import os
import secrets
import signal
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import orjson
import psycopg
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from psycopg_pool import AsyncConnectionPool

from .. import ops
from ..errors import ConfigError, PgpoolError, SchemaError, first_line
from ..host.config import parse_duration
from ..host.metrics import QueueCollector
from ..logs import event
from .config import READ_ONLY, WebConfig, is_loopback
from .snapshots import APPLICATION_NAME, PERIOD, Hub

log = logging.getLogger("pgpool.web")

STATIC: Final = Path(__file__).parent / "static"
#: /healthz is unhealthy once no snapshot has succeeded for this long (several periods:
#: one slow snapshot is not an outage).
HEALTHY_WITHIN: Final = 5 * PERIOD + 5
#: Seconds /api/snapshot and /healthz wait for the first snapshot after a start.
FIRST_SNAPSHOT_WAIT: Final = 10.0
#: The most rows one listing returns.
MAX_LIMIT: Final = 1000
#: Connections for requests (listings, actions); snapshots and LISTEN have their own.
POOL_SIZE: Final = 4
#: Purges and replays (not at a rate) at once: each holds one of the pool's connections
#: for all its batches, and listings keep the others.
BULK_ACTIONS: Final = 2
#: Replays at a rate at once: each holds a connection of its own for as long as it trickles.
RATE_REPLAYS: Final = 2

HUB = web.AppKey("hub", Hub)
CONFIG = web.AppKey("config", WebConfig)
POOL = web.AppKey("pool", AsyncConnectionPool)
SECRET = web.AppKey("secret", bytes)
METRICS = web.AppKey("metrics", CollectorRegistry)
QUEUES = web.AppKey("queues", QueueCollector)
BACKGROUND = web.AppKey("background", set)
FILES = web.AppKey("files", dict)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _Refused(Exception):
    """An HTTP error answered as JSON ``{"error": message}``."""

    def __init__(self, status: int, message: str, **headers: str) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status,
                        content_type="application/json")


# --- protection ---------------------------------------------------------------------------

@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    config = request.app[CONFIG]
    if request.path == "/healthz":  # probes: no Host name, no credentials
        return await handler(request)
    try:
        if config.loopback and not is_loopback(_host_name(request.host)):
            port = request.transport.get_extra_info("sockname")[1] if request.transport else ""
            raise _Refused(421, f"this server answers only for localhost, not "
                                f"{request.host!r}: open http://127.0.0.1:{port}/")
        request["user"] = _authenticate(request, config)
        if request.method == "POST":
            _check_action(request, config)
        response = await handler(request)
    except _Refused as refused:
        if refused.status in (403, 421):
            event(log, logging.WARNING, "web_refused", "refused %s %s: %s", request.method,
                  request.path, refused, user=request.get("user"), path=request.path,
                  status=refused.status)
        response = _json({"error": str(refused)}, refused.status)
        response.headers.update(refused.headers)
    except ops.JobNotFound as exc:
        response = _json({"error": str(exc)}, 404)
    except SchemaError as exc:
        response = _json({"error": str(exc)}, 503)
    except PgpoolError as exc:
        response = _json({"error": " ".join(str(exc).split())}, 400)
    except psycopg.errors.InsufficientPrivilege as exc:
        response = _json({"error": f"the database refused: {first_line(exc)}: grant this "
                                   "role the privileges pgpool needs (`pgpool grants`)"}, 403)
    except psycopg.Error as exc:
        response = _json({"error": f"the database failed: {first_line(exc)}: check that it "
                                   "is up and reachable, then try again"}, 503)
    except web.HTTPException as exc:  # the router's: no such path, or not that method
        response = _json({"error": f"{exc.reason}: {request.method} {request.path} (the "
                                   "API is under /api/: see the dashboard guide in the docs)"},
                         exc.status)
    except Exception as exc:  # a bug: logged with its traceback, answered in one line
        log.exception("internal error answering %s %s", request.method, request.path)
        response = _json({"error": f"internal error: {type(exc).__name__} (the server's "
                                   "log has the traceback; please report it)"}, 500)
    return response


#: Everything from this origin only; no inline script or style (the page sets styles through
#: the CSSOM, which the policy allows); the empty favicon is a data: URL.
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


async def _secure_headers(request: web.Request, response: web.StreamResponse) -> None:
    # The page must not be framed (clickjacking an action) nor sniffed into another type,
    # and runs only its own shipped script and styles: injected markup cannot run code.
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")


def _host_name(host: str) -> str:
    """The name in a Host header, without its port."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _authenticate(request: web.Request, config: WebConfig) -> str:
    """The user this request acts as: the authenticated one, or "anonymous" without auth."""
    if not config.auth:
        return "anonymous"
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    try:
        user, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        user, sep, password = "", "", ""
    # Both compared whatever the first gives: the time taken says nothing of either.
    good = hmac.compare_digest(user.encode(), config.user.encode())
    good &= hmac.compare_digest(password.encode(), (config.password or "").encode())
    if scheme.lower() != "basic" or not sep or not good:
        raise _Refused(401, "log in: this dashboard needs the user and password set in "
                            "PGPOOL_WEB_USER and PGPOOL_WEB_PASSWORD",
                       **{"WWW-Authenticate": 'Basic realm="pgpool", charset="UTF-8"'})
    return user


def _csrf_token(secret: bytes, user: str) -> str:
    return hmac.new(secret, user.encode(), hashlib.sha256).hexdigest()


def _check_action(request: web.Request, config: WebConfig) -> None:
    if not config.read_write:
        raise _Refused(403, READ_ONLY)
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc != request.host:
        raise _Refused(403, f"cross-origin request from {origin} refused: act from the "
                            "dashboard's own page")
    token = request.headers.get("X-CSRF-Token", "")
    expected = _csrf_token(request.app[SECRET], request["user"])
    if not hmac.compare_digest(token.encode(), expected.encode()):
        raise _Refused(403, "missing or wrong X-CSRF-Token header: send the csrf_token of "
                            "GET /api/session (reload the page)")


# --- pages, health, metrics ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _File:
    body: bytes
    content_type: str


#: The page's types, whatever the machine's mime.types says.
_TYPES: Final = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


def read_static(directory: Path = STATIC) -> dict[str, _File]:
    """The files the server serves, by name: every regular file directly in ``directory``
    (not a symlink, a directory or a dot file), read once, at start. A request names one of
    these and is never made into a path: a name from the URL is decoded, so it may hold
    "/" or "..", and a symlink may point anywhere."""
    files = {}
    for entry in os.scandir(directory):
        if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
            continue
        # O_NOFOLLOW: not even a symlink swapped in since the scan is followed.
        with open(os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
            body = f.read()
        suffix = Path(entry.name).suffix
        kind = (_TYPES.get(suffix) or mimetypes.guess_type(entry.name)[0]
                or "application/octet-stream")
        files[entry.name] = _File(body, kind)
    return files


async def index(request: web.Request) -> web.StreamResponse:
    return _static_file(request, "index.html")


async def static(request: web.Request) -> web.StreamResponse:
    return _static_file(request, request.match_info["name"])


def _static_file(request: web.Request, name: str) -> web.StreamResponse:
    found = request.app[FILES].get(name)
    if found is None:
        raise _Refused(404, f"no such file: {name}")
    return web.Response(body=found.body, content_type=found.content_type,
                        charset="utf-8" if found.content_type.startswith("text/") else None,
                        headers={"Cache-Control": "no-cache"})


async def healthz(request: web.Request) -> web.Response:
    hub = request.app[HUB]
    await hub.first(FIRST_SNAPSHOT_WAIT)  # just started: answer once the database has
    if hub.healthy(HEALTHY_WITHIN):
        return _json({"ok": True})
    return _json({"ok": False, "error": hub.error or "no snapshot of the queue yet"}, 503)


async def metrics(request: web.Request) -> web.Response:
    # The collector reads the database on a blocking connection: off the event loop.
    body = await asyncio.to_thread(generate_latest, request.app[METRICS])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


# --- reads --------------------------------------------------------------------------------

async def session(request: web.Request) -> web.Response:
    config = request.app[CONFIG]
    return _json({"read_write": config.read_write, "allow_payloads": config.allow_payloads,
                  "user": config.user, "csrf_token": _csrf_token(request.app[SECRET],
                                                                 request["user"])})


async def snapshot(request: web.Request) -> web.Response:
    latest = await request.app[HUB].first(FIRST_SNAPSHOT_WAIT)
    if latest is None:
        raise _Refused(503, request.app[HUB].error or "no snapshot of the queue yet: try "
                                                      "again in a moment")
    return web.Response(body=latest, content_type="application/json")


async def events(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no"})  # a proxy must pass each event on at once
    await response.prepare(request)
    with contextlib.suppress(ConnectionError):
        async for name, data in request.app[HUB].updates():
            await response.write(b"event: " + name.encode() + b"\ndata: " + data + b"\n\n")
    return response


async def jobs(request: web.Request) -> web.Response:
    q = request.query
    where = ops.JobFilter(queue=_text(q, "queue"), kind=_text(q, "kind"),
                          state=_text(q, "state"),  # type: ignore[arg-type]
                          older_than=_seconds(q.get("older_than")),
                          after=_cursor(q.get("after")), group=_job_id(q.get("group")))
    payload = request.app[CONFIG].allow_payloads
    async with request.app[POOL].connection() as conn:
        listing = await ops.list_jobs_async(conn, where, limit=_limit(q), payload=payload)
    last = listing.rows[-1] if listing.more else None
    return _json({"jobs": [_row(request, j) for j in listing.rows],
                  "next_after": None if last is None else _cursor_text(last.run_at, last.id)})


async def job(request: web.Request) -> web.Response:
    """A job live or kept as done (`ops.show_job`); a group's callback with its group's
    progress."""
    allowed = request.app[CONFIG].allow_payloads
    async with request.app[POOL].connection() as conn:
        found = await ops.show_job_async(conn, _id(request), payload=allowed, result=allowed)
    return _json(_row(request, found))


async def dead(request: web.Request) -> web.Response:
    payload = request.app[CONFIG].allow_payloads
    async with request.app[POOL].connection() as conn:
        where = await _usable(request, conn, _dead_filter(request.query))
        listing = await ops.list_dead_async(conn, where, limit=_limit(request.query),
                                            payload=payload)
    return _json({"dead": [_row(request, d) for d in listing.rows], "more": listing.more})


async def dead_groups(request: web.Request) -> web.Response:
    async with request.app[POOL].connection() as conn:
        where = await _usable(request, conn, _dead_filter(request.query))
        listing = await ops.group_dead_async(conn, where, limit=_limit(request.query))
    groups = []
    for g in listing.rows:
        d = g.as_dict()
        if not request.app[CONFIG].allow_payloads:
            d["signature"] = _signature_token(request.app[SECRET], g.kind, g.signature)
        groups.append(d)
    return _json({"groups": groups, "more": listing.more})


async def dead_job(request: web.Request) -> web.Response:
    payload = request.app[CONFIG].allow_payloads
    async with request.app[POOL].connection() as conn:
        found = await ops.show_dead_async(conn, _id(request), payload=payload)
    return _json(_row(request, found))


def _row(request: web.Request, row: ops.LiveJob | ops.DeadJob | ops.DoneJob) -> dict[str, Any]:
    d = row.as_dict()
    if isinstance(row, ops.DoneJob):
        if not request.app[CONFIG].allow_payloads:
            del d["result"]  # user data, as a payload is
        return d
    if not request.app[CONFIG].allow_payloads:
        # User data: not even its absence is shown as a value. An error's text often
        # quotes the payload (a handler's exception names what it failed on), so it is
        # hidden alike, and a signature (made of that text) becomes its group's token.
        del d["payload"], d["error"], d["last_error"]
        if isinstance(row, ops.LiveJob):
            # A checkpoint is the handler's data; a progress note its own words, which
            # may quote it as an error does.
            del d["checkpoint"]
            if d["progress"] is not None:
                del d["progress"]["note"]
        if isinstance(row, ops.DeadJob):
            d["signature"] = _signature_token(request.app[SECRET], row.kind, row.signature)
    return d


#: How a group's token starts. An error signature has no digit (`pgpool.sql.ops.SIGNATURE`
#: makes each run of digits "#"), so a value with this prefix is never one.
TOKEN_PREFIX: Final = "hmac256:"
#: What a hidden error's filters answer.
ERRORS_HIDDEN: Final = ("error text is hidden (it may quote payloads): start `pgpool web "
                        "--allow-payloads` to filter by it")


def _signature_token(secret: bytes, kind: str, signature: str) -> str:
    """What names a dead-letter group (kind, error signature) while error text is hidden:
    an HMAC under the server's key, so it tells nothing of the text, and no one can make
    the token of a guessed text to see whether it matches."""
    digest = hmac.new(secret, f"{kind}\0{signature}".encode(), hashlib.sha256).hexdigest()
    return TOKEN_PREFIX + digest[:32]


async def _usable(request: web.Request, conn: psycopg.AsyncConnection,
                  where: ops.DeadFilter) -> ops.DeadFilter:
    """``where`` as the database can take it. While error text is hidden, a filter on it is
    refused (what it matches would tell the text, a guess at a time) and a signature must
    be a group's token, which is replaced by the group's kind and signature."""
    if request.app[CONFIG].allow_payloads or (where.error is None
                                              and where.signature is None):
        return where
    if where.error is not None or not where.signature.startswith(TOKEN_PREFIX):
        raise _Refused(403, f"{ERRORS_HIDDEN}, or pass a group's signature token as "
                            "/api/dead/groups gives it")
    groups = await ops.group_dead_async(conn, ops.DeadFilter(kind=where.kind),
                                        limit=MAX_LIMIT)
    secret = request.app[SECRET]
    for g in groups.rows:
        if hmac.compare_digest(_signature_token(secret, g.kind, g.signature),
                               where.signature):
            return replace(where, kind=g.kind, signature=g.signature)
    raise _Refused(404, "no dead-letter group has this signature token (replayed or "
                        "purged since, or the server restarted): reload the page")


# --- actions ------------------------------------------------------------------------------

async def cancel(request: web.Request) -> web.Response:
    job_id = _id(request)
    async with request.app[POOL].connection() as conn, conn.transaction():
        done = await ops.cancel_async(conn, [job_id])
    _logged(request, "cancel", ids=[c.id for c in done], was=[c.was for c in done])
    return _json({"cancelled": [{"id": c.id, "was": c.was, "owner": c.owner} for c in done]})


async def retry(request: web.Request) -> web.Response:
    job_id = _id(request)
    async with request.app[POOL].connection() as conn, conn.transaction():
        done = await ops.retry_async(conn, [job_id])
    _logged(request, "retry", ids=done.now)
    return _json({"now": done.now, "already_due": done.already_due})


async def pause(request: web.Request) -> web.Response:
    return await _set_paused(request, True)


async def resume(request: web.Request) -> web.Response:
    return await _set_paused(request, False)


async def _set_paused(request: web.Request, paused: bool) -> web.Response:
    queue = request.match_info["queue"]
    async with request.app[POOL].connection() as conn, conn.transaction():
        if paused:
            changed = await ops.pause_async(conn, queue)
        else:
            changed = await ops.resume_async(conn, queue)
    _logged(request, "pause" if paused else "resume", queue=queue, changed=changed)
    return _json({"queue": queue, "paused": paused, "changed": changed})


async def set_limit(request: web.Request) -> web.Response:
    """Override a kind's limit on every host, as ``pgpool limits set`` does (`ops.set_limit`:
    it checks the values, and each host logs the change with the database role)."""
    body = _fields(await _body(request), "kind", "concurrency", "rate", "per")
    kind, concurrency, rate = _kind(body), body.get("concurrency"), body.get("rate")
    try:
        per = _seconds(body.get("per"))
    except ConfigError as exc:
        raise ConfigError(f"per: {exc}") from None
    async with request.app[POOL].connection() as conn, conn.transaction():
        override = await ops.set_limit_async(conn, kind, concurrency=concurrency, rate=rate,
                                             per=per)
    _logged(request, "limit_set", kind=kind, concurrency=concurrency, rate=rate, per=per)
    return _json({"kind": kind, "override": {
        "concurrency": override.concurrency, "rate": override.rate, "per": override.per,
        "set_by": override.set_by}, "described": override.describe()})


async def reset_limit(request: web.Request) -> web.Response:
    """Drop a kind's override, as ``pgpool limits reset`` does (`ops.reset_limit`)."""
    kind = _kind(_fields(await _body(request), "kind"))
    async with request.app[POOL].connection() as conn, conn.transaction():
        changed = await ops.reset_limit_async(conn, kind)
    _logged(request, "limit_reset", kind=kind, changed=changed)
    return _json({"kind": kind, "changed": changed})


async def replay(request: web.Request) -> web.Response:
    body = await _body(request)
    where, limit, dry_run = _batch_op(body)
    rate = body.get("rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)):
        raise ConfigError(f"rate must be a number of jobs per second, got {rate!r}")
    pool = request.app[POOL]
    if dry_run or rate is not None:
        async with pool.connection() as conn:
            where = await _usable(request, conn, where)
            count = (await ops.replay_dead_async(conn, where, limit=limit, rate=rate,
                                                 dry_run=True)).would_move
        if dry_run:
            return _json({"count": count, "dry_run": True})
        # A trickle outlives the request: it goes on in the background, in small
        # transactions on a connection of its own, and logs when it is done. Taken and
        # started with no await between: two requests cannot both take the last place.
        places = request.app[RATE_REPLAYING]
        places.take()
        task = asyncio.create_task(_trickle(request, where, limit, rate, count))
        request.app[BACKGROUND].add(task)
        task.add_done_callback(request.app[BACKGROUND].discard)
        task.add_done_callback(lambda _: places.give_back())
        return _json({"count": count, "rate": rate, "started": True}, 202)
    with request.app[BULK].held():
        async with pool.connection() as conn:
            where = await _usable(request, conn, where)
            done = await ops.replay_dead_async(conn, where, limit=limit)
    _logged(request, "replay", count=done.moved, skipped=done.skipped, refused=done.refused,
            outside=done.outside, batches=done.batches, **_described(request, where))
    return _json({"count": done.moved, "skipped": done.skipped, "refused": done.refused,
                  "outside": done.outside, "notes": done.notes()})


async def _trickle(request: web.Request, where: ops.DeadFilter, limit: int | None,
                   rate: float, count: int) -> None:
    _logged(request, "replay_started", count=count, rate=rate,
            **_described(request, where))
    try:
        async with await psycopg.AsyncConnection.connect(
                request.app[CONFIG].dsn, autocommit=True,
                application_name=APPLICATION_NAME) as conn:
            done = await ops.replay_dead_async(conn, where, limit=limit, rate=rate)
    except (psycopg.Error, PgpoolError) as exc:
        event(log, logging.ERROR, "web_action_failed", "replay by %s failed: %s",
              request["user"], first_line(exc), user=request["user"], action="replay")
        return
    _logged(request, "replay", count=done.moved, skipped=done.skipped, refused=done.refused,
            outside=done.outside, rate=rate, batches=done.batches,
            **_described(request, where))


async def purge(request: web.Request) -> web.Response:
    where, limit, dry_run = _batch_op(await _body(request))
    with contextlib.nullcontext() if dry_run else request.app[BULK].held():
        async with request.app[POOL].connection() as conn:
            where = await _usable(request, conn, where)
            done = await ops.purge_dead_async(conn, where, limit=limit, dry_run=dry_run)
    if dry_run:
        return _json({"count": done.would_delete, "kept": done.kept, "notes": done.notes(),
                      "dry_run": True})
    _logged(request, "purge", count=done.deleted, kept=done.kept, batches=done.batches,
            **_described(request, where))
    return _json({"count": done.deleted, "kept": done.kept, "notes": done.notes()})


class _Places:
    """Long actions of one sort running at once, at most ``size``: each holds a database
    connection while it runs, and the server's are few. One more is refused (429)."""

    def __init__(self, size: int, what: str) -> None:
        self.size = size
        self.what = what
        self.used = 0

    def take(self) -> None:
        if self.used >= self.size:
            raise _Refused(429, f"{self.used} {self.what} are running, the most at once: "
                                "wait for one to end (its web_action event), then try again")
        self.used += 1

    def give_back(self) -> None:
        self.used -= 1

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.take()
        try:
            yield
        finally:
            self.give_back()


BULK = web.AppKey("bulk", _Places)
RATE_REPLAYING = web.AppKey("rate_replaying", _Places)


def _batch_op(body: dict[str, Any]) -> tuple[ops.DeadFilter, int | None, bool]:
    """The filter, limit and dry_run of a replay or purge. Like the CLI's ``--all``, taking
    every dead job must be asked for: an empty filter is more likely a mistake."""
    ids = body.get("ids")
    where = ops.DeadFilter(
        ids=ids, queue=body.get("queue"), kind=body.get("kind"), error=body.get("error"),
        signature=body.get("signature"), reason=body.get("reason"),
        since=_seconds(body.get("since")), older_than=_seconds(body.get("older_than")))
    limit = body.get("limit")
    if where.empty and limit is None and body.get("all") is not True:
        raise ConfigError("say which dead jobs: give filters (kind, signature, error, "
                          "since...), a limit, or \"all\": true for every one")
    return where, limit, body.get("dry_run") is True


def _described(request: web.Request, where: ops.DeadFilter) -> dict[str, Any]:
    """The filter's fields that are set, for the log; while error text is hidden, its
    signature as the group's token, as the page knows it."""
    described = {f"filter_{k}": v for k, v in vars(where).items() if v is not None}
    if where.signature is not None and not request.app[CONFIG].allow_payloads:
        described["filter_signature"] = _signature_token(request.app[SECRET],
                                                          where.kind or "", where.signature)
    return described


def _logged(request: web.Request, action: str, **affected: Any) -> None:
    user = request["user"]
    event(log, logging.INFO, "web_action", "%s by %s: %s", action, user,
          " ".join(f"{k}={v}" for k, v in affected.items()), user=user, action=action,
          **affected)


# --- parameters ---------------------------------------------------------------------------

def _text(query: Any, name: str) -> str | None:
    return query.get(name) or None


def _seconds(value: Any) -> float | None:
    """Seconds from a number or a duration (``90s``, ``15m``...); None if not given."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return parse_duration(value)
    return value  # the ops functions check its type and range


def _limit(query: Any) -> int:
    text = query.get("limit")
    if not text:
        return ops.DEFAULT_LIMIT
    if not text.isdigit() or not 0 < int(text) <= MAX_LIMIT:
        raise ConfigError(f"limit must be an integer from 1 to {MAX_LIMIT}, got {text!r}")
    return int(text)


def _id(request: web.Request) -> int:
    job_id = _job_id(request.match_info["id"])
    assert job_id is not None  # the route matches a non-empty id only
    return job_id


def _job_id(text: str | None) -> int | None:
    """A job id (or a group's, its callback's) from a path or a query; None if not given."""
    return ops.parse_job_id(text) if text else None


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def _cursor_text(run_at: datetime, job_id: int) -> str:
    """The next page's cursor: the last row's due time (microseconds, exact) and id."""
    return f"{(run_at - _EPOCH) // timedelta(microseconds=1)}.{job_id}"


def _cursor(text: str | None) -> tuple[datetime, int] | None:
    if not text:
        return None
    micros, _, job_id = text.partition(".")
    if not (micros.lstrip("-").isdigit() and job_id.isdigit()):
        raise ConfigError(f"after={text!r} is not a cursor: pass the next_after of the "
                          "page before")
    return _EPOCH + timedelta(microseconds=int(micros)), int(job_id)


def _dead_filter(query: Any) -> ops.DeadFilter:
    where = ops.DeadFilter(queue=_text(query, "queue"), kind=_text(query, "kind"),
                           error=_text(query, "error"), signature=_text(query, "signature"),
                           reason=_text(query, "reason"),  # type: ignore[arg-type]
                           since=_seconds(query.get("since")),
                           older_than=_seconds(query.get("older_than")))
    return where


async def _body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except ValueError:
        raise ConfigError("the request body is not JSON: send a JSON object") from None
    if not isinstance(body, dict):
        raise ConfigError("the request body must be a JSON object")
    return body


def _kind(body: dict[str, Any]) -> Any:
    """The kind a limit action names (`ops` checks the name)."""
    if "kind" not in body:
        raise ConfigError("say which kind: give \"kind\"")
    return body["kind"]


def _fields(body: dict[str, Any], *allowed: str) -> dict[str, Any]:
    """``body``, refused when it has a field the action does not take (a typo would
    otherwise be dropped without a word)."""
    unknown = sorted(body.keys() - set(allowed))
    if unknown:
        raise ConfigError(f"unknown field {unknown[0]!r}: this action takes "
                          f"{', '.join(allowed)}")
    return body


# --- the application ----------------------------------------------------------------------

def make_app(config: WebConfig) -> web.Application:
    app = web.Application(middlewares=[_guard])
    app[CONFIG] = config
    app[HUB] = Hub(config.dsn, horizon_warn=config.horizon_warn,
                   allow_payloads=config.allow_payloads)
    # Autocommit: a purge or replay commits each batch (see `pgpool.ops`); everything else
    # opens its own transaction.
    app[POOL] = AsyncConnectionPool(config.dsn, min_size=1, max_size=POOL_SIZE, open=False,
                                    kwargs={"application_name": APPLICATION_NAME,
                                            "autocommit": True})
    app[SECRET] = secrets.token_bytes(32)
    app[QUEUES] = QueueCollector(config.dsn)
    app[METRICS] = CollectorRegistry()
    app[METRICS].register(app[QUEUES])
    app[BACKGROUND] = set()
    app[FILES] = read_static()
    app[BULK] = _Places(BULK_ACTIONS, "purges or replays")
    app[RATE_REPLAYING] = _Places(RATE_REPLAYS, "replays at a rate")
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/session", session)
    app.router.add_get("/api/snapshot", snapshot)
    app.router.add_get("/api/events", events)
    app.router.add_get("/api/jobs", jobs)
    app.router.add_get("/api/jobs/{id}", job)
    app.router.add_get("/api/dead", dead)
    app.router.add_get("/api/dead/groups", dead_groups)
    app.router.add_get("/api/dead/{id}", dead_job)
    app.router.add_post("/api/jobs/{id}/cancel", cancel)
    app.router.add_post("/api/jobs/{id}/retry", retry)
    app.router.add_post("/api/queues/{queue}/pause", pause)
    app.router.add_post("/api/queues/{queue}/resume", resume)
    app.router.add_post("/api/dead/replay", replay)
    app.router.add_post("/api/dead/purge", purge)
    app.router.add_post("/api/limits/set", set_limit)
    app.router.add_post("/api/limits/reset", reset_limit)
    app.cleanup_ctx.append(_running)
    app.on_shutdown.append(_end_streams)
    app.on_response_prepare.append(_secure_headers)
    return app


async def _running(app: web.Application) -> Any:
    """Open the pool and start the snapshot loop; stop both at the end."""
    await app[POOL].open(wait=True)  # a database that refuses shows at start, not later
    hub = asyncio.create_task(app[HUB].run())
    yield
    for task in [hub, *app[BACKGROUND]]:
        task.cancel()
    await asyncio.gather(hub, *app[BACKGROUND], return_exceptions=True)
    await app[POOL].close()
    await asyncio.to_thread(app[QUEUES].close)


async def _end_streams(app: web.Application) -> None:
    await app[HUB].close()


def serve(config: WebConfig) -> int:
    """Serve until SIGTERM or SIGINT; 0 then."""
    return asyncio.run(_serve(config))


async def _serve(config: WebConfig) -> int:
    runner = web.AppRunner(make_app(config), access_log=None, shutdown_timeout=5)
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"cannot serve on {config.host}:{config.port} "
                              f"({exc.strerror or exc}): choose a free --port") from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        port = runner.addresses[0][1]
        mode = "read-write" if config.read_write else "read-only"
        event(log, logging.INFO, "web_started",
              "serving the dashboard on http://%s:%d/ (%s%s)", config.host, port, mode,
              ", login required" if config.auth else "", address=config.host, port=port,
              read_write=config.read_write, allow_payloads=config.allow_payloads,
              auth=config.auth)
        await stop.wait()
        event(log, logging.INFO, "web_stopped", "stopping the dashboard")
    finally:
        await runner.cleanup()
    return 0
