-- description: outcomes: finished jobs kept with their results (pgpool_done); groups of
--   jobs with a callback (pgpool_groups, group_id, the 'waiting' state)

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
