"""A hostile producer: the application role of ``pgpool grants``, trying every way it has
to write a job that only a host would write, or to fool the checks that stop it. Each try
is refused (an error, nothing written) or harmless (what it wrote runs, or is reaped, as an
ordinary job would be, and holds no key for long)."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import psycopg
import pytest
from commands import run_pgpool
from dbtools import one
from installations import RoleInstallation
from psycopg import sql
from records import read_records

import pgpool

#: A forged job: what a host would have written, holding a concurrency key and a unique key.
FORGED = ("INSERT INTO pgpool_jobs (kind, payload, state, concurrency_key, unique_key) "
          "VALUES ('record', '{}', %s, 'acct-42', 'invoice-7')")
#: Ways a session can make unqualified names inside pgpool's functions mean something else.
#: {schema} is the installation's.
TRICKS = {
    "nothing": [],
    "a temp table pg_class saying the app owns pgpool_jobs": [
        "CREATE TEMP TABLE pg_class (oid oid, relowner oid)",
        "INSERT INTO pg_temp.pg_class VALUES ('pgpool_jobs'::regclass, "
        "(SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user))",
    ],
    "a temp view pg_class": [
        "CREATE TEMP VIEW pg_class AS SELECT 'pgpool_jobs'::regclass::oid AS oid, "
        "(SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user) AS relowner",
    ],
    "pg_temp first on search_path": [
        "CREATE TEMP TABLE pg_class (oid oid, relowner oid)",
        "INSERT INTO pg_temp.pg_class VALUES ('pgpool_jobs'::regclass, "
        "(SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user))",
        "SET search_path = pg_temp, {schema}",
    ],
    "a temp function pg_has_role": [
        "CREATE FUNCTION pg_temp.pg_has_role(oid, text) RETURNS boolean "
        "LANGUAGE sql AS 'SELECT true'",
        "SET search_path = pg_temp, {schema}",
    ],
}


@pytest.fixture
def installed(role_installation: RoleInstallation) -> Iterator[RoleInstallation]:
    role_installation.empty()
    yield role_installation


def app_session(installed: RoleInstallation, *setup: str) -> psycopg.Connection:
    conn = psycopg.connect(installed.app, autocommit=True)
    for statement in setup:
        conn.execute(statement.format(schema=installed.schema))
    return conn


def jobs(installed: RoleInstallation) -> int:
    with psycopg.connect(installed.owner) as conn:
        return one(conn, "SELECT count(*) FROM pgpool_jobs")[0]


@pytest.mark.parametrize("trick", TRICKS)
@pytest.mark.parametrize("state", ["running", "done", "parked", "waiting"])
def test_the_app_cannot_insert_a_job_a_host_would_write(installed, trick, state):
    with app_session(installed, *TRICKS[trick]) as conn:
        with pytest.raises(psycopg.errors.CheckViolation,
                           match=f"a new job must be ready or scheduled, not {state}"):
            conn.execute(FORGED, (state,))
        with (pytest.raises(psycopg.errors.CheckViolation), conn.cursor() as cur,
              cur.copy("COPY pgpool_jobs (kind, payload, state) FROM STDIN") as copy):
            copy.write_row(("record", "{}", state))
    assert jobs(installed) == 0


@pytest.mark.parametrize("trick", TRICKS)
def test_the_app_cannot_put_a_job_in_a_group_nor_write_a_group(installed, trick):
    with psycopg.connect(installed.owner, autocommit=True) as owner:
        victim = pgpool.group(owner, "record", [{}, {}], then=("record", {}))
    with app_session(installed, *TRICKS[trick]) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO pgpool_jobs (kind, payload, group_id) "
                         "VALUES ('record', '{}', %s)", (victim.id,))
        with (pytest.raises(psycopg.errors.InsufficientPrivilege), conn.cursor() as cur,
              cur.copy("COPY pgpool_jobs (kind, payload, group_id) FROM STDIN") as copy):
            copy.write_row(("record", "{}", victim.id))
        # The ids the next groups would get, taken ahead of them.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO pgpool_groups (id, total) "
                         "SELECT g, 0 FROM generate_series(1, 100) AS g")
        # Its own groups, through pgpool.group, as ever.
        mine = pgpool.group(conn, "record", [{}], then=("record", {}))
    with psycopg.connect(installed.owner) as owner:
        assert one(owner, "SELECT count(*) FROM pgpool_jobs WHERE group_id = %s",
                   victim.id) == (2,)
        assert one(owner, "SELECT total FROM pgpool_groups WHERE id = %s", mine.id) == (1,)


def test_a_role_granted_more_still_cannot_forge_states_or_groups(installed):
    """The trigger holds for a role given INSERT on the whole table by hand, not only for
    the columns `pgpool grants` gives."""
    role = sql.Identifier(installed.app_role)
    with psycopg.connect(installed.owner, autocommit=True) as owner:
        owner.execute(sql.SQL("GRANT INSERT ON pgpool_jobs TO {}").format(role))
        victim = pgpool.group(owner, "record", [{}], then=("record", {}))
    try:
        for setup in TRICKS.values():
            with app_session(installed, *setup) as conn:
                with pytest.raises(psycopg.errors.CheckViolation):
                    conn.execute(FORGED, ("running",))
                with pytest.raises(psycopg.errors.CheckViolation,
                                   match=r"only pgpool\.group puts a job in a group"):
                    conn.execute("INSERT INTO pgpool_jobs (kind, payload, group_id) "
                                 "VALUES ('record', '{}', %s)", (victim.id,))
    finally:
        assert run_pgpool(installed.owner, "grants", "--app", installed.app_role,
                          "--apply").returncode == 0
    assert jobs(installed) == 2


def test_overloads_planted_in_pgpools_schema_are_never_called(installed):
    """A role that may create objects in pgpool's schema (PUBLIC could in ``public`` before
    PostgreSQL 15) plants functions that would win over pg_catalog's in an unqualified call.
    pgpool's functions call none of them, whoever calls pgpool's functions: here the
    tables' owner, whose privileges the planted code would get."""
    schema, role = sql.Identifier(installed.schema), sql.Identifier(installed.app_role)
    with psycopg.connect(installed.owner, autocommit=True) as owner:
        owner.execute(sql.SQL("GRANT CREATE ON SCHEMA {} TO {}").format(schema, role))
    try:
        with app_session(installed) as conn:
            for signature in ("to_jsonb(text)", "jsonb_path_exists(jsonb, text)",
                              "octet_length(jsonb)", "length(jsonb)",
                              "jsonb_array_length(text)", "jsonb_array_elements(text)"):
                conn.execute(sql.SQL(
                    "CREATE FUNCTION {}.{} RETURNS integer LANGUAGE plpgsql AS "
                    "$$BEGIN RAISE EXCEPTION 'planted code ran as %', current_user; END$$"
                ).format(schema, sql.SQL(signature)))
        with psycopg.connect(installed.owner, autocommit=True) as owner:
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="invalid kind"):
                owner.execute("SELECT pgpool_enqueue('bad kind!', '{}')")
            deep = "[" * 300 + "]" * 300
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="254 levels"):
                owner.execute("SELECT pgpool_enqueue('record', %s::jsonb)",
                              ('{"a": ' + deep + "}",))
            assert pgpool.group(owner, "record", [{}, {}], then=("record", {})).size == 2
            owner.execute("INSERT INTO pgpool_jobs (kind, payload, state) "
                          "VALUES ('record', '{}', 'running')")
    finally:
        with psycopg.connect(installed.owner, autocommit=True) as owner:
            owner.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(role))
            assert run_pgpool(installed.owner, "grants", "--app", installed.app_role,
                              "--apply").returncode == 0
    assert jobs(installed) == 4


@pytest.mark.parametrize("payload, error", [
    ('{"a": "\\u0000"}', psycopg.errors.UntranslatableCharacter),
    ("[1, 2]", psycopg.errors.InvalidParameterValue),
    ('"text"', psycopg.errors.InvalidParameterValue),
    ("null", psycopg.errors.InvalidParameterValue),
    ('{"a": ' + "[" * 300 + "]" * 300 + "}", psycopg.errors.InvalidParameterValue),
    (orjson.dumps({"a": "x" * (1024 * 1024)}).decode(), psycopg.errors.InvalidParameterValue),
])
def test_pgpool_enqueue_refuses_what_pgpool_enqueue_refuses(installed, payload, error):
    with app_session(installed) as conn:
        with pytest.raises(error):
            conn.execute("SELECT pgpool_enqueue('record', %s::jsonb)", (payload,))
        # Nor does a group through the function take such members.
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SELECT pgpool_enqueue_group('record', '[1]', 'default', 0, NULL, "
                         "NULL, '', NULL, 'record', '{}', 'default', 0, NULL, '', NULL)")
    assert jobs(installed) == 0


def test_what_a_plain_insert_can_write_ends_done_or_dead(installed, record_dir):
    """A plain INSERT checks nothing: whatever payload it writes, the host ends the job
    (here dead: max_attempts 1) and goes on; nothing is left running or holding a key."""
    deep = "[" * 2000 + "]" * 2000
    payloads = ["[1, 2]", '"text"', "null", '{"a": ' + deep + "}",
                orjson.dumps({"a": "x" * (5 * 1024 * 1024)}).decode(), '{"ok": true}']
    with app_session(installed) as conn:
        for payload in payloads:
            conn.execute("INSERT INTO pgpool_jobs (kind, payload, max_attempts, "
                         "concurrency_key) VALUES ('fail', %s::jsonb, 1, 'k')", (payload,))
    done = run_pgpool(installed.worker, "run", "--handlers", "testjobs", "--burst",
                      record_dir=record_dir)
    assert done.returncode == 0, done.stderr
    with psycopg.connect(installed.owner) as owner:
        assert one(owner, "SELECT count(*) FROM pgpool_jobs") == (0,)
        assert one(owner, "SELECT count(*) FROM pgpool_dead") == (len(payloads),)


def test_a_running_row_without_a_lease_is_reaped_and_frees_its_keys(installed, record_dir):
    """The owner may write a job by hand (a repair): a running row with no lease and no
    owner is reaped as an attempt that never started, so it holds its keys for one pass at
    most, then runs as any job would; `--burst` ends."""
    with psycopg.connect(installed.owner, autocommit=True) as owner:
        owner.execute(FORGED, ("running",))
        pgpool.enqueue(owner, "record", {}, concurrency_key="acct-42")
    done = run_pgpool(installed.worker, "run", "--handlers", "testjobs", "--burst",
                      record_dir=record_dir, timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(read_records(record_dir)) == 4  # both ran: a start and an end each
    with psycopg.connect(installed.owner) as owner:
        assert one(owner, "SELECT count(*) FROM pgpool_jobs") == (0,)
        assert one(owner, "SELECT count(*) FROM pgpool_dead") == (0,)


def test_the_callbacks_release_refuses_a_producer_and_waits_for_the_group(installed):
    """``pgpool_release_callbacks`` keeps PostgreSQL's EXECUTE for everyone and runs as its
    caller: the application role, which may not update jobs, is refused; and even the
    worker role cannot make ready the callback of a group that is not complete."""
    release = "SELECT pgpool_release_callbacks(ARRAY[%s]::bigint[])"
    for trick, setup in TRICKS.items():
        with app_session(installed, *setup) as conn:
            group = pgpool.group(conn, "record", [{}], then=("record", {}))
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(release, (group.id,))
            assert callback_state(installed, group.id) == "waiting", trick
    with psycopg.connect(installed.worker, autocommit=True) as conn:
        assert conn.execute(release, (group.id,)).fetchall() == []
    assert callback_state(installed, group.id) == "waiting"


def callback_state(installed: RoleInstallation, group: int) -> str:
    with psycopg.connect(installed.owner) as owner:
        return one(owner, "SELECT state FROM pgpool_jobs WHERE id = %s", group)[0]


def test_the_worker_role_starts_a_handlers_group(installed):
    """A handler's follow-up group is made by ``pgpool_enqueue_group``, which the worker
    role of `pgpool grants` may call (it writes pgpool_groups through it only)."""
    with app_session(installed) as conn:
        pgpool.enqueue(conn, "out.fanout", {})
    done = run_pgpool(installed.worker, "run", "--handlers", "outcomejobs", "--burst",
                      timeout=60)
    assert done.returncode == 0, done.stderr
    with psycopg.connect(installed.owner) as owner:
        assert one(owner, "SELECT total, done FROM pgpool_groups") == (4, 4)
        assert one(owner, "SELECT count(*) FROM pgpool_jobs") == (0,)
        assert one(owner, "SELECT count(*) FROM pgpool_dead") == (0,)
