"""``pgpool_enqueue``, the SQL function of migration 16: the row, the checks and the wake-up
of `pgpool.enqueue`, from any driver, from a trigger, and only for the roles granted it."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import psycopg
import psycopg2
import pytest
from commands import RUN, run_pgpool
from dbtools import listen_sql, listeners
from processes import start_pgpool
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb
from records import read_records
from waits import wait_until

import pgpool
from pgpool.enqueue import function_params, max_payload_bytes
from pgpool.job import JobOptions
from pgpool.sql import jobs as sql_jobs

#: A job row as a comparable value: every column but the id.
ROW = "SELECT to_jsonb(j) - 'id' FROM pgpool_jobs AS j WHERE id = %s"

FUTURE = datetime(2099, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
PAST = datetime(2001, 1, 2, 3, 4, 5, tzinfo=UTC)

#: (pgpool.enqueue's keyword arguments, pgpool_enqueue's named arguments) for the same job.
SAME_JOB = [
    ({}, {}),
    ({"queue": "mail", "priority": 7, "unique_key": "order-1", "max_attempts": 3,
      "tenant": "acme", "concurrency_key": "acct-9"},
     {"queue": "mail", "priority": 7, "unique_key": "order-1", "max_attempts": 3,
      "tenant": "acme", "concurrency_key": "acct-9"}),
    ({"priority": -2147483647}, {"priority": -2147483647}),
    ({"priority": 2147483647}, {"priority": 2147483647}),
    ({"run_at": FUTURE}, {"run_at": FUTURE}),
    ({"run_at": PAST}, {"run_at": PAST}),
    ({"delay": 90}, {"delay": timedelta(seconds=90)}),
    ({"delay": timedelta(days=3, microseconds=5)}, {"delay": timedelta(days=3, microseconds=5)}),
    ({"delay": 0}, {"delay": timedelta(0)}),
]

PAYLOAD = {"order": 1, "price": 12.5, "name": "café ☕", "tags": ["a", None, True],
           "nested": {"deep": [{"x": []}, {}]}, "big": 2**62}


def sql_enqueue(conn: psycopg.Connection, kind: str, payload: Any, **options: Any
                ) -> int | None:
    """``pgpool_enqueue`` called with named arguments, as an application would."""
    named = [pgsql.SQL("{} => {}").format(pgsql.Identifier(k), pgsql.Placeholder(k))
             for k in options]
    query = pgsql.SQL("SELECT pgpool_enqueue({})").format(
        pgsql.SQL(", ").join([pgsql.SQL("%(kind)s"), pgsql.SQL("%(payload)s"), *named]))
    return conn.execute(query, {"kind": kind, "payload": payload, **options}).fetchone()[0]


@pytest.mark.parametrize(("python", "sql"), SAME_JOB)
def test_every_option_lands_in_the_row_as_pgpool_enqueue_puts_it(db, dsn, python, sql):
    # One transaction: now() is the same for both, so the run_at of a delay is too.
    with psycopg.connect(dsn) as conn:
        first = pgpool.enqueue(conn, "record", PAYLOAD, **python)
        by_python = conn.execute(ROW, (first,)).fetchone()[0]
        conn.execute("DELETE FROM pgpool_jobs")
        second = sql_enqueue(conn, "record", Jsonb(PAYLOAD), **sql)
        assert second is not None and second != first
        assert conn.execute(ROW, (second,)).fetchone()[0] == by_python
        if "unique_key" in sql:  # a live job holds the key: NULL, as enqueue's None
            assert sql_enqueue(conn, "record", Jsonb({}), **sql) is None
            assert pgpool.enqueue(conn, "record", {}, **python) is None
            assert conn.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 1
        conn.rollback()


@pytest.mark.parametrize("scheduled", [False, True])
def test_the_wake_up_is_enqueues_channel_and_payload_sent_at_commit(db, dsn, scheduled):
    options = {"run_at": FUTURE} if scheduled else {"queue": "mail"}
    ears = psycopg.connect(dsn, autocommit=True)
    ears.execute(listen_sql(ears))
    heard = []
    for send in (lambda c: pgpool.enqueue(c, "record", {}, **options),
                 lambda c: sql_enqueue(c, "record", Jsonb({}), **options)):
        with psycopg.connect(dsn) as conn:
            send(conn)
            conn.rollback()  # wakes nobody: the next one heard is the committed one
            send(conn)
        heard += [(n.channel, n.payload) for n in ears.notifies(timeout=30, stop_after=1)]
    ears.close()
    assert heard[0] == heard[1] == (heard[0][0], "!stage" if scheduled else "mail")
    assert heard[0][0].startswith("pgpool")


DEEP = {"a": json.loads("[" * 253 + "]" * 253)}  # 254 levels with the payload: the limit
DEEPER = {"a": json.loads("[" * 254 + "]" * 254)}
DEEPER_OBJECTS = json.loads('{"a": ' * 254 + "{}" + "}" * 254)

#: (named arguments, what the message says): each refused with a 22xxx error and a hint.
BAD = [
    ({"kind": "bad kind"}, 'invalid kind "bad kind"'),
    ({"kind": None}, "invalid kind NULL"),
    ({"kind": "k" * 129}, "invalid kind"),
    ({"kind": "café"}, 'invalid kind "café"'),
    ({"kind": "mail\n"}, 'invalid kind "mail\\n"'),
    ({"queue": "-mail"}, 'invalid queue "-mail"'),
    ({"queue": None}, "invalid queue NULL"),
    ({"payload": Jsonb([1, 2])}, "payload must be a JSON object, not array"),
    ({"payload": Jsonb("text")}, "payload must be a JSON object, not string"),
    ({"payload": None}, "payload must be a JSON object, not NULL"),
    ({"payload": Jsonb({"s": "x" * (1 << 20)})}, "over the 1048576-byte limit"),
    ({"payload": Jsonb(DEEPER)}, "nested more than 254 levels deep"),
    ({"payload": Jsonb(DEEPER_OBJECTS)}, "nested more than 254 levels deep"),
    ({"priority": None}, "priority must be an integer within ±2147483647, got NULL"),
    ({"priority": -2147483648}, "priority must be an integer within ±2147483647"),
    ({"run_at": FUTURE, "delay": timedelta(seconds=1)}, "either run_at or delay, not both"),
    ({"run_at": "infinity"}, "run_at must be a finite time, got infinity"),
    ({"delay": timedelta(seconds=-1)}, "delay must be from 0 to 100 years"),
    ({"delay": timedelta(days=100 * 366 + 1)}, "delay must be from 0 to 100 years"),
    ({"unique_key": ""}, "unique_key must be NULL or a non-empty string"),
    ({"max_attempts": 0}, "max_attempts must be a positive integer, got 0"),
    ({"tenant": ""}, "tenant must be NULL or a non-empty string of at most 200 characters"),
    ({"tenant": "t" * 201}, "got 201 characters"),
    ({"concurrency_key": ""}, "concurrency_key must be NULL or a non-empty string"),
    ({"concurrency_key": "c" * 201}, "got 201 characters"),
]


@pytest.mark.parametrize(("args", "says"), BAD, ids=[says for _, says in BAD])
def test_bad_input_raises_a_clear_error_and_inserts_nothing(db, dsn, args, says):
    args = {"kind": "record", "payload": Jsonb({}), **args}
    named = pgsql.SQL(", ").join(
        pgsql.SQL("{} => {}").format(pgsql.Identifier(k), pgsql.Placeholder(k)) for k in args)
    with psycopg.connect(dsn) as conn:
        with pytest.raises(psycopg.errors.DataError) as caught:
            conn.execute(pgsql.SQL("SELECT pgpool_enqueue({})").format(named), args)
        conn.rollback()
    error = caught.value
    assert error.sqlstate.startswith("22")
    assert error.diag.message_primary.startswith("pgpool_enqueue: ")
    assert says in error.diag.message_primary
    assert "\n" not in error.diag.message_primary
    assert error.diag.message_hint
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0


def test_the_deepest_payload_enqueue_takes_is_taken(db):
    pgpool.enqueue(db, "record", DEEP)
    assert sql_enqueue(db, "record", Jsonb(DEEP)) is not None
    rows = db.execute("SELECT payload FROM pgpool_jobs").fetchall()
    assert rows[0] == rows[1]


def asyncpg_url(dsn: str) -> str:
    """``dsn`` as the URL asyncpg takes (it does not read libpq's key=value strings);
    the options' settings go as query parameters, which asyncpg sends as server settings."""
    from urllib.parse import quote, urlencode

    parts = conninfo_to_dict(dsn)
    query = {k: parts[k] for k in ("host", "port", "password") if parts.get(k)}
    for setting in (parts.get("options") or "").replace("-c ", "-c").split():
        name, _, value = setting.removeprefix("-c").partition("=")
        query[name] = value
    return (f"postgresql://{quote(parts.get('user') or '')}@/{quote(parts['dbname'])}?"
            + urlencode(query))


def ended(record_dir: Path) -> set[int]:
    return {job for job, _, _, event in read_records(record_dir) if event == "end"}


def test_other_drivers_roll_back_to_nothing_and_a_commit_wakes_a_host_at_once(
        db, dsn, record_dir):
    host = start_pgpool(dsn, *RUN, "--procs", "1", "--poll", "600", record_dir=record_dir)
    host.event("started")
    # The claim loop may still be in its first empty claim: enqueue after LISTEN is up.
    wait_until(lambda: listeners(db), "LISTEN")

    old = psycopg2.connect(dsn)  # a transaction opens with the first statement
    with old.cursor() as cur:
        cur.execute("SELECT pgpool_enqueue('record', %s::jsonb)", (json.dumps({"n": 1}),))
        (rolled_back,) = cur.fetchone()
        old.rollback()
        cur.execute("SELECT pgpool_enqueue('record', %s::jsonb, priority => %s)",
                    (json.dumps({"n": 2}), 5))
        (by_psycopg2,) = cur.fetchone()
        old.commit()
    old.close()
    # The poll interval is 10 minutes: only the notification can explain a pickup.
    wait_until(lambda: by_psycopg2 in ended(record_dir), "psycopg2's job to run", 20)

    async def by_asyncpg() -> tuple[int, int]:
        conn = await asyncpg.connect(asyncpg_url(dsn))
        try:
            try:
                async with conn.transaction():
                    undone = await conn.fetchval("SELECT pgpool_enqueue('record', $1::jsonb)",
                                                 json.dumps({"n": 3}))
                    raise RuntimeError("roll back")
            except RuntimeError:
                pass
            async with conn.transaction():
                done = await conn.fetchval(
                    "SELECT pgpool_enqueue('record', $1::jsonb, queue => $2)",
                    json.dumps({"n": 4}), "default")
            return undone, done
        finally:
            await conn.close()

    undone, committed = asyncio.run(by_asyncpg())
    wait_until(lambda: committed in ended(record_dir), "asyncpg's job to run", 20)
    assert ended(record_dir) == {by_psycopg2, committed}
    assert {rolled_back, undone}.isdisjoint(ended(record_dir))
    wait_until(lambda: db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 0,
               "both jobs to be acked")
    assert host.stop() == 0, host.stderr


@pytest.mark.own_schema
def test_an_application_tables_trigger_enqueues_in_the_same_transaction(db, dsn):
    db.execute("""
        CREATE TABLE orders (id int PRIMARY KEY, email text NOT NULL);
        CREATE FUNCTION orders_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pgpool_enqueue('send_receipt', jsonb_build_object('order', NEW.id),
                                   unique_key => 'receipt:' || NEW.id);
            RETURN NULL;
        END $$;
        CREATE TRIGGER orders_enqueue AFTER INSERT ON orders
            FOR EACH ROW EXECUTE FUNCTION orders_enqueue();
    """)
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO orders VALUES (1, 'a@example.com')")
        conn.rollback()
        conn.execute("INSERT INTO orders VALUES (2, 'b@example.com')")
        # Inside the transaction, the job is there with the row that caused it.
        assert conn.execute("SELECT payload FROM pgpool_jobs").fetchall() == [({"order": 2},)]
    assert db.execute("SELECT id FROM orders").fetchall() == [(2,)]
    assert db.execute("SELECT kind, payload, unique_key FROM pgpool_jobs").fetchall() == [
        ("send_receipt", {"order": 2}, "receipt:2")]
    # A bad job refuses the business row too: all or nothing.
    db.execute("CREATE OR REPLACE FUNCTION orders_enqueue() RETURNS trigger LANGUAGE plpgsql "
               "AS $$ BEGIN PERFORM pgpool_enqueue('bad kind', '{}'); RETURN NULL; END $$")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="invalid kind"):
        db.execute("INSERT INTO orders VALUES (3, 'c@example.com')")
    assert db.execute("SELECT count(*) FROM orders").fetchone()[0] == 1


@pytest.mark.own_schema
def test_the_app_role_of_pgpool_grants_may_call_it_and_another_role_may_not(db, dsn):
    app, other = (f"pgpool_{what}_{uuid.uuid4().hex[:8]}" for what in ("app", "other"))
    for role in (app, other):
        db.execute(pgsql.SQL("CREATE ROLE {} LOGIN").format(pgsql.Identifier(role)))
    try:
        applied = run_pgpool(dsn, "grants", "--app", app, "--apply")
        assert applied.returncode == 0, applied.stderr
        schema = db.execute("SELECT current_schema()").fetchone()[0]
        # Another role may use the schema, but not call the function.
        db.execute(pgsql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            pgsql.Identifier(schema), pgsql.Identifier(other)))
        # From a search_path without pgpool's schema: the function finds its tables itself.
        elsewhere = "-c search_path=pg_catalog"
        with psycopg.connect(make_conninfo(dsn, user=app, options=elsewhere),
                             autocommit=True) as conn:
            call = pgsql.SQL("SELECT {}.pgpool_enqueue('record', '{{}}', tenant => 't')"
                             ).format(pgsql.Identifier(schema))
            job = conn.execute(call).fetchone()[0]
            assert job is not None
        with (psycopg.connect(make_conninfo(dsn, user=other, options=elsewhere),
                              autocommit=True) as conn,
              pytest.raises(psycopg.errors.InsufficientPrivilege,
                            match="permission denied for function pgpool_enqueue")):
            conn.execute(call)
        assert db.execute("SELECT id, tenant FROM pgpool_jobs").fetchall() == [(job, "t")]
    finally:
        for role in (app, other):
            db.execute(pgsql.SQL("DROP OWNED BY {}").format(pgsql.Identifier(role)))
            db.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))


def sized_payload(size: int) -> dict[str, Any]:
    """A payload of exactly ``size`` bytes of compact JSON (what `pgpool.enqueue` measures),
    with a separator every two bytes: jsonb's text form of it, which puts a space after
    each, is half as long again."""
    items = [1] * (size // 3)
    bare = len(orjson.dumps({"items": items, "pad": ""}))
    payload = {"items": items, "pad": "x" * (size - bare)}
    assert len(orjson.dumps(payload)) == size
    return payload


def test_the_payload_limit_is_pgpool_enqueues_measured_as_it_measures(db, dsn):
    limit = max_payload_bytes()
    for size, taken in ((800_000, True), (limit, True), (limit + 1, False)):
        payload = sized_payload(size)
        if taken:
            assert pgpool.enqueue(db, "record", payload) is not None
            assert sql_enqueue(db, "record", Jsonb(payload)) is not None
        else:
            with pytest.raises(pgpool.PayloadError, match=f"{size:,} bytes, over the"):
                pgpool.enqueue(db, "record", payload)
            with pytest.raises(psycopg.errors.InvalidParameterValue,
                               match=f"payload is {size} bytes, over the {limit}-byte limit"):
                sql_enqueue(db, "record", Jsonb(payload))
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 4


def test_the_functions_take_the_limit_pgpool_enqueue_has(db, dsn, monkeypatch):
    """PGPOOL_MAX_PAYLOAD_BYTES reaches the functions a Python producer calls
    (``pgpool_enqueue`` through another driver, ``pgpool_enqueue_group`` through
    `pgpool.group`); SQL callers set ``pgpool.max_payload_bytes``."""
    big = sized_payload(1_500_000)
    monkeypatch.setenv("PGPOOL_MAX_PAYLOAD_BYTES", "2000000")
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(sql_jobs.ENQUEUE_BY_FUNCTION,
                    function_params("record", big, JobOptions()))
        assert cur.fetchone()[0] is not None
    assert pgpool.group(db, "record", [big], then=("record", {})).size == 1
    monkeypatch.setenv("PGPOOL_MAX_PAYLOAD_BYTES", "100")
    with pytest.raises(pgpool.PayloadError, match="over the 100-byte limit"):
        pgpool.group(db, "record", [sized_payload(101)], then=("record", {}))
    with psycopg.connect(dsn) as conn:
        conn.execute("SET pgpool.max_payload_bytes = 100")
        assert sql_enqueue(conn, "record", Jsonb(sized_payload(100))) is not None
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="over the 100-byte"):
            sql_enqueue(conn, "record", Jsonb(sized_payload(101)))
        conn.rollback()
        conn.execute("SET pgpool.max_payload_bytes = 'lots'")
        with pytest.raises(psycopg.errors.InvalidParameterValue,
                           match=r'the setting pgpool\.max_payload_bytes is "lots"'):
            sql_enqueue(conn, "record", Jsonb({}))
    assert db.execute("SELECT count(*) FROM pgpool_jobs").fetchone()[0] == 3
