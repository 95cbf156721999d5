"""Versioned, idempotent schema migrations.

`migrate` applies the migrations the database lacks, in order, inside one transaction that
holds an advisory lock, so several hosts may run it at once: the first applies, the others
wait and then find nothing to do. The applied version is recorded in ``pgpool_schema_version``;
`check` is what ``pgpool run``, ``enqueue`` and ``status`` use to refuse a missing, older or
newer schema.

Where: pgpool is installed in the schema holding ``pgpool_schema_version`` that
``search_path`` leads to (`locate`), which need not be the first schema on the path (the
default ``"$user", public`` finds ``public`` even once a schema named after the role
exists). `migrate` runs its DDL there, explicitly, and everyone refuses a path on which two
installations, or a same-named table ahead of pgpool's, would mix. A migration waits at most
`LOCK_TIMEOUT` for each lock, so the heartbeats queued behind it are held up no longer, and
tries again later. Once it has its locks, a migration that works through a table's rows
holds that table for as long as that takes: those say so (`Migration.drain`), and
``pgpool migrate`` names them before it starts, since the fleet should be stopped for them.

Physical choices come from the field reports in ``shared/seeds``: the ready-job index is
partial (it stays as small as the backlog, not the table); nothing that a heartbeat touches
(``lease_until``) is indexed, so lease extensions stay HOT updates; fillfactor 80 leaves room
on each page for those updates; autovacuum is made aggressive on the one high-churn table.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from ..errors import SchemaError
from ..logs import event
from ..sql import install as sql
from .outage import backoff

if TYPE_CHECKING:  # imported by `pgpool` itself, so workers too: see pgpool.enqueue
    import psycopg


class Migration(NamedTuple):
    version: int
    description: str
    ddl: str
    #: Set for a migration that holds a table the fleet writes for as long as it works
    #: through that table's rows: what it holds, which `pgpool migrate` says before it
    #: starts (the fleet should be stopped for it). None: catalog changes only.
    drain: str | None = None


MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        1,
        "jobs, dead letters",
        """
        CREATE TABLE pgpool_jobs (
            id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            queue        text        NOT NULL DEFAULT 'default',
            kind         text        NOT NULL,
            payload      jsonb       NOT NULL,
            priority     integer     NOT NULL DEFAULT 0,
            run_at       timestamptz NOT NULL DEFAULT now(),
            state        text        NOT NULL DEFAULT 'ready'
                                     CHECK (state IN ('ready', 'running')),
            attempts     integer     NOT NULL DEFAULT 0,
            max_attempts integer     CHECK (max_attempts > 0),
            unique_key   text,
            locked_by    text,
            lease_until  timestamptz,
            claimed_at   timestamptz,
            last_error   text,
            created_at   timestamptz NOT NULL DEFAULT now()
        ) WITH (
            fillfactor = 80,
            autovacuum_vacuum_scale_factor = 0.02,
            autovacuum_vacuum_insert_scale_factor = 0.02,
            autovacuum_vacuum_cost_delay = 0
        );
        COMMENT ON TABLE pgpool_jobs IS
            'pgpool live jobs: state ready or running. Succeeded jobs are deleted.';
        CREATE INDEX pgpool_jobs_ready ON pgpool_jobs (queue, priority DESC, run_at, id)
            WHERE state = 'ready';
        CREATE INDEX pgpool_jobs_running ON pgpool_jobs (locked_by)
            WHERE state = 'running';
        CREATE UNIQUE INDEX pgpool_jobs_unique ON pgpool_jobs (kind, unique_key)
            WHERE unique_key IS NOT NULL;

        CREATE TABLE pgpool_dead (
            id           bigint      PRIMARY KEY,
            queue        text        NOT NULL,
            kind         text        NOT NULL,
            payload      jsonb       NOT NULL,
            priority     integer     NOT NULL,
            attempts     integer     NOT NULL,
            max_attempts integer,
            unique_key   text,
            last_error   text,
            created_at   timestamptz NOT NULL,
            died_at      timestamptz NOT NULL DEFAULT now()
        );
        COMMENT ON TABLE pgpool_dead IS
            'pgpool dead letters: jobs that failed max_attempts times, with the last error.';
        CREATE INDEX pgpool_dead_kind ON pgpool_dead (kind, died_at);
        """,
    ),
    Migration(
        2,
        "host registry",
        """
        CREATE TABLE pgpool_hosts (
            owner       text        PRIMARY KEY,
            hostname    text        NOT NULL,
            pid         integer     NOT NULL,
            procs       integer     NOT NULL,
            queues      text[]      NOT NULL,
            kinds       text[]      NOT NULL,
            lease       float8      NOT NULL CHECK (lease > 0),
            started_at  timestamptz NOT NULL DEFAULT now(),
            last_seen   timestamptz NOT NULL DEFAULT now(),
            jobs_done   bigint      NOT NULL DEFAULT 0,
            jobs_failed bigint      NOT NULL DEFAULT 0
        );
        COMMENT ON TABLE pgpool_hosts IS
            'pgpool dispatchers: one row per running dispatcher (owner = locked_by of its '
            'jobs), beaten every lease/3, deleted on clean exit, pruned once stale.';
        """,
    ),
    Migration(
        3,
        "claims per host against the fleet budget",
        """
        ALTER TABLE pgpool_hosts
            ADD COLUMN jobs_claimed       bigint NOT NULL DEFAULT 0,
            ADD COLUMN claims_per_sec     float8,
            ADD COLUMN max_claims_per_sec float8 CHECK (max_claims_per_sec > 0);
        COMMENT ON COLUMN pgpool_hosts.jobs_claimed IS
            'jobs this dispatcher claimed (moved to running) since it started';
        COMMENT ON COLUMN pgpool_hosts.claims_per_sec IS
            'jobs claimed per second between its last two beats; NULL before a second beat';
        COMMENT ON COLUMN pgpool_hosts.max_claims_per_sec IS
            'the fleet budget it runs with (--max-claims-per-sec), shared by the live hosts; '
            'NULL if written by a pgpool older than schema version 3';
        """,
    ),
    Migration(
        4,
        "attempts that do not count: interrupted by shutdown, or never started",
        """
        ALTER TABLE pgpool_jobs
            ADD COLUMN interruptions integer NOT NULL DEFAULT 0,
            ADD COLUMN started       boolean NOT NULL DEFAULT false;
        ALTER TABLE pgpool_dead
            ADD COLUMN interruptions integer NOT NULL DEFAULT 0;
        COMMENT ON COLUMN pgpool_jobs.attempts IS
            'claims so far (the ownership token with locked_by); the job has used '
            'attempts - interruptions of its max_attempts';
        COMMENT ON COLUMN pgpool_jobs.interruptions IS
            'claims not counted against max_attempts: cut off by a dispatcher''s shutdown, '
            'or reaped before they started; at most pgpool.retry.FREE_INTERRUPTIONS';
        COMMENT ON COLUMN pgpool_jobs.started IS
            'the current attempt started in a worker, as last recorded by a heartbeat';
        """,
    ),
    Migration(
        5,
        "parked jobs, and succeeded jobs kept because they could not be deleted",
        """
        -- NOT VALID: the new check only widens the old one, which every row satisfies, so
        -- scanning the table under this ACCESS EXCLUSIVE lock would prove nothing.
        ALTER TABLE pgpool_jobs
            DROP CONSTRAINT pgpool_jobs_state_check,
            ADD CONSTRAINT pgpool_jobs_state_check
                CHECK (state IN ('ready', 'running', 'done', 'parked')) NOT VALID;
        COMMENT ON TABLE pgpool_jobs IS
            'pgpool jobs: state ready or running; succeeded jobs are deleted, except those '
            'the database refused to delete (kept as done), and jobs whose ack or reap the '
            'database refused are parked; last_error says why. Neither is claimed again.';
        COMMENT ON COLUMN pgpool_jobs.state IS
            'ready, running, done (succeeded, could not be deleted), parked (its ack or '
            'reap was refused; set it to ready to run it again)';
        """,
    ),
    Migration(
        6,
        "operator steering: paused queues, cancelled jobs, dead-letter retention",
        """
        CREATE TABLE pgpool_paused (
            queue     text        PRIMARY KEY,
            paused_at timestamptz NOT NULL DEFAULT now()
        );
        COMMENT ON TABLE pgpool_paused IS
            'pgpool queues paused by an operator (pgpool pause): no host claims from them '
            'until pgpool resume deletes the row; running jobs finish.';
        ALTER TABLE pgpool_dead ADD COLUMN reason text NOT NULL DEFAULT 'failed';
        COMMENT ON COLUMN pgpool_dead.reason IS
            'why the job is here: failed (its last attempt failed or its lease expired) or '
            'cancelled (pgpool cancel; last_error says when and what it was doing)';
        -- Retention and purges delete the oldest first, in bounded batches.
        CREATE INDEX pgpool_dead_died ON pgpool_dead (died_at);
        -- Every host polls the latest cancellation: a few rows, however big the table.
        CREATE INDEX pgpool_dead_cancelled ON pgpool_dead (died_at) WHERE reason = 'cancelled';
        """,
        "builds two indexes on pgpool_dead holding it locked against writes: every ack "
        "and reaper pass (their statements write dead letters) waits for as long as that "
        "takes, which grows with pgpool_dead",
    ),
    Migration(
        7,
        "the fleet's claim budget in one row, shared by demand",
        """
        CREATE TABLE pgpool_fleet (
            singleton          boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
            max_claims_per_sec float8      CHECK (max_claims_per_sec > 0
                                                  AND max_claims_per_sec < 'Infinity'),
            updated_at         timestamptz NOT NULL DEFAULT now()
        );
        COMMENT ON TABLE pgpool_fleet IS
            'pgpool fleet settings: one row. max_claims_per_sec is the claims/s budget the '
            'hosts share (set with pgpool budget set); NULL: each host''s '
            '--max-claims-per-sec.';
        INSERT INTO pgpool_fleet DEFAULT VALUES;
        ALTER TABLE pgpool_hosts
            ADD COLUMN claims_share  float8 CHECK (claims_share >= 0),
            ADD COLUMN claims_demand float8 CHECK (claims_demand >= 0);
        COMMENT ON COLUMN pgpool_hosts.claims_share IS
            'claims/s of the fleet budget this host applies, set at its last beat';
        COMMENT ON COLUMN pgpool_hosts.claims_demand IS
            'claims/s it asked for at its last beat; Infinity when its share held it back';
        """,
    ),
    Migration(
        8,
        "claim round trips per host, for pgpool status",
        """
        ALTER TABLE pgpool_hosts ADD COLUMN claim_p99_ms float8;
        COMMENT ON COLUMN pgpool_hosts.claim_p99_ms IS
            '99th percentile of its recent claim round trips, ms, at its last beat '
            '(NULL before its first claim)';
        """,
    ),
    Migration(
        9,
        "scheduled jobs out of the ready index, which is per (queue, kind, tenant); tenants "
        "and concurrency keys",
        """
        -- NOT VALID, as in migration 5: the new check only widens the old one.
        ALTER TABLE pgpool_jobs
            DROP CONSTRAINT pgpool_jobs_state_check,
            ADD CONSTRAINT pgpool_jobs_state_check
                CHECK (state IN ('ready', 'scheduled', 'running', 'done', 'parked')) NOT VALID;
        -- '' is the group of jobs without a tenant: NOT NULL keeps the claim's loose index
        -- scan over tenants simple (NULLs never compare). COLLATE "C": byte order, cheap.
        ALTER TABLE pgpool_jobs
            ADD COLUMN tenant          text COLLATE "C" NOT NULL DEFAULT '',
            ADD COLUMN concurrency_key text;
        ALTER TABLE pgpool_dead
            ADD COLUMN tenant          text COLLATE "C" NOT NULL DEFAULT '',
            ADD COLUMN concurrency_key text;
        -- The old index goes first, so the conversion does not maintain it.
        DROP INDEX pgpool_jobs_ready;
        UPDATE pgpool_jobs SET state = 'scheduled' WHERE state = 'ready' AND run_at > now();
        -- Per (queue, kind, tenant): a claim reads only the kinds it serves, walks the
        -- distinct tenants of each (queue, kind) with a loose index scan and reads each
        -- tenant's jobs in claim order. Jobs without a tenant are one group.
        CREATE INDEX pgpool_jobs_ready
            ON pgpool_jobs (queue, kind, tenant, priority DESC, run_at, id)
            WHERE state = 'ready';
        -- The stager reads the jobs that fall due in order; nothing a heartbeat changes.
        CREATE INDEX pgpool_jobs_scheduled ON pgpool_jobs (run_at) WHERE state = 'scheduled';
        -- The hard guarantee of concurrency_key: two claims racing for one key cannot both
        -- commit. Neither column changes on a heartbeat, so heartbeats stay HOT.
        CREATE UNIQUE INDEX pgpool_jobs_key_running ON pgpool_jobs (concurrency_key)
            WHERE state = 'running' AND concurrency_key IS NOT NULL;
        -- Counts a tenant's running jobs for --tenant-cap (reads at most the cap's worth).
        CREATE INDEX pgpool_jobs_tenant_running ON pgpool_jobs (tenant)
            WHERE state = 'running' AND tenant <> '';
        COMMENT ON COLUMN pgpool_jobs.state IS
            'ready (due), scheduled (run_at in the future: delayed, or waiting out a retry''s '
            'backoff; the stager makes it ready when due), running, done (succeeded, could '
            'not be deleted), parked (its ack or reap was refused; set it to ready to run it '
            'again)';
        COMMENT ON COLUMN pgpool_jobs.tenant IS
            'fairness group set at enqueue ('''' = no tenant, one group): claims interleave '
            'tenants round-robin; pgpool run --tenant-cap caps each one''s running jobs';
        COMMENT ON COLUMN pgpool_jobs.concurrency_key IS
            'at most one running job per key across the fleet (pgpool_jobs_key_running)';
        """,
        "holds pgpool_jobs exclusively while it moves the waiting jobs to the scheduled "
        "state and builds four indexes: every claim, heartbeat and ack waits for as long "
        "as that takes (15 s for a million jobs), and hosts abandon their jobs after 0.8 "
        "of a lease without a heartbeat",
    ),
    Migration(
        10,
        "periodic jobs: one row per schedule, the fleet's memory of its ticks",
        """
        CREATE TABLE pgpool_schedules (
            name           text        PRIMARY KEY,
            cron           text        NOT NULL,
            timezone       text        NOT NULL,
            kind           text        NOT NULL,
            queue          text        NOT NULL,
            catch_up       integer     NOT NULL CHECK (catch_up > 0),
            last_tick      timestamptz NOT NULL,
            last_run       timestamptz,
            last_run_at    timestamptz,
            declared_by    text,
            declared_until timestamptz NOT NULL,
            created_at     timestamptz NOT NULL DEFAULT now()
        );
        COMMENT ON TABLE pgpool_schedules IS
            'pgpool periodic jobs (pgpool.schedules), one row per schedule name, kept while '
            'no host declares it (not declared: nothing enqueues it; delete the row to '
            'forget it). Each tick is enqueued in the transaction that moves last_tick.';
        COMMENT ON COLUMN pgpool_schedules.last_tick IS
            'every tick up to this time is handled (enqueued, or skipped by the catch-up '
            'rule); moved only forward, by a compare-and-set';
        COMMENT ON COLUMN pgpool_schedules.last_run IS
            'the latest tick enqueued (NULL: none yet); last_run_at: when';
        COMMENT ON COLUMN pgpool_schedules.declared_until IS
            'a host declared it (declared_by, its owner) in its code until this time; '
            'hosts declaring it refresh it every beat interval';
        """,
    ),
    Migration(
        11,
        "the claim batch each host uses",
        """
        ALTER TABLE pgpool_hosts ADD COLUMN batch integer;
        COMMENT ON COLUMN pgpool_hosts.batch IS
            'jobs per claim at its last beat (with --batch auto, what the sizer worked out '
            'then); NULL from a pgpool older than this column';
        """,
    ),
    Migration(
        12,
        "cancelled attempts keep their row until their lease ends; new jobs only as a "
        "producer writes them",
        """
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
        """,
    ),
    Migration(
        13,
        "an index of the ready jobs that need the fair claim",
        """
        -- Holds the ready jobs with a tenant or a concurrency key, and only those: a claim
        -- looks here first (sql._NEED_FAIR), and when it finds nothing takes the plain claim,
        -- which skips the tenant walk, shares, rounds and key checks. A queue that never
        -- uses tenants or keys never writes to it.
        CREATE INDEX pgpool_jobs_ready_fair ON pgpool_jobs (queue, kind)
            WHERE state = 'ready' AND (tenant <> '' OR concurrency_key IS NOT NULL);
        """,
        "holds pgpool_jobs against writes while it reads the table once to build an index: "
        "claims, heartbeats and acks wait for as long as that takes",
    ),
    Migration(
        14,
        "snoozes: runs a handler put off (pgpool.Snooze), not counted as attempts",
        """
        -- A constant default: a catalog change, no table rewrite.
        ALTER TABLE pgpool_jobs ADD COLUMN snoozes integer NOT NULL DEFAULT 0;
        ALTER TABLE pgpool_dead ADD COLUMN snoozes integer NOT NULL DEFAULT 0;
        COMMENT ON COLUMN pgpool_jobs.attempts IS
            'claims so far (the ownership token with locked_by); the job has used '
            'attempts - interruptions - snoozes of its max_attempts';
        COMMENT ON COLUMN pgpool_jobs.snoozes IS
            'claims whose handler raised pgpool.Snooze: not counted against max_attempts; '
            'at most pgpool.retry.MAX_SNOOZES, after which a snooze counts as a failure';
        COMMENT ON COLUMN pgpool_dead.reason IS
            'why the job is here: failed (its last attempt failed, its lease expired, or its '
            'handler''s Retry does not retry the error), cancelled (pgpool cancel, or its '
            'handler raised pgpool.Cancel) or discarded (its handler raised pgpool.Discard); '
            'last_error says more';
        """,
    ),
    Migration(
        15,
        "a job's meta: the trace context it was enqueued in, kept on dead letters",
        """
        -- Nullable, no default: a catalog change, whatever the tables hold. NULL for a job
        -- enqueued outside a trace, the usual case (pgpool.tracing).
        ALTER TABLE pgpool_jobs ADD COLUMN meta jsonb;
        ALTER TABLE pgpool_dead ADD COLUMN meta jsonb;
        COMMENT ON COLUMN pgpool_jobs.meta IS
            'set at enqueue, never changed: the W3C trace context (traceparent, tracestate) '
            'of the OpenTelemetry span the job was enqueued in, which the worker''s span '
            'links to; NULL outside a trace';
        COMMENT ON COLUMN pgpool_dead.meta IS 'the job''s meta, as it was in pgpool_jobs';
        """,
    ),
    Migration(
        16,
        "pgpool_enqueue(): enqueue from SQL, another language or a trigger",
        r"""
        -- pgpool.enqueue in SQL: the same checks, the same row and the same wake-up as
        -- sql.jobs.ENQUEUE (keep them in step). SECURITY INVOKER: it runs with the caller's
        -- privileges, so it can do nothing the caller's INSERT grant on pgpool_jobs does not
        -- allow (`pgpool grants` gives the application role both); a DEFINER function would
        -- run as the tables' owner and make EXECUTE alone enough to enqueue. Its search_path
        -- is set below to this schema, so it finds its tables from any caller's path. The
        -- parameters share the columns' names (callers name them), so every reference to a
        -- parameter inside a statement is qualified with the function's name.
        CREATE OR REPLACE FUNCTION pgpool_enqueue(
            kind text,
            payload jsonb,
            queue text DEFAULT 'default',
            priority integer DEFAULT 0,
            run_at timestamptz DEFAULT NULL,
            delay interval DEFAULT NULL,
            unique_key text DEFAULT NULL,
            max_attempts integer DEFAULT NULL,
            tenant text DEFAULT NULL,
            concurrency_key text DEFAULT NULL
        ) RETURNS bigint
        LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
        #variable_conflict use_column
        DECLARE
            names constant text := 'use 1-128 characters from letters, digits and _ . : / -, '
                                   'starting with a letter, digit or _';
            named text[];  -- (what, its value): the kind, then the queue
            size integer;
            due timestamptz;
            new_id bigint;
            new_state text;
            new_table oid;
        BEGIN
            -- A bad name is shown as a JSON string: quoted, one line, cut at 60 characters.
            FOREACH named SLICE 1 IN ARRAY
                    ARRAY[['kind', pgpool_enqueue.kind], ['queue', pgpool_enqueue.queue]] LOOP
                IF named[2] IS NULL
                   OR named[2] !~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,127}$' THEN
                    RAISE EXCEPTION 'pgpool_enqueue: invalid % %', named[1],
                        coalesce(to_jsonb(left(named[2], 60))::text, 'NULL')
                        USING ERRCODE = 'invalid_parameter_value', HINT = names;
                END IF;
            END LOOP;
            IF jsonb_typeof(pgpool_enqueue.payload) IS DISTINCT FROM 'object' THEN
                RAISE EXCEPTION 'pgpool_enqueue: payload must be a JSON object, not %',
                    coalesce(jsonb_typeof(pgpool_enqueue.payload), 'NULL')
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'wrap the value, e.g. {"items": [...]}';
            END IF;
            size := octet_length(pgpool_enqueue.payload::text);
            IF size > 1048576 THEN
                RAISE EXCEPTION 'pgpool_enqueue: payload is % bytes (as jsonb text), over the '
                                '1048576-byte limit', size
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'store large data elsewhere and pass a reference';
            END IF;
            -- Deeper than 254 levels (the payload itself is level 1): the workers' JSON
            -- encoder (orjson) refuses it. Only a payload this long can be so deep.
            IF size > 2 * 254 AND jsonb_path_exists(pgpool_enqueue.payload,
                    'strict $.**{254} ? (@.type() == "object" || @.type() == "array")') THEN
                RAISE EXCEPTION 'pgpool_enqueue: payload is nested more than 254 levels deep '
                                '(objects and arrays within each other)'
                    USING ERRCODE = 'invalid_parameter_value', HINT = 'flatten it';
            END IF;
            IF pgpool_enqueue.priority IS NULL OR pgpool_enqueue.priority = -2147483648 THEN
                RAISE EXCEPTION 'pgpool_enqueue: priority must be an integer within '
                                '±2147483647, got %',
                    coalesce(pgpool_enqueue.priority::text, 'NULL')
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'higher runs first; 0 is the default';
            END IF;
            IF pgpool_enqueue.run_at IS NOT NULL AND pgpool_enqueue.delay IS NOT NULL THEN
                RAISE EXCEPTION 'pgpool_enqueue: pass either run_at or delay, not both'
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'run_at is a time, delay an interval from now';
            END IF;
            IF NOT isfinite(pgpool_enqueue.run_at) THEN
                RAISE EXCEPTION 'pgpool_enqueue: run_at must be a finite time, got %',
                    pgpool_enqueue.run_at
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'e.g. now() + interval ''5 minutes''';
            END IF;
            IF NOT extract(epoch FROM pgpool_enqueue.delay) BETWEEN 0 AND 3162240000 THEN
                RAISE EXCEPTION 'pgpool_enqueue: delay must be from 0 to 100 years, got %',
                    pgpool_enqueue.delay
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'e.g. interval ''5 minutes''';
            END IF;
            IF pgpool_enqueue.unique_key = '' THEN
                RAISE EXCEPTION 'pgpool_enqueue: unique_key must be NULL or a non-empty string'
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'pass NULL for a job without a key';
            END IF;
            IF pgpool_enqueue.max_attempts <= 0 THEN
                RAISE EXCEPTION 'pgpool_enqueue: max_attempts must be a positive integer, '
                                'got %', pgpool_enqueue.max_attempts
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'pass NULL for the handler''s own limit';
            END IF;
            IF pgpool_enqueue.tenant = '' OR length(pgpool_enqueue.tenant) > 200 THEN
                RAISE EXCEPTION 'pgpool_enqueue: tenant must be NULL or a non-empty string of '
                                'at most 200 characters, got % characters',
                    length(pgpool_enqueue.tenant)
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'pass NULL for a job without a tenant';
            END IF;
            IF pgpool_enqueue.concurrency_key = ''
               OR length(pgpool_enqueue.concurrency_key) > 200 THEN
                RAISE EXCEPTION 'pgpool_enqueue: concurrency_key must be NULL or a non-empty '
                                'string of at most 200 characters, got % characters',
                    length(pgpool_enqueue.concurrency_key)
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'pass NULL for a job without a concurrency key';
            END IF;
            due := coalesce(pgpool_enqueue.run_at, now() + pgpool_enqueue.delay, now());
            INSERT INTO pgpool_jobs (queue, kind, payload, priority, run_at, state,
                                     max_attempts, unique_key, tenant, concurrency_key)
            VALUES (pgpool_enqueue.queue, pgpool_enqueue.kind, pgpool_enqueue.payload,
                    pgpool_enqueue.priority, due,
                    CASE WHEN due <= now() THEN 'ready' ELSE 'scheduled' END,
                    pgpool_enqueue.max_attempts, pgpool_enqueue.unique_key,
                    coalesce(pgpool_enqueue.tenant, ''), pgpool_enqueue.concurrency_key)
            ON CONFLICT (kind, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
            RETURNING id, state, tableoid INTO new_id, new_state, new_table;
            IF new_id IS NULL THEN
                RETURN NULL;  -- a live job of this kind holds the unique key
            END IF;
            -- The channel of common.CHANNEL_OF, the payload of sql.jobs.ENQUEUE.
            PERFORM pg_notify(
                (SELECT CASE WHEN n.nspname = 'public' THEN 'pgpool'
                             WHEN octet_length(n.nspname) <= 56 THEN 'pgpool.' || n.nspname
                             ELSE 'pgpool.' || md5(n.nspname) END
                 FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
                 WHERE c.oid = new_table),
                CASE WHEN new_state = 'ready' THEN pgpool_enqueue.queue ELSE '!stage' END);
            RETURN new_id;
        END
        $$;
        -- This schema, whatever the caller's search_path (pg_temp named last: a temporary
        -- table cannot stand in for pgpool_jobs).
        DO $$ BEGIN
            EXECUTE format('ALTER FUNCTION pgpool_enqueue(text, jsonb, text, integer, '
                           'timestamptz, interval, text, integer, text, text) '
                           'SET search_path = %I, pg_temp', current_schema());
        END $$;
        -- PostgreSQL lets everyone execute a new function: only the roles `pgpool grants`
        -- names may.
        REVOKE ALL ON FUNCTION pgpool_enqueue(text, jsonb, text, integer, timestamptz,
            interval, text, integer, text, text) FROM PUBLIC;
        COMMENT ON FUNCTION pgpool_enqueue(text, jsonb, text, integer, timestamptz, interval,
            text, integer, text, text) IS
            'enqueue one job in the current transaction, as pgpool.enqueue does; returns its '
            'id, or NULL when a live job of the kind holds unique_key';
        """,
    ),
    Migration(
        17,
        "outcomes: finished jobs kept with their results (pgpool_done); groups of jobs "
        "with a callback (pgpool_groups, group_id, the 'waiting' state)",
        """
        -- Jobs that succeeded, kept for a while when their kind or host keeps outcomes
        -- (keep=, --keep-done) and always for members of a group: written by the ack that
        -- deletes the job (sql.jobs.ACK_OUTCOMES), pruned past keep_until by the hosts'
        -- retention, one host at a time.
        CREATE TABLE pgpool_done (
            id          bigint      PRIMARY KEY,
            queue       text        NOT NULL,
            kind        text        NOT NULL,
            tenant      text        COLLATE "C" NOT NULL DEFAULT '',
            attempts    integer     NOT NULL,
            created_at  timestamptz NOT NULL,
            finished_at timestamptz NOT NULL DEFAULT now(),
            keep_until  timestamptz NOT NULL,
            result      jsonb,
            group_id    bigint
        );
        CREATE INDEX pgpool_done_keep_until ON pgpool_done (keep_until);
        CREATE INDEX pgpool_done_group ON pgpool_done (group_id) WHERE group_id IS NOT NULL;
        CREATE INDEX pgpool_done_kind ON pgpool_done (kind, finished_at);
        COMMENT ON TABLE pgpool_done IS
            'jobs that succeeded, kept until keep_until (keep=, --keep-done, groups)';
        COMMENT ON COLUMN pgpool_done.result IS
            'what the handler returned, as JSON (NULL: it returned None)';

        -- A group: members (jobs whose group_id is the group's id) and a callback, the job
        -- whose id is the group's, waiting until every member has finished. The acks that
        -- finish members count them here, in their own transaction; the one that counts
        -- the last makes the callback ready.
        CREATE TABLE pgpool_groups (
            id           bigint      PRIMARY KEY,
            total        integer     NOT NULL CHECK (total >= 0),
            done         integer     NOT NULL DEFAULT 0,
            dead         integer     NOT NULL DEFAULT 0,
            created_at   timestamptz NOT NULL DEFAULT now(),
            completed_at timestamptz
        );
        COMMENT ON TABLE pgpool_groups IS
            'groups of jobs (pgpool.group): id is the callback job''s, done + dead of total '
            'members finished; completed_at when the last one did and the callback was made '
            'ready';
        ALTER TABLE pgpool_jobs ADD COLUMN group_id bigint;
        ALTER TABLE pgpool_dead ADD COLUMN group_id bigint;
        CREATE INDEX pgpool_dead_group ON pgpool_dead (group_id) WHERE group_id IS NOT NULL;
        COMMENT ON COLUMN pgpool_jobs.group_id IS
            'the group (pgpool_groups.id, its callback job''s id) this job is a member of';
        -- 'waiting': a group's callback until its members have finished (never claimed).
        ALTER TABLE pgpool_jobs
            DROP CONSTRAINT pgpool_jobs_state_check,
            ADD CONSTRAINT pgpool_jobs_state_check
                CHECK (state IN ('ready', 'scheduled', 'running', 'done', 'parked',
                                 'waiting')) NOT VALID;
        -- A producer may insert a waiting callback (pgpool.group), without a unique key: it
        -- holds no lease, and no key it could keep forever.
        DROP TRIGGER pgpool_jobs_insert_state ON pgpool_jobs;
        CREATE TRIGGER pgpool_jobs_insert_state AFTER INSERT ON pgpool_jobs FOR EACH ROW
            WHEN (NEW.state NOT IN ('ready', 'scheduled')
                  AND NOT (NEW.state = 'waiting' AND NEW.unique_key IS NULL))
            EXECUTE FUNCTION pgpool_jobs_refuse_insert();
        """,
    ),
    Migration(
        18,
        "pgpool's functions immune to the caller's search_path; groups made only by "
        "pgpool_enqueue_group; the payload limit of pgpool_enqueue as pgpool.enqueue's",
        r"""
        -- Every function pgpool installs runs with search_path pg_catalog, this schema,
        -- pg_temp (set at the end), and calls pg_catalog's functions qualified: a
        -- temporary table or view named after a catalog, a session's search_path, or an
        -- overload planted in a schema the caller can write changes nothing they do
        -- (pg_temp is searched last only when listed so).

        -- The insert guard. A role that is not the tables' owner inserts jobs only as a
        -- producer does: ready or scheduled, and in no group (pgpool_enqueue_group, run as
        -- the owner, writes group_id). The WHEN clause is evaluated without calling the
        -- function, so an ordinary enqueue pays nothing for it.
        CREATE OR REPLACE FUNCTION pgpool_jobs_refuse_insert() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF pg_catalog.pg_has_role(
                   (SELECT c.relowner FROM pg_catalog.pg_class AS c WHERE c.oid = TG_RELID),
                   'USAGE') THEN
                RETURN NULL;  -- the owner repairs by hand
            END IF;
            IF NEW.state NOT IN ('ready', 'scheduled') THEN
                RAISE EXCEPTION 'pgpool: a new job must be ready or scheduled, not %',
                    NEW.state
                    USING ERRCODE = 'check_violation',
                          HINT = 'enqueue jobs with pgpool.enqueue; only pgpool run changes '
                                 'them';
            END IF;
            RAISE EXCEPTION 'pgpool: only pgpool.group puts a job in a group (group_id %)',
                NEW.group_id
                USING ERRCODE = 'check_violation',
                      HINT = 'start groups with pgpool.group or pgpool_enqueue_group()';
        END
        $$;
        DROP TRIGGER pgpool_jobs_insert_state ON pgpool_jobs;
        CREATE TRIGGER pgpool_jobs_insert_state AFTER INSERT ON pgpool_jobs FOR EACH ROW
            WHEN (NEW.state NOT IN ('ready', 'scheduled') OR NEW.group_id IS NOT NULL)
            EXECUTE FUNCTION pgpool_jobs_refuse_insert();

        -- What pgpool_enqueue and pgpool_enqueue_group check of every job: the names of
        -- its kind and queue (pgpool_check_names), and its payload (pgpool_check_payload):
        -- a JSON object of at most max_bytes (pgpool_max_payload_bytes: the setting
        -- pgpool.max_payload_bytes, 1 MiB when unset) as compact JSON, the measure of
        -- pgpool.enqueue, nested at most 254 levels. ``caller`` starts each message.
        CREATE FUNCTION pgpool_check_names(caller text, kind text, queue text)
        RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
        DECLARE
            named text[];  -- (what, its value): the kind, then the queue
        BEGIN
            -- A bad name is shown as a JSON string: quoted, one line, cut at 60 characters.
            FOREACH named SLICE 1 IN ARRAY ARRAY[['kind', kind], ['queue', queue]] LOOP
                IF named[2] IS NULL OR named[2] OPERATOR(pg_catalog.!~)
                                       '^[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,127}$' THEN
                    RAISE EXCEPTION '%: invalid % %', caller, named[1],
                        coalesce(
                            pg_catalog.to_jsonb(pg_catalog.left(named[2], 60))::text, 'NULL')
                        USING ERRCODE = 'invalid_parameter_value',
                              HINT = 'use 1-128 characters from letters, digits and '
                                     '_ . : / -, starting with a letter, digit or _';
                END IF;
            END LOOP;
        END
        $$;
        CREATE FUNCTION pgpool_max_payload_bytes(caller text) RETURNS bigint
        LANGUAGE plpgsql STABLE AS $$
        DECLARE
            setting text := pg_catalog.current_setting('pgpool.max_payload_bytes', true);
        BEGIN
            IF coalesce(setting, '') = '' THEN
                RETURN 1048576;
            END IF;
            IF setting OPERATOR(pg_catalog.!~) '^[1-9][0-9]{0,17}$' THEN
                RAISE EXCEPTION '%: the setting pgpool.max_payload_bytes is %, not a '
                                'positive number of bytes', caller,
                    pg_catalog.to_jsonb(pg_catalog.left(setting, 60))::text
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'e.g. SET pgpool.max_payload_bytes = 4194304';
            END IF;
            RETURN setting::bigint;
        END
        $$;
        CREATE FUNCTION pgpool_check_payload(caller text, payload jsonb, max_bytes bigint)
        RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
        DECLARE
            size bigint;
        BEGIN
            IF pg_catalog.jsonb_typeof(payload) IS DISTINCT FROM 'object' THEN
                RAISE EXCEPTION '%: payload must be a JSON object, not %', caller,
                    coalesce(pg_catalog.jsonb_typeof(payload), 'NULL')
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'wrap the value, e.g. {"items": [...]}';
            END IF;
            size := pg_catalog.octet_length(payload::text);
            IF size > max_bytes THEN
                -- jsonb's text form has a space after every ':' and ',' outside strings,
                -- which the compact form has not: take them off, the strings blanked
                -- first. Only a payload this long pays for it.
                SELECT size - (pg_catalog.octet_length(bare) - pg_catalog.octet_length(
                           pg_catalog.replace(pg_catalog.replace(bare, ', ', ','),
                                              ': ', ':')))
                INTO size
                FROM pg_catalog.regexp_replace(payload::text, '"(?:[^"\\]|\\.)*"', '""',
                                               'g') AS bare;
            END IF;
            IF size > max_bytes THEN
                RAISE EXCEPTION '%: payload is % bytes, over the %-byte limit', caller, size,
                    max_bytes
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'store large data elsewhere and pass a reference, or '
                                 'raise pgpool.max_payload_bytes';
            END IF;
            -- Deeper than 254 levels (the payload itself is level 1): the workers' JSON
            -- encoder (orjson) refuses it. Only a payload this long can be so deep.
            IF size > 2 * 254 AND pg_catalog.jsonb_path_exists(payload,
                    'strict $.**{254} ? (@.type() == "object" || @.type() == "array")') THEN
                RAISE EXCEPTION '%: payload is nested more than 254 levels deep (objects '
                                'and arrays within each other)', caller
                    USING ERRCODE = 'invalid_parameter_value', HINT = 'flatten it';
            END IF;
        END
        $$;

        -- The channel of common.CHANNEL_OF for this installation.
        CREATE FUNCTION pgpool_channel() RETURNS text LANGUAGE sql STABLE AS $$
            SELECT CASE WHEN n.nspname = 'public' THEN 'pgpool'
                        WHEN pg_catalog.octet_length(n.nspname) <= 56
                        THEN pg_catalog.concat('pgpool.', n.nspname)
                        ELSE pg_catalog.concat('pgpool.', pg_catalog.md5(n.nspname)) END
            FROM pg_catalog.pg_class AS c
            JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
            WHERE c.oid = 'pgpool_jobs'::pg_catalog.regclass
        $$;

        -- pgpool_enqueue (migration 16) again, its checks in pgpool_check_names and
        -- pgpool_check_payload: the payload is measured as pgpool.enqueue measures it (it
        -- was jsonb's text form, with its spaces, against a fixed 1 MiB).
        CREATE OR REPLACE FUNCTION pgpool_enqueue(
            kind text,
            payload jsonb,
            queue text DEFAULT 'default',
            priority integer DEFAULT 0,
            run_at timestamptz DEFAULT NULL,
            delay interval DEFAULT NULL,
            unique_key text DEFAULT NULL,
            max_attempts integer DEFAULT NULL,
            tenant text DEFAULT NULL,
            concurrency_key text DEFAULT NULL
        ) RETURNS bigint
        LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
        #variable_conflict use_column
        DECLARE
            due timestamptz;
            new_id bigint;
            new_state text;
        BEGIN
            PERFORM pgpool_check_names('pgpool_enqueue', pgpool_enqueue.kind,
                                       pgpool_enqueue.queue);
            PERFORM pgpool_check_payload('pgpool_enqueue', pgpool_enqueue.payload,
                                         pgpool_max_payload_bytes('pgpool_enqueue'));
            IF pgpool_enqueue.priority IS NULL OR pgpool_enqueue.priority = -2147483648 THEN
                RAISE EXCEPTION 'pgpool_enqueue: priority must be an integer within '
                                '±2147483647, got %',
                    coalesce(pgpool_enqueue.priority::text, 'NULL')
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'higher runs first; 0 is the default';
            END IF;
            IF pgpool_enqueue.run_at IS NOT NULL AND pgpool_enqueue.delay IS NOT NULL THEN
                RAISE EXCEPTION 'pgpool_enqueue: pass either run_at or delay, not both'
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'run_at is a time, delay an interval from now';
            END IF;
            IF NOT pg_catalog.isfinite(pgpool_enqueue.run_at) THEN
                RAISE EXCEPTION 'pgpool_enqueue: run_at must be a finite time, got %',
                    pgpool_enqueue.run_at
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'e.g. now() + interval ''5 minutes''';
            END IF;
            IF NOT pg_catalog.date_part('epoch', pgpool_enqueue.delay)
                   BETWEEN 0 AND 3162240000 THEN
                RAISE EXCEPTION 'pgpool_enqueue: delay must be from 0 to 100 years, got %',
                    pgpool_enqueue.delay
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'e.g. interval ''5 minutes''';
            END IF;
            IF pgpool_enqueue.unique_key = '' THEN
                RAISE EXCEPTION 'pgpool_enqueue: unique_key must be NULL or a non-empty string'
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'pass NULL for a job without a key';
            END IF;
            IF pgpool_enqueue.max_attempts <= 0 THEN
                RAISE EXCEPTION 'pgpool_enqueue: max_attempts must be a positive integer, '
                                'got %', pgpool_enqueue.max_attempts
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'pass NULL for the handler''s own limit';
            END IF;
            IF pgpool_enqueue.tenant = ''
               OR pg_catalog.length(pgpool_enqueue.tenant) > 200 THEN
                RAISE EXCEPTION 'pgpool_enqueue: tenant must be NULL or a non-empty string of '
                                'at most 200 characters, got % characters',
                    pg_catalog.length(pgpool_enqueue.tenant)
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'pass NULL for a job without a tenant';
            END IF;
            IF pgpool_enqueue.concurrency_key = ''
               OR pg_catalog.length(pgpool_enqueue.concurrency_key) > 200 THEN
                RAISE EXCEPTION 'pgpool_enqueue: concurrency_key must be NULL or a non-empty '
                                'string of at most 200 characters, got % characters',
                    pg_catalog.length(pgpool_enqueue.concurrency_key)
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'pass NULL for a job without a concurrency key';
            END IF;
            due := coalesce(pgpool_enqueue.run_at,
                                       pg_catalog.now() + pgpool_enqueue.delay,
                                       pg_catalog.now());
            INSERT INTO pgpool_jobs (queue, kind, payload, priority, run_at, state,
                                     max_attempts, unique_key, tenant, concurrency_key)
            VALUES (pgpool_enqueue.queue, pgpool_enqueue.kind, pgpool_enqueue.payload,
                    pgpool_enqueue.priority, due,
                    CASE WHEN due <= pg_catalog.now() THEN 'ready' ELSE 'scheduled' END,
                    pgpool_enqueue.max_attempts, pgpool_enqueue.unique_key,
                    coalesce(pgpool_enqueue.tenant, ''),
                    pgpool_enqueue.concurrency_key)
            ON CONFLICT (kind, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
            RETURNING id, state INTO new_id, new_state;
            IF new_id IS NULL THEN
                RETURN NULL;  -- a live job of this kind holds the unique key
            END IF;
            PERFORM pg_catalog.pg_notify(pgpool_channel(),
                CASE WHEN new_state = 'ready' THEN pgpool_enqueue.queue ELSE '!stage' END);
            RETURN new_id;
        END
        $$;

        -- A group (pgpool.groups): its callback, waiting (ready at once when there are no
        -- members), whose id is the group's; a member per payload of the JSON array, each
        -- with that group_id; the group's row, its total counted here (and completed at
        -- once when empty). SECURITY DEFINER: it runs as the tables' owner, so a producer
        -- needs no right to write group_id or pgpool_groups, and can make nothing but a
        -- whole, new group: no id of its choosing, no member of another group. Wakes the
        -- hosts of the members' queue (the stagers for members scheduled for later), or
        -- of the callback's for an empty group. Returns the group's id.
        CREATE FUNCTION pgpool_enqueue_group(
            kind text, payloads jsonb, queue text, priority integer, run_at timestamptz,
            max_attempts integer, tenant text, concurrency_key text,
            then_kind text, then_payload jsonb, then_queue text, then_priority integer,
            then_max_attempts integer, then_tenant text, then_concurrency_key text
        ) RETURNS bigint
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
        #variable_conflict use_column
        DECLARE
            caller constant text := 'pgpool_enqueue_group';
            max_bytes bigint;
            size integer;
            new_id bigint;
        BEGIN
            IF pg_catalog.jsonb_typeof(pgpool_enqueue_group.payloads)
                   IS DISTINCT FROM 'array' THEN
                RAISE EXCEPTION '%: payloads must be a JSON array of the members'' payloads',
                    caller USING ERRCODE = 'invalid_parameter_value',
                                 HINT = 'call pgpool.group';
            END IF;
            PERFORM pgpool_check_names(caller, pgpool_enqueue_group.kind,
                                       pgpool_enqueue_group.queue);
            PERFORM pgpool_check_names(caller, pgpool_enqueue_group.then_kind,
                                       pgpool_enqueue_group.then_queue);
            max_bytes := pgpool_max_payload_bytes(caller);
            -- Only a member that is no object, or whose text passes 508 bytes (the least
            -- that can be too deep) or the limit, can fail the check: the others skip
            -- the call, which would double the cost of a large group.
            PERFORM pgpool_check_payload(caller, member, max_bytes)
            FROM pg_catalog.jsonb_array_elements(pgpool_enqueue_group.payloads) AS member
            WHERE pg_catalog.jsonb_typeof(member) <> 'object'
               OR pg_catalog.octet_length(member::text) > least(max_bytes, 508);
            PERFORM pgpool_check_payload(caller, pgpool_enqueue_group.then_payload,
                                         max_bytes);
            size := pg_catalog.jsonb_array_length(pgpool_enqueue_group.payloads);
            INSERT INTO pgpool_jobs (queue, kind, payload, priority, run_at, state,
                                     max_attempts, tenant, concurrency_key)
            VALUES (pgpool_enqueue_group.then_queue, pgpool_enqueue_group.then_kind,
                    pgpool_enqueue_group.then_payload, pgpool_enqueue_group.then_priority,
                    pg_catalog.now(), CASE WHEN size = 0 THEN 'ready' ELSE 'waiting' END,
                    pgpool_enqueue_group.then_max_attempts,
                    coalesce(pgpool_enqueue_group.then_tenant, ''),
                    pgpool_enqueue_group.then_concurrency_key)
            RETURNING id INTO new_id;
            INSERT INTO pgpool_jobs (queue, kind, payload, priority, run_at, state,
                                     max_attempts, tenant, concurrency_key, group_id)
            SELECT pgpool_enqueue_group.queue, pgpool_enqueue_group.kind, member,
                   pgpool_enqueue_group.priority,
                   coalesce(pgpool_enqueue_group.run_at, pg_catalog.now()),
                   CASE WHEN pgpool_enqueue_group.run_at IS NULL THEN 'ready'
                        ELSE 'scheduled' END,
                   pgpool_enqueue_group.max_attempts,
                   coalesce(pgpool_enqueue_group.tenant, ''),
                   pgpool_enqueue_group.concurrency_key, new_id
            FROM pg_catalog.jsonb_array_elements(pgpool_enqueue_group.payloads) AS member;
            INSERT INTO pgpool_groups (id, total, completed_at)
            VALUES (new_id, size, CASE WHEN size = 0 THEN pg_catalog.now() END);
            PERFORM pg_catalog.pg_notify(pgpool_channel(),
                CASE WHEN size = 0 THEN pgpool_enqueue_group.then_queue
                     WHEN pgpool_enqueue_group.run_at IS NULL THEN pgpool_enqueue_group.queue
                     ELSE '!stage' END);
            RETURN new_id;
        END
        $$;
        -- PostgreSQL lets everyone execute a new function: only the roles `pgpool grants`
        -- names may. The helpers stay executable by all: they write nothing, and grant
        -- nothing a caller lacks.
        REVOKE ALL ON FUNCTION pgpool_enqueue_group(text, jsonb, text, integer, timestamptz,
            integer, text, text, text, jsonb, text, integer, integer, text, text) FROM PUBLIC;
        COMMENT ON FUNCTION pgpool_enqueue_group(text, jsonb, text, integer, timestamptz,
            integer, text, text, text, jsonb, text, integer, integer, text, text) IS
            'start a group in the current transaction, as pgpool.group does: a member of '
            'kind per payload of the payloads array, then the callback then_kind; returns '
            'the group''s id';

        -- An empty group was never completed, so retention never took its row.
        UPDATE pgpool_groups SET completed_at = created_at
        WHERE total = 0 AND completed_at IS NULL;

        DO $$
        DECLARE
            f text;
        BEGIN
            FOREACH f IN ARRAY ARRAY[
                'pgpool_jobs_refuse_insert()',
                'pgpool_check_names(text, text, text)',
                'pgpool_max_payload_bytes(text)',
                'pgpool_check_payload(text, jsonb, bigint)',
                'pgpool_channel()',
                'pgpool_enqueue(text, jsonb, text, integer, timestamptz, interval, text, '
                'integer, text, text)',
                'pgpool_enqueue_group(text, jsonb, text, integer, timestamptz, integer, '
                'text, text, text, jsonb, text, integer, integer, text, text)'] LOOP
                EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                               f, current_schema());
            END LOOP;
        END
        $$;
        """,
    ),
    Migration(
        19,
        "retention reads no record a waiting group keeps; a group's callback made ready "
        "with a fresh snapshot (pgpool_release_callbacks)",
        r"""
        -- Retention (sql.outcomes.PRUNE_DONE) keeps the records of a group until it is
        -- complete and its callback has finished. In one keep_until index they lay among
        -- the rest, all past keep_until (a member's is its finish), and every pass walked
        -- every one of them. Apart, each of the prune's two arms reads what it deletes:
        -- the records of no group in keep_until order, and by group those of the complete
        -- groups, which pgpool_groups_completed lists (never a waiting one). The new
        -- indexes first, and the drops last: a drop locks the table against readers too,
        -- and holds that lock until the migration commits.
        CREATE INDEX pgpool_done_ungrouped ON pgpool_done (keep_until)
            WHERE group_id IS NULL;
        CREATE INDEX pgpool_done_members ON pgpool_done (group_id, keep_until)
            WHERE group_id IS NOT NULL;
        CREATE INDEX pgpool_groups_completed ON pgpool_groups (completed_at)
            WHERE completed_at IS NOT NULL;
        DROP INDEX pgpool_done_keep_until;
        DROP INDEX pgpool_done_group;

        -- Make ready the waiting callbacks of the groups ids that are complete; returns
        -- the queue of each (sql.common.COUNT_MEMBERS, whose statements wake them). In a
        -- function, VOLATILE: its UPDATE takes a snapshot of its own, so under read
        -- committed it sees a callback committed after the calling statement began (a
        -- replay's, which the statement waited for on the group's row), which that
        -- statement's own snapshot cannot. SECURITY INVOKER, and executable by all as the
        -- helpers are: it writes as its caller, so it grants nothing a caller's UPDATE on
        -- pgpool_jobs does not, and every statement that finishes members (acks, the
        -- reaper, an operator's cancel) calls it, whatever its role. Most calls complete
        -- no group: they return at once. The UPDATE is planned at each call: a plan
        -- cached while pgpool_jobs was small scanned the whole table once it had grown.
        CREATE FUNCTION pgpool_release_callbacks(ids bigint[]) RETURNS SETOF text
        LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET plan_cache_mode = force_custom_plan
        AS $$
        BEGIN
            IF pg_catalog.cardinality(pgpool_release_callbacks.ids) > 0 THEN
                RETURN QUERY
                UPDATE pgpool_jobs AS j SET state = 'ready', run_at = pg_catalog.now()
                FROM pgpool_groups AS g
                WHERE j.id = ANY(pgpool_release_callbacks.ids) AND j.state = 'waiting'
                  AND g.id = j.id AND g.completed_at IS NOT NULL
                RETURNING j.queue;
            END IF;
        END
        $$;
        COMMENT ON FUNCTION pgpool_release_callbacks(bigint[]) IS
            'make ready the waiting callbacks of the complete groups among ids, seen with '
            'a snapshot of its own; returns their queues';
        DO $$ BEGIN
            EXECUTE format('ALTER FUNCTION pgpool_release_callbacks(bigint[]) '
                           'SET search_path = pg_catalog, %I, pg_temp', current_schema());
        END $$;
        """,
        "builds two indexes on pgpool_done, holding it against writes while it reads it, "
        "and one on the smaller pgpool_groups: the acks that record outcomes (kept "
        "results, members of groups, follow-ups) wait for as long as that takes, about a "
        "second per million rows of pgpool_done",
    ),
)

#: The schema version this code expects.
SCHEMA_VERSION: Final = MIGRATIONS[-1].version

BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS pgpool_schema_version (
    version     integer     PRIMARY KEY,
    description text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""

#: Seconds `migrate` waits for a table lock before it lets go and tries again. Every statement
#: on a table (heartbeats too) queues behind a waiting ACCESS EXCLUSIVE request, so this bounds
#: how long a migration can hold them up: a heartbeat runs every lease/3 and a lease is at
#: least 1 s, so half a second never costs a lease.
LOCK_TIMEOUT: Final = 0.5
#: Tries before `migrate` gives up; between them it backs off from 0.5 s, doubling to 10 s
#: (about 2.5 minutes in all with the defaults), so other sessions get through meanwhile.
LOCK_TRIES: Final = 20

log = logging.getLogger("pgpool.schema")


class Installation(NamedTuple):
    """Where pgpool's tables are, as seen through a connection's ``search_path``."""

    #: The schema holding the installation unqualified names resolve to, or None.
    schema: str | None
    #: Schemas of the database holding an installation that is not on ``search_path``.
    elsewhere: tuple[str, ...]


def locate(conn: psycopg.Connection) -> Installation:
    """Find pgpool's installation: the schema on ``conn``'s ``search_path`` holding
    ``pgpool_schema_version``. Raises `SchemaError` when that is ambiguous: two schemas on
    the path hold one, or a schema ahead of it holds a table of the same name as one of
    pgpool's (unqualified statements would then mix the two)."""
    return _installation(conn.execute(sql.INSTALLATIONS).fetchall())


async def locate_async(conn: psycopg.AsyncConnection) -> Installation:
    """Async twin of `locate`."""
    return _installation(await (await conn.execute(sql.INSTALLATIONS)).fetchall())


def _installation(rows: list[tuple[str, int | None, list[str]]]) -> Installation:
    installed = [(name, pos, tables) for name, pos, tables in rows
                 if "pgpool_schema_version" in tables]
    on_path = [(name, pos, tables) for name, pos, tables in installed if pos is not None]
    elsewhere = tuple(name for name, pos, _ in installed if pos is None)
    if len(on_path) > 1:
        names = " and ".join(_quoted(name) for name, _, _ in on_path)
        raise SchemaError(
            f"pgpool is installed in {len(on_path)} schemas on this connection's search_path, "
            f"{names}, and statements would mix their tables: keep the one that holds your "
            f"jobs and drop the other's pgpool_* tables, or set search_path in the DSN "
            f"(options=-csearch_path=...) so that only one of them is on it"
        )
    if not on_path:
        return Installation(None, elsewhere)
    schema, pos, tables = on_path[0]
    shadows = sorted(f"{_quoted(name)}.{table}" for name, p, others in rows
                     if p is not None and p < pos for table in others if table in tables)
    if shadows:
        raise SchemaError(
            f"pgpool is installed in schema {_quoted(schema)}, but {', '.join(shadows)} "
            f"comes before it on search_path and would be used instead: rename or drop "
            f"it, or set search_path in the DSN (options=-csearch_path=...) to put "
            f"{_quoted(schema)} first"
        )
    return Installation(schema, elsewhere)


def migrate(conn: psycopg.Connection, *, lock_timeout: float = LOCK_TIMEOUT,
            tries: int = LOCK_TRIES) -> list[int]:
    """Bring pgpool's schema on ``conn`` up to `SCHEMA_VERSION`; return the versions applied.

    Migrates the installation `locate` finds, wherever it sits on ``search_path``; with
    none, installs into the first existing schema on it. Safe to call concurrently from
    many processes and to call again (it then applies nothing). Runs in a transaction of
    its own, or in a savepoint if ``conn`` is already inside one (then leaving the
    session's settings as they were). A lock it waits for longer than ``lock_timeout``
    seconds is let go and tried again, up to ``tries`` times. Raises `SchemaError` when the
    database is newer than this code, when the installation is ambiguous, or when the
    locks stayed taken.
    """
    import psycopg  # see TYPE_CHECKING above

    if tries < 1:
        raise ValueError(f"tries must be at least 1, not {tries}")
    attempt = 0
    while True:
        attempt += 1
        try:
            return _migrate_once(conn, lock_timeout)
        except psycopg.errors.LockNotAvailable:
            if attempt >= tries:
                raise _locked_out(conn, lock_timeout, tries) from None
            delay = backoff(attempt, 0.25, 10.0)
            if attempt == 1:
                event(log, logging.WARNING, "migrate_waiting",
                      "migration waits for sessions holding pgpool's tables; trying again "
                      "up to %d times", tries - 1, tries=tries, lock_timeout=lock_timeout)
            time.sleep(delay)


def _migrate_once(conn: psycopg.Connection, lock_timeout: float) -> list[int]:
    schema = locate(conn).schema
    if schema is None:
        schema = _row(conn.execute(sql.CURRENT_SCHEMA).fetchone())[0]
        if schema is None:
            raise SchemaError(
                "the connection's search_path names no existing schema to create pgpool's "
                "tables in: create the schema first, or fix search_path in the DSN"
            )
    elif _version(conn) == SCHEMA_VERSION:
        return []  # nothing to do, and no DDL privilege needed to find that out
    from psycopg.sql import Identifier

    applied: list[int] = []
    with conn.transaction():
        saved = _row(conn.execute(sql.MIGRATE_SAVED).fetchone())
        conn.execute(sql.MIGRATE_SEARCH_PATH,
                     {"search_path": Identifier(schema).as_string(conn)})
        conn.execute(sql.MIGRATE_LOCK)
        conn.execute(sql.MIGRATE_LOCK_TIMEOUT, {"lock_timeout": f"{lock_timeout * 1000:.0f}ms"})
        conn.execute(BOOKKEEPING)
        current = _row(conn.execute(sql.SCHEMA_VERSION).fetchone())[0]
        if current > SCHEMA_VERSION:
            raise SchemaError(_too_new(current))
        for m in MIGRATIONS:
            if m.version > current:
                conn.execute(m.ddl)
                conn.execute(sql.MIGRATE_RECORD, (m.version, m.description))
                applied.append(m.version)
        conn.execute(sql.MIGRATE_RESTORE,
                     {"search_path": saved[0], "lock_timeout": saved[1]})
    return applied


def _locked_out(conn: psycopg.Connection, lock_timeout: float, tries: int) -> SchemaError:
    schema = locate(conn).schema or _row(conn.execute(sql.CURRENT_SCHEMA).fetchone())[0]
    holders = [pid for (pid,) in conn.execute(sql.LOCK_HOLDERS, {"schema": schema})]
    who = (f"sessions with pid {', '.join(map(str, holders))} hold locks on them now"
           if holders else "the sessions holding them have let go since")
    return SchemaError(
        f"the migration could not lock pgpool's tables in schema {_quoted(schema)} in "
        f"{tries} tries of {lock_timeout:g} s ({who}): let long transactions on them finish "
        f"or end them (pg_stat_activity shows them), then run `pgpool migrate` again"
    )


def to_drain_for(current: int | None) -> list[Migration]:
    """The migrations an upgrade from version ``current`` applies that need the fleet
    stopped (`Migration.drain`); none for a new installation (its tables are empty)."""
    if current is None:
        return []
    return [m for m in MIGRATIONS if m.version > current and m.drain]


def schema_version(conn: psycopg.Connection) -> int | None:
    """The recorded version of the installation `locate` finds, or None when there is none
    on ``search_path``. Raises `SchemaError` when that is ambiguous."""
    return None if locate(conn).schema is None else _version(conn)


def check(conn: psycopg.Connection) -> None:
    """Raise `SchemaError` unless ``conn``'s ``search_path`` leads to exactly one pgpool
    installation, at exactly the version this code needs (``run``, ``enqueue``, ``status``)."""
    found = locate(conn)
    check_version(None if found.schema is None else _version(conn), found.elsewhere)


async def check_async(conn: psycopg.AsyncConnection) -> None:
    """Async twin of `check`."""
    found = await locate_async(conn)
    version = None
    if found.schema is not None:
        version = _row(await (await conn.execute(sql.SCHEMA_VERSION)).fetchone())[0]
    check_version(version, found.elsewhere)


def _version(conn: psycopg.Connection) -> int:
    version: int = _row(conn.execute(sql.SCHEMA_VERSION).fetchone())[0]
    return version


def _row(row: tuple[Any, ...] | None) -> tuple[Any, ...]:
    """The row of a statement that always returns one."""
    assert row is not None
    return row


def check_version(found: int | None, elsewhere: tuple[str, ...] = ()) -> None:
    """Raise `SchemaError` unless ``found`` is exactly the version this code needs;
    ``elsewhere``, the schemas off ``search_path`` that hold pgpool, hint at a DSN that
    misses its schema when ``found`` is None."""
    if found is None and elsewhere:
        names = ", ".join(_quoted(name) for name in elsewhere[:3])
        more = f" and {len(elsewhere) - 3} more" if len(elsewhere) > 3 else ""
        raise SchemaError(
            f"pgpool's tables are in no schema on this connection's search_path, but "
            f"schema {names}{more} of this database holds them: put that schema on "
            f"search_path in the DSN (options=-csearch_path=...), or run `pgpool migrate` "
            f"to install pgpool in the schema search_path names"
        )
    if found is None:
        raise SchemaError(
            "pgpool's tables are missing from this database: run `pgpool migrate` "
            "against the same database first"
        )
    if found > SCHEMA_VERSION:
        raise SchemaError(_too_new(found))
    if found < SCHEMA_VERSION:
        raise SchemaError(
            f"the pgpool schema is at version {found} but this pgpool needs {SCHEMA_VERSION}: "
            "run `pgpool migrate` to upgrade it"
        )


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _too_new(found: int) -> str:
    return (
        f"the pgpool schema is at version {found}, newer than this pgpool understands "
        f"({SCHEMA_VERSION}): upgrade pgpool on this host to use this database"
    )
