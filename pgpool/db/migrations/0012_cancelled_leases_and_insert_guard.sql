-- description: cancelled attempts keep their row until their lease ends; new jobs only as a
--   producer writes them

-- A role that is not the table's owner inserts jobs only as a producer does, ready
-- or scheduled (`pgpool grants` gives it only the producer's columns): a running,
-- done or parked row written by hand would hold its keys with no lease for the
-- reaper to end. The WHEN clause is evaluated without calling the function, so an
-- ordinary enqueue pays nothing for it; AFTER, not BEFORE: a BEFORE row trigger
-- would make COPY (enqueue_many) insert row by row. OR REPLACE: dropping the tables
-- leaves the function behind, and a new installation here must not fail on it.
CREATE OR REPLACE FUNCTION pgpool_jobs_refuse_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_has_role((SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'USAGE') THEN
        RETURN NULL;  -- the owner repairs by hand
    END IF;
    RAISE EXCEPTION 'pgpool: a new job must be ready or scheduled, not %', NEW.state
        USING ERRCODE = 'check_violation',
              HINT = 'enqueue jobs with pgpool.enqueue; only pgpool run changes them';
END
$$;
CREATE TRIGGER pgpool_jobs_insert_state AFTER INSERT ON pgpool_jobs FOR EACH ROW
    WHEN (NEW.state NOT IN ('ready', 'scheduled'))
    EXECUTE FUNCTION pgpool_jobs_refuse_insert();
-- Hosts no longer poll the latest cancellation (see sql.CONTROL_POLL).
DROP INDEX pgpool_dead_cancelled;
COMMENT ON COLUMN pgpool_jobs.locked_by IS
    'the dispatcher running it (with attempts, the ownership token of the attempt); '
    'NULL on a running job: cancelled (pgpool cancel), kept until its lease ends '
    '(its attempt may run until then, holding its keys), then dead-lettered by the '
    'reaper';
