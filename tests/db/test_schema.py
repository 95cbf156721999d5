"""Migrations: versioned, idempotent, safe to run from many hosts at once."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest
from commands import RUN, assert_user_error, run_pgpool, status_json
from dbtools import insert_old_job, make_version_1_schema
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from records import read_records
from waits import wait_until

import pgpool
from pgpool.db import schema

#: Every migration's version, and those after version ``n``.
ALL = [m.version for m in schema.MIGRATIONS]


def after(n: int) -> list[int]:
    return [v for v in ALL if v > n]


@pytest.mark.own_schema
def test_migrate_creates_schema_records_version_and_is_idempotent(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert schema.schema_version(conn) is None
        assert pgpool.migrate(conn) == ALL
        assert pgpool.migrate(conn) == []
        assert schema.schema_version(conn) == pgpool.SCHEMA_VERSION
        options = conn.execute(
            "SELECT reloptions FROM pg_class WHERE relname = 'pgpool_jobs' "
            "AND relnamespace = current_schema()::regnamespace").fetchone()[0]
        assert "fillfactor=80" in options


@pytest.mark.own_schema
def test_concurrent_migrations_apply_once(dsn):
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                results.append(pgpool.migrate(conn))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(results) == [[], [], [], [], [], ALL]


@pytest.mark.own_schema
def test_migrate_upgrades_a_version_1_schema_keeping_its_jobs(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        make_version_1_schema(conn)
        job = insert_old_job(conn)
        assert schema.schema_version(conn) == 1
        assert pgpool.migrate(conn) == after(1)
        assert schema.schema_version(conn) == pgpool.SCHEMA_VERSION
        assert conn.execute("SELECT id FROM pgpool_jobs").fetchall() == [(job,)]
        assert conn.execute("SELECT count(*) FROM pgpool_hosts").fetchone() == (0,)


def make_version_2_schema(conn: psycopg.Connection) -> None:
    """pgpool's schema as version 2 left it: version 1, then migration 2 as it shipped."""
    make_version_1_schema(conn)
    conn.execute(schema.MIGRATIONS[1].ddl)
    conn.execute("INSERT INTO pgpool_schema_version (version, description) VALUES (2, %s)",
                 (schema.MIGRATIONS[1].description,))


# How a version-2 dispatcher beats: it knows nothing of the claim columns.
V2_HOST_UPSERT = """
INSERT INTO pgpool_hosts AS h (owner, hostname, pid, procs, queues, kinds, lease,
                               started_at, last_seen, jobs_done, jobs_failed)
VALUES (%s, 'old', 1, 2, '{default}', '{record}', 30, now(), now(), %s, 0)
ON CONFLICT (owner) DO UPDATE
SET last_seen = now(), jobs_done = excluded.jobs_done, jobs_failed = excluded.jobs_failed
"""


@pytest.mark.own_schema
def test_migrate_upgrades_a_version_2_schema_in_place_keeping_hosts_and_jobs(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        make_version_2_schema(conn)
        job = insert_old_job(conn)
        conn.execute(V2_HOST_UPSERT, ("old:1:aa", 5))
        with pytest.raises(pgpool.SchemaError, match="run `pgpool migrate` to upgrade"):
            schema.check_version(schema.schema_version(conn))

        assert pgpool.migrate(conn) == after(2)
        schema.check_version(schema.schema_version(conn))
        assert conn.execute("SELECT id FROM pgpool_jobs").fetchall() == [(job,)]
        # The registered host keeps its row; what it never reported stays unknown (NULL).
        claims = ("SELECT owner, jobs_done, jobs_claimed, claims_per_sec, max_claims_per_sec "
                  "FROM pgpool_hosts")
        assert conn.execute(claims).fetchall() == [("old:1:aa", 5, 0, None, None)]
        # A version-2 dispatcher that was already running goes on beating after the upgrade.
        conn.execute(V2_HOST_UPSERT, ("old:1:aa", 6))
        conn.execute(V2_HOST_UPSERT, ("old:2:bb", 0))
        assert conn.execute(claims + " ORDER BY owner").fetchall() == [
            ("old:1:aa", 6, 0, None, None), ("old:2:bb", 0, 0, None, None)]
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE pgpool_hosts SET max_claims_per_sec = 0")


def test_check_version_refuses_missing_older_and_newer():
    with pytest.raises(pgpool.SchemaError, match="pgpool migrate"):
        schema.check_version(None)
    with pytest.raises(pgpool.SchemaError, match="run `pgpool migrate` to upgrade"):
        schema.check_version(0)  # bookkeeping table present, migrations not applied
    with pytest.raises(pgpool.SchemaError,
                       match=f"at version 2 but this pgpool needs {pgpool.SCHEMA_VERSION}"):
        schema.check_version(2)
    with pytest.raises(pgpool.SchemaError, match="newer"):
        schema.check_version(pgpool.SCHEMA_VERSION + 1)
    schema.check_version(pgpool.SCHEMA_VERSION)


# --- where the installation is: search_path, not current_schema() -------------------------


def role_schema(conn: psycopg.Connection) -> str:
    """Create the schema named after the connection's role: the first on the default
    search_path, ``"$user", public``, once it exists. Returns its name."""
    name = conn.execute("SELECT current_user").fetchone()[0]
    conn.execute(pgsql.SQL("CREATE SCHEMA {}").format(pgsql.Identifier(name)))
    return name


def in_schema(dsn: str, name: str) -> str:
    """``dsn`` with search_path set to schema ``name`` only."""
    return make_conninfo(dsn, options=f"-c search_path={name}")


def tables_in(conn: psycopg.Connection, name: str) -> list[str]:
    return [t for (t,) in conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (name,))]


def test_migrate_upgrades_the_install_in_public_after_a_schema_named_after_the_role_appears(
        fresh_dsn, record_dir):
    # The reproduction: pgpool at version 2 in public, found through the default
    # search_path; then a schema named after the role appears ahead of public on it.
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        make_version_2_schema(conn)
        job = insert_old_job(conn)
        mine = role_schema(conn)
    done = run_pgpool(fresh_dsn, "migrate")
    assert done.returncode == 0, done.stderr
    upgrade = [m.version for m in schema.MIGRATIONS if m.version > 2]
    assert f"(applied {', '.join(map(str, upgrade))}) in schema \"public\"" in done.stdout
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        assert tables_in(conn, mine) == []  # nothing was created in the role's schema
        assert conn.execute("SELECT max(version) FROM public.pgpool_schema_version"
                            ).fetchone() == (pgpool.SCHEMA_VERSION,)
        # The job in public is the one status counts and a dispatcher runs.
        assert status_json(fresh_dsn)["queues"][0]["ready"] == 1
        ran = run_pgpool(fresh_dsn, *RUN, "--procs", "1", "--burst", record_dir=record_dir)
        assert ran.returncode == 0, ran.stderr
        assert [r[0] for r in read_records(record_dir) if r[3] == "end"] == [job]
        assert conn.execute("SELECT count(*) FROM public.pgpool_jobs").fetchone() == (0,)


def test_migrate_in_a_transaction_leaves_the_session_settings_as_they_were(fresh_dsn):
    with psycopg.connect(fresh_dsn) as conn:  # not autocommit: migrate runs in a savepoint
        make_version_2_schema(conn)
        role_schema(conn)
        before = conn.execute("SELECT current_setting('search_path'), "
                              "current_setting('lock_timeout')").fetchone()
        assert pgpool.migrate(conn) != []
        assert conn.execute("SELECT current_setting('search_path'), "
                            "current_setting('lock_timeout')").fetchone() == before
        conn.commit()
        assert schema.schema_version(conn) == pgpool.SCHEMA_VERSION


@pytest.mark.parametrize("command", [
    ("migrate",), ("status",), ("enqueue", "record", "{}"), (*RUN, "--burst"),
], ids=["migrate", "status", "enqueue", "run"])
def test_two_installations_on_search_path_are_refused_naming_both(fresh_dsn, command):
    # What the old migrate left behind: a second, empty installation ahead of public.
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        mine = role_schema(conn)
    for name in ("public", mine):
        with psycopg.connect(in_schema(fresh_dsn, name), autocommit=True) as conn:
            pgpool.migrate(conn)
    assert_user_error(run_pgpool(fresh_dsn, *command), "2 schemas on this connection's "
                      f'search_path, "{mine}" and "public"', "search_path in the DSN")


def test_a_table_ahead_of_the_installation_on_search_path_is_refused(fresh_dsn):
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        pgpool.migrate(conn)  # into public
        mine = role_schema(conn)
        conn.execute(pgsql.SQL("CREATE TABLE {}.pgpool_jobs (id int)").format(
            pgsql.Identifier(mine)))
    for command in (("status",), ("migrate",)):
        assert_user_error(run_pgpool(fresh_dsn, *command), 'installed in schema "public"',
                          f'"{mine}".pgpool_jobs')


def test_an_installation_off_search_path_is_named_when_none_is_on_it(fresh_dsn):
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA jobs")
    with psycopg.connect(in_schema(fresh_dsn, "jobs"), autocommit=True) as conn:
        pgpool.migrate(conn)
    assert_user_error(run_pgpool(fresh_dsn, "status"), 'schema "jobs"',
                      "options=-csearch_path=")
    # migrate installs a separate pgpool where search_path points, and says so.
    done = run_pgpool(fresh_dsn, "migrate")
    assert done.returncode == 0, done.stderr
    assert 'in schema "public"' in done.stdout
    assert 'also installed in schema "jobs"' in done.stderr


@pytest.mark.own_schema
def test_a_migration_merged_before_a_lower_numbered_one_is_applied_and_so_is_that_one(
        tmp_path, dsn, monkeypatch):
    """Migrations written in parallel may merge out of order: version 3 first, then 2. A
    database that applied 1 and 3 is at version 1 for a pgpool that has 2 as well, and
    `migrate` applies 2 without running 3 again."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_migrations(tmp_path / "a", {
        "0001_a.sql": "-- description: a\n\nCREATE TABLE pgpool_schema_test (a int);\n",
        "0003_c.sql": ("-- description: c\n\n"
                       "ALTER TABLE pgpool_schema_test ADD COLUMN c int;\n")})
    second = write_migrations(tmp_path / "b", {
        "0001_a.sql": "-- description: a\n\nCREATE TABLE pgpool_schema_test (a int);\n",
        "0002_b.sql": ("-- description: b\n\n"
                       "ALTER TABLE pgpool_schema_test ADD COLUMN b int;\n"),
        "0003_c.sql": ("-- description: c\n\n"
                       "ALTER TABLE pgpool_schema_test ADD COLUMN c int;\n")})
    with psycopg.connect(dsn, autocommit=True) as conn:
        for folder, applied, reached in ((first, [1, 3], 3), (second, [2], 3)):
            migrations = schema.read_migrations(folder)
            monkeypatch.setattr(schema, "MIGRATIONS", migrations)
            monkeypatch.setattr(schema, "SCHEMA_VERSION", migrations[-1].version)
            if applied == [2]:
                with pytest.raises(pgpool.SchemaError, match="at version 1 but"):
                    schema.check(conn)
            assert pgpool.migrate(conn) == applied
            assert schema.schema_version(conn) == reached
            schema.check(conn)
        columns = [name for (name,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'pgpool_schema_test'::regclass"
            " AND attnum > 0 ORDER BY attnum")]
        assert columns == ["a", "c", "b"]


# --- migrations never hold the fleet up behind a lock -------------------------------------


def with_test_migration(monkeypatch: pytest.MonkeyPatch) -> int:
    """Append a migration that needs ACCESS EXCLUSIVE on pgpool_jobs, as a real one adding
    a column would; returns its version."""
    version = schema.SCHEMA_VERSION + 1
    extra = schema.Migration(version, "test: a column",
                             "ALTER TABLE pgpool_jobs ADD COLUMN test_only integer")
    monkeypatch.setattr(schema, "MIGRATIONS", (*schema.MIGRATIONS, extra))
    monkeypatch.setattr(schema, "SCHEMA_VERSION", version)
    return version


def has_test_column(db: psycopg.Connection) -> bool:
    return db.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = "
                      "'pgpool_jobs' AND column_name = 'test_only' AND table_schema = "
                      "current_schema()").fetchone()[0] == 1


def open_transaction_on_jobs(dsn: str) -> psycopg.Connection:
    """An application transaction that enqueued and has not committed yet: it holds ROW
    EXCLUSIVE on pgpool_jobs, which ACCESS EXCLUSIVE must wait for."""
    holder = psycopg.connect(dsn)
    pgpool.enqueue(holder, "record", {})
    return holder


# A heartbeat's statement shape: one row's lease extended.
HEARTBEAT = "UPDATE pgpool_jobs SET lease_until = now() + interval '30 s' WHERE id = %s"


@pytest.mark.own_schema
def test_a_migration_waiting_for_a_lock_never_holds_heartbeats_up(db, dsn, monkeypatch):
    version = with_test_migration(monkeypatch)
    job = pgpool.enqueue(db, "record", {})
    holder = open_transaction_on_jobs(dsn)
    result: list[object] = []
    migrator = psycopg.connect(dsn, autocommit=True)
    # Without a lock timeout the migration would wait (and hold heartbeats up) until the
    # holder ends: this makes such a failure an error after 60 s, not a hung test.
    migrator.execute("SET statement_timeout = '60s'")

    def run() -> None:
        try:
            result.append(schema.migrate(migrator, lock_timeout=1.0, tries=1000))
        except BaseException as exc:  # reported below
            result.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        pid = migrator.info.backend_pid
        # Each try waits 1 s for ACCESS EXCLUSIVE, then backs off (at most 10 s).
        wait_until(lambda: db.execute(
            "SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted "
            "AND mode = 'AccessExclusiveLock'", (pid,)).fetchone(),
            "the migration to wait for its lock")
        # Queued behind that request, a heartbeat waits until the migration lets go: 1 s.
        # Allowing 20 s keeps a loaded machine from failing the test; without the lock
        # timeout it would wait for the holder, which only ends after it.
        with psycopg.connect(dsn, autocommit=True) as beat:
            beat.execute("SET statement_timeout = '20s'")
            assert beat.execute(HEARTBEAT, (job,)).rowcount == 1
        assert thread.is_alive() and not has_test_column(db)
    finally:
        holder.commit()
        holder.close()
    # Once the holder is gone the next try succeeds; tries are at most 10 s apart.
    thread.join(60)
    migrator.close()
    assert result == [[version]]
    assert has_test_column(db)


def test_a_migration_gives_up_with_one_clear_error_while_the_lock_stays_taken(
        db, dsn, monkeypatch):
    with_test_migration(monkeypatch)
    holder = open_transaction_on_jobs(dsn)
    holder_pid = holder.info.backend_pid
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # As above: without a lock timeout this fails after 60 s instead of hanging.
            conn.execute("SET statement_timeout = '60s'")
            with pytest.raises(pgpool.SchemaError) as caught:
                schema.migrate(conn, lock_timeout=0.1, tries=3)
    finally:
        holder.rollback()
        holder.close()
    message = str(caught.value)
    assert "in 3 tries of 0.1 s" in message
    assert f"pid {holder_pid}" in message
    assert "run `pgpool migrate` again" in message
    assert "\n" not in message
    assert not has_test_column(db)
    assert db.execute("SELECT max(version) FROM pgpool_schema_version"
                      ).fetchone() == (schema.MIGRATIONS[-2].version,)


def migrate_to_before(conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch,
                      description: str) -> int:
    """Migrate ``conn``'s installation up to the migration whose description starts with
    ``description``, not that one: the version it has then."""
    index = next(i for i, m in enumerate(schema.MIGRATIONS)
                 if m.description.startswith(description))
    with monkeypatch.context() as before:
        before.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:index])
        before.setattr(schema, "SCHEMA_VERSION", schema.MIGRATIONS[index - 1].version)
        pgpool.migrate(conn)
    return schema.MIGRATIONS[index - 1].version


# --- the scheduled state ------------------------------------------------------------------


@pytest.mark.own_schema
def test_upgrade_moves_jobs_not_yet_due_out_of_the_ready_index(dsn, monkeypatch):
    # Before it, a delayed job was ready with a future run_at, in the one ready index.
    with psycopg.connect(dsn, autocommit=True) as conn:
        version = migrate_to_before(conn, monkeypatch, "scheduled jobs")
        later, due = (conn.execute(
            "INSERT INTO pgpool_jobs (kind, payload, run_at) VALUES ('k', '{}', now() + %s) "
            "RETURNING id", (f"{sign}1 hour",)).fetchone()[0] for sign in "+-")
        assert pgpool.migrate(conn) == after(version)
        assert dict(conn.execute("SELECT id, state FROM pgpool_jobs")) == {
            later: "scheduled", due: "ready"}
        indexes = dict(conn.execute("SELECT indexname, indexdef FROM pg_indexes "
                                    "WHERE tablename = 'pgpool_jobs' "
                                    "AND schemaname = current_schema()"))
        assert "(queue, kind, tenant, priority DESC, run_at, id) WHERE (state = 'ready'" in indexes[
            "pgpool_jobs_ready"]
        assert "(run_at) WHERE (state = 'scheduled'" in indexes["pgpool_jobs_scheduled"]


@pytest.mark.own_schema
def test_upgrade_folds_a_rings_rows_past_64_onto_the_first_keeping_the_window_counted(
        dsn, monkeypatch):
    # Before it, a rate of R was a ring of R rows, one job each. A ring of 200, 130 of
    # them used 10 s ago (slots 1 to 130), and one of 3 used once.
    with psycopg.connect(dsn, autocommit=True) as conn:
        version = migrate_to_before(conn, monkeypatch, "a rate's ring is at most 64 rows")
        conn.execute("INSERT INTO pgpool_limit_ticks (kind, slot, used_at) "
                     "SELECT 'wide', s, CASE WHEN s <= 130 THEN now() - interval '10 seconds' "
                     "ELSE '-infinity' END FROM generate_series(1, 200) AS s")
        conn.execute("INSERT INTO pgpool_limit_ticks (kind, scope, slot, used_at) "
                     "VALUES ('small', 'tenant:a', 1, now()), ('small', 'tenant:a', 2, "
                     "'-infinity'), ('small', 'tenant:a', 3, '-infinity')")
        assert pgpool.migrate(conn) == after(version)
        rows = conn.execute("SELECT kind, count(*), sum(n), max(slot), "
                            "count(*) FILTER (WHERE isfinite(used_at)) "
                            "FROM pgpool_limit_ticks GROUP BY kind ORDER BY kind").fetchall()
        # The 130 jobs of the window in progress still count (each folded row holds the
        # jobs of its old rows); a ring of 64 or fewer rows is as it was.
        assert rows == [("small", 3, 3, 3, 1), ("wide", 64, 130, 64, 64)]
        # New rows stand for no job.
        conn.execute("INSERT INTO pgpool_limit_ticks (kind, slot) VALUES ('new', 1)")
        assert conn.execute("SELECT n FROM pgpool_limit_ticks WHERE kind = 'new'"
                            ).fetchone() == (0,)


# --- the migrations' files (pgpool/db/migrations) -----------------------------------------

#: What migrations 1 to 19 applied when they were Python strings in schema.py: a digest of
#: each one's description, drain and SQL, its lines stripped (the files are dedented). The
#: SQL a database has applied must not change: a fix is a new migration.
SHIPPED = {
    1: "fd90bef53da652bf", 2: "e489a26aa6bba441", 3: "198fecf6d2132705",
    4: "5ee9dd709c80c7e3", 5: "7bc8aba7ac579300", 6: "e53721fa942cbd92",
    7: "6e3f6608a8687d1e", 8: "76d64089317456a8", 9: "178b460acbb8cd92",
    10: "a4d959d0e192892e", 11: "314ba19a469d2f96", 12: "b814f9c0c48b883c",
    13: "56de819d1a7d819a", 14: "8f01068a4a08facd", 15: "3f427ee908fe2e7a",
    16: "b0a752eb769e903b", 17: "02b4cb618590c1bc", 18: "567ac7446286c90a",
    19: "34d78ef37c11cfac",
}


def test_the_shipped_migrations_are_as_they_shipped():
    def digest(m: schema.Migration) -> str:
        sql = "\n".join(line.strip() for line in m.ddl.splitlines() if line.strip())
        return hashlib.sha256(f"{m.description}\n{m.drain}\n{sql}".encode()).hexdigest()[:16]

    assert {m.version: digest(m) for m in schema.MIGRATIONS[:len(SHIPPED)]} == SHIPPED


def test_importing_pgpool_reads_no_migration_until_one_is_needed():
    # Every worker imports pgpool: reading the files (importlib.resources and 19 files) is
    # left to the first use.
    script = ("import sys, pgpool; from pgpool.db import schema; "
              "print('MIGRATIONS' in vars(schema), 'pgpool.db.migrations' in sys.modules); "
              "print(pgpool.SCHEMA_VERSION, len(schema.MIGRATIONS))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split("\n") == ["False False", f"{ALL[-1]} {len(ALL)}", ""]


def write_migrations(folder: Path, files: dict[str, str | bytes]) -> Path:
    for name, text in files.items():
        (folder / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return folder


FIRST = "-- description: a table\n\nCREATE TABLE t (id int);\n"


def test_a_migration_file_is_its_version_header_and_sql(tmp_path):
    second = ("-- description: an index, and a column whose description runs\n"
              "--   over two lines\n"
              "-- drain: holds t\n"
              "\n"
              "-- The SQL's own comment.\n"
              "CREATE INDEX t_id ON t (id);\n\n")
    folder = write_migrations(tmp_path, {"0002_index.sql": second, "0001_table.sql": FIRST,
                                         "__init__.py": "", "README": "not a migration"})
    assert schema.read_migrations(folder) == (
        schema.Migration(1, "a table", "CREATE TABLE t (id int);"),
        schema.Migration(2, "an index, and a column whose description runs over two lines",
                         "-- The SQL's own comment.\nCREATE INDEX t_id ON t (id);",
                         "holds t"))


@pytest.mark.parametrize(("files", "culprit", "says"), [
    ({}, "", "migrations are missing from"),
    ({"1_table.sql": FIRST}, "1_table.sql", "is misnamed: name it NNNN_what_it_does.sql"),
    ({"0001_Table.sql": FIRST}, "0001_Table.sql", "is misnamed"),
    ({"0001_a.sql": FIRST, "0001_b.sql": FIRST}, "0001_b.sql", "has the version of 0001_a.sql"),
    ({"0000_a.sql": FIRST}, "0000_a.sql", "is numbered 0"),
    ({"0001_a.sql": "CREATE TABLE t (id int);\n"}, "0001_a.sql", "has no description"),
    ({"0001_a.sql": "-- drain: t\n\nSELECT 1;\n"}, "0001_a.sql", "has no description"),
    ({"0001_a.sql": "-- description: a\n-- draining: t\n\nSELECT 1;\n"}, "0001_a.sql",
     "line 2: an unknown field `draining`"),
    ({"0001_a.sql": "-- description: a\n-- description: b\n\nSELECT 1;\n"}, "0001_a.sql",
     "line 2: a second `description`"),
    ({"0001_a.sql": "-- description: a\n-- The SQL's comment.\nSELECT 1;\n"}, "0001_a.sql",
     "line 2 is neither a field of its header"),
    ({"0001_a.sql": "-- description: a\n\n"}, "0001_a.sql", "holds no SQL"),
    ({"0001_a.sql": b"-- description: caf\xe9\n\nSELECT 1;\n"}, "0001_a.sql", "not UTF-8"),
], ids=["empty", "unnumbered", "capitals", "twice", "zero", "no-header", "no-description",
        "unknown-field", "repeated-field", "no-blank-line", "no-sql", "not-utf8"])
def test_a_malformed_migration_is_one_line_naming_its_file(tmp_path, files, culprit, says):
    folder = write_migrations(tmp_path, files)
    with pytest.raises(pgpool.SchemaError) as caught:
        schema.read_migrations(folder)
    message = str(caught.value)
    assert str(folder / culprit) in message and says in message and "\n" not in message
