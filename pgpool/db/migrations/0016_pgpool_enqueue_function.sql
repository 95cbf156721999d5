-- description: pgpool_enqueue(): enqueue from SQL, another language or a trigger

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
