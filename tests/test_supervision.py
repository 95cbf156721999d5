"""Supervision: a dispatcher's parts that die are noticed, and so are its processes.

Real dispatchers (`pgpool run`) against the real database; a part is made to fail through
the database itself (a trigger), never by replacing code.
"""

from __future__ import annotations

from conftest import RUN, one, read_records, start_pgpool, wait_until

import pgpool


def test_a_part_that_fails_unexpectedly_stops_the_host_loudly_after_a_drain(
        db, dsn, record_dir):
    # A trigger that skips every update of pgpool_hosts: the host registry's upsert then
    # returns no row, and its beat raises TypeError, a failure it does not expect (it
    # rides out database errors only). Installed once the host is up and its job runs.
    job_id = pgpool.enqueue(db, "record", {"sleep": 3})
    p = start_pgpool(dsn, *RUN, "--procs", "1", "--lease", "3", record_dir=record_dir)
    wait_until(lambda: any(r[3] == "start" for r in read_records(record_dir)),
               "the job to start")
    db.execute("""
        CREATE FUNCTION skip_update() RETURNS trigger LANGUAGE plpgsql
        AS $$ BEGIN RETURN NULL; END $$;
        CREATE TRIGGER skip_update BEFORE UPDATE ON pgpool_hosts
        FOR EACH ROW EXECUTE FUNCTION skip_update();
    """)
    # The registry beats every lease/3 = 1 s; 30 s is a generous bound on a loaded machine.
    failed = p.event("part_failed", timeout=30)
    assert failed["part"] == "host registry" and failed["error"] == "TypeError"
    assert "hosts.py" in failed["message"]
    # It drains: the running job finishes and is acked, then the host exits non-zero.
    assert p.wait(60) == 1
    assert [r[3] for r in read_records(record_dir)] == ["start", "end"]
    assert one(db, "SELECT count(*) FROM pgpool_jobs WHERE id = %s", job_id) == (0,)
    assert p.events("finished"), p.stderr
