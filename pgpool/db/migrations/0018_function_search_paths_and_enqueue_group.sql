-- description: pgpool's functions immune to the caller's search_path; groups made only by
--   pgpool_enqueue_group; the payload limit of pgpool_enqueue as pgpool.enqueue's

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
