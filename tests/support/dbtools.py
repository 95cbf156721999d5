"""Reading and writing the test's database directly: rows, roles and settings in a DSN,
plans, old schemas, the listening sessions."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson
import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgpool.sql import common as sql
from pgpool.sql import jobs as jobs_sql
from pgpool.sql.common import listen_statement

#: What a host's kind-wide limited claims send besides their limits: no grant asked for
#: (`sql.CLAIM_LIMITED_PLAIN`), and a grant that has not expired (`sql.CLAIM_GRANTED`).
GRANT_PARAMS: dict[str, Any] = {"grant": 0, "hold": 0.05,
                                "until": datetime(9999, 1, 1, tzinfo=UTC)}


def one(db: psycopg.Connection, query: str, *params: object) -> Any:
    """The first row of ``query``, or None."""
    return db.execute(query, params).fetchone()


def as_role(dsn: str, role: str) -> str:
    """``dsn`` logging in as ``role`` instead."""
    limited = make_conninfo(dsn, user=role)
    assert conninfo_to_dict(limited)["user"] == role
    return limited


def with_options(dsn: str, *settings: str) -> str:
    """``dsn`` with server settings (``"lock_timeout=0"``) added to its ``options``."""
    options = conninfo_to_dict(dsn).get("options") or ""
    return make_conninfo(dsn, options=" ".join([options, *(f"-c {s}" for s in settings)]))


def _prepared(query: str, params: dict[str, Any]) -> tuple[str, pgsql.Composed]:
    """``query`` with its ``%(name)s`` placeholders numbered (``$1``...), for PREPARE, and
    ``params`` as EXECUTE's literal arguments, each cast as the query casts it: EXECUTE
    cannot infer the types of bound parameters."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", query)))
    casts = dict(re.findall(r"%\((\w+)\)s(::[\w\[\]]+)", query))
    # Run without parameters, a %% stays as written: it is the modulo operator's %.
    numbered = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m[1]) + 1}",
                      query).replace("%%", "%")
    args = pgsql.SQL(", ").join(pgsql.SQL("{}{}").format(pgsql.Literal(params[n]),
                                                          pgsql.SQL(casts.get(n, "")))
                                for n in names)
    return numbered, args


def explain_prepared(db: psycopg.Connection, query: str, params: dict[str, Any],
                     mode: str, options: str = "ANALYZE, FORMAT JSON") -> dict[str, Any]:
    """EXPLAIN (``options``, which must include FORMAT JSON) of ``query`` run as a prepared
    statement under ``plan_cache_mode`` ``mode``: the generic plan is the one a long-running
    dispatcher ends up using. Returns the top plan node."""
    numbered, args = _prepared(query, params)
    db.execute(f"SET plan_cache_mode = {mode}")
    db.execute(f"PREPARE pgpool_q AS {numbered}")
    try:
        (plan,) = db.execute(pgsql.SQL("EXPLAIN ({}) EXECUTE pgpool_q({})")
                             .format(pgsql.SQL(options), args)).fetchone()[0]
    finally:
        db.execute("DEALLOCATE pgpool_q")
        db.execute("RESET plan_cache_mode")
    return plan["Plan"]


def explain_kept_plan(db: psycopg.Connection, query: str, params: dict[str, Any],
                      between: Callable[[], None]) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, FORMAT JSON) of ``query`` run as a prepared statement whose generic
    plan was made before ``between`` ran (it adds jobs, say), under the claim pool's
    settings (`pgpool.host.claimer.configure_connection`): what a host that prepared its
    claim on the table as it was then runs now. Both runs rolled back; autovacuum kept off
    the jobs table meanwhile, so that nothing replans it. Returns the top plan node."""
    numbered, args = _prepared(query, params)
    db.execute("ALTER TABLE pgpool_jobs SET (autovacuum_enabled = false)")
    db.execute(f"{jobs_sql.GENERIC_PLANS}; {jobs_sql.INDEX_SCANS}")
    db.execute(f"PREPARE pgpool_q AS {numbered}")
    try:
        with db.transaction(force_rollback=True):  # the plan is made and kept
            db.execute(pgsql.SQL("EXECUTE pgpool_q({})").format(args))
        between()
        with db.transaction(force_rollback=True):
            (plan,) = db.execute(pgsql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE "
                                           "pgpool_q({})").format(args)).fetchone()[0]
    finally:
        db.execute("DEALLOCATE pgpool_q")
        db.execute("RESET plan_cache_mode; RESET enable_seqscan; RESET enable_bitmapscan")
        db.execute("ALTER TABLE pgpool_jobs RESET (autovacuum_enabled)")
    return plan["Plan"]


def busiest(node: dict[str, Any]) -> tuple[float, str]:
    """The most rows any node of a plan handed on over all its loops, and which node."""
    here = (node["Actual Rows"] * node["Actual Loops"],
            f"{node['Node Type']} {node.get('Relation Name', node.get('CTE Name', ''))}")
    return max([here, *(busiest(child) for child in node.get("Plans", ()))])


def queue_counts(db: psycopg.Connection, queue: str) -> dict[str, int]:
    """A queue's ready, scheduled and running jobs and its dead letters, straight from the
    tables: what status, the dashboard and the metrics must agree with."""
    ready, scheduled, running = one(
        db, "SELECT count(*) FILTER (WHERE state = 'ready'),"
            " count(*) FILTER (WHERE state = 'scheduled'),"
            " count(*) FILTER (WHERE state = 'running') FROM pgpool_jobs WHERE queue = %s",
        queue)
    (dead,) = one(db, "SELECT count(*) FROM pgpool_dead WHERE queue = %s", queue)
    return {"ready": ready, "scheduled": scheduled, "running": running, "dead": dead}


def listen_sql(db: psycopg.Connection) -> str:
    """The ``LISTEN`` statement of the installation ``db``'s search_path leads to, as a
    dispatcher's listener sends it (and ``pg_stat_activity`` shows it)."""
    return listen_statement(one(db, sql.CHANNEL)[0])


def listeners(db: psycopg.Connection) -> list[int]:
    """The pids of the sessions LISTENing on the channel of ``db``'s installation."""
    return [pid for (pid,) in db.execute(
        "SELECT pid FROM pg_stat_activity WHERE query = %s AND datname = current_database() "
        "ORDER BY pid", (listen_sql(db),))]


def insert_old_job(conn: psycopg.Connection, kind: str = "record") -> int:
    """A due job, inserted with the columns every schema version has (`pgpool.enqueue`
    needs the current one); its id."""
    return conn.execute("INSERT INTO pgpool_jobs (kind, payload) VALUES (%s, '{}') "
                        "RETURNING id", (kind,)).fetchone()[0]


def make_version_1_schema(conn: psycopg.Connection) -> None:
    """Lay down pgpool's schema as version 1 left it, as an old deployment would have it."""
    from pgpool.db import schema

    conn.execute(schema.BOOKKEEPING)
    conn.execute(schema.MIGRATIONS[0].ddl)
    conn.execute("INSERT INTO pgpool_schema_version (version, description) VALUES (1, %s)",
                 (schema.MIGRATIONS[0].description,))


def buffers(node: dict[str, Any]) -> int:
    """Shared buffers (hit or read) an EXPLAIN (ANALYZE, BUFFERS) plan node touched, its
    children included."""
    return node["Shared Hit Blocks"] + node["Shared Read Blocks"]


def acked_but_the_last(db: psycopg.Connection, keep: int, claim_sets: str = "") -> dict[str, Any]:
    """Every job of pgpool_jobs but the last ``keep`` (by id) claimed and acked (deleted)
    as hosts would, the claims also setting ``claim_sets`` (SQL, ``, col = ...``); the
    cursor a claimer has after them: the ``after_*`` parameters of one (queue, kind)."""
    last = db.execute("SELECT max(id) FROM pgpool_jobs").fetchone()[0] - keep
    db.execute(f"UPDATE pgpool_jobs SET state = 'running'{claim_sets} WHERE id <= %s",
               (last,))
    db.execute("DELETE FROM pgpool_jobs WHERE state = 'running'")
    priority, run_at = db.execute("SELECT priority, (extract(epoch FROM run_at) * 1000000)"
                                  "::int8 FROM pgpool_jobs LIMIT 1").fetchone()
    return {"after_priorities": [priority], "after_run_at_us": [run_at], "after_ids": [last]}


def index_reads(node: dict[str, Any], name_part: str) -> int:
    """Shared buffers that the scans under EXPLAIN (ANALYZE, BUFFERS) plan ``node`` of the
    indexes whose name holds ``name_part`` touched, each scan's own (index and heap): what
    a claim read to find its jobs, or to look at running ones, apart from its writes."""
    own = buffers(node) if name_part in node.get("Index Name", "") else 0
    return own + sum(index_reads(child, name_part) for child in node.get("Plans", []))


def count(db: psycopg.Connection, table: str = "pgpool_jobs") -> int:
    return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def stored_payloads(db: psycopg.Connection) -> list[object]:
    """Payloads as a worker will see them: the stored jsonb text, decoded by orjson."""
    rows = db.execute("SELECT payload::text FROM pgpool_jobs ORDER BY id").fetchall()
    return [orjson.loads(text) for (text,) in rows]


def has_table(conn: psycopg.Connection, name: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()[0]


def with_pools(dsn: str, count: int, configure: Callable[[Any], Awaitable[None]],
               work: Callable[[list[Any]], Awaitable[Any]]) -> Any:
    """Run ``work(pools)`` with ``count`` autocommit connection pools on ``dsn``, each
    connection set up by ``configure`` (as a dispatcher's: `pgpool.host.claimer
    .configure_connection`); the pools are closed afterwards."""
    from psycopg_pool import AsyncConnectionPool

    async def main() -> Any:
        pools = [AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False,
                                     kwargs={"autocommit": True}, configure=configure)
                 for _ in range(count)]
        for pool in pools:
            await pool.open(wait=True)
        try:
            return await work(pools)
        finally:
            for pool in pools:
                await pool.close()

    return asyncio.run(main())


def claim_racing(dsn: str, configure: Callable[[Any], Awaitable[None]],
                 claimer: Callable[[Any, str], Any], count: int, seconds: float,
                 largest: int) -> None:
    """``count`` claimers (``claimer(pool, owner)``: a `pgpool.host.claimer.Claimer`), each
    on its own pool, claim as fast as they can for ``seconds``, in batches of 1 to
    ``largest``, varied."""
    async def work(pools: list[Any]) -> None:
        async def claim_for(c: Any, seed: int) -> None:
            loop = asyncio.get_running_loop()
            until, batch = loop.time() + seconds, seed
            while loop.time() < until:
                batch = batch * 7 % largest + 1
                await c.claim(batch)

        await asyncio.gather(*(claim_for(claimer(pool, f"host-{n}:1:aa"), n + 1)
                               for n, pool in enumerate(pools)))

    with_pools(dsn, count, configure, work)


def most_claimed_in_a_second(db: psycopg.Connection) -> tuple[int, int]:
    """(the most running jobs claimed in any one-second window of their ``claimed_at``, the
    server's clock, as a rate's; the running jobs)."""
    return db.execute(
        "SELECT max(w.n), (SELECT count(*) FROM pgpool_jobs WHERE state = 'running') "
        "FROM pgpool_jobs AS j CROSS JOIN LATERAL ("
        "  SELECT count(*) AS n FROM pgpool_jobs AS o WHERE o.state = 'running' "
        "    AND o.claimed_at >= j.claimed_at "
        "    AND o.claimed_at < j.claimed_at + interval '1 second') AS w "
        "WHERE j.state = 'running'").fetchone()
