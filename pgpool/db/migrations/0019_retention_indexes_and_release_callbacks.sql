-- description: retention reads no record a waiting group keeps; a group's callback made
--   ready with a fresh snapshot (pgpool_release_callbacks)
-- drain: builds two indexes on pgpool_done, holding it against writes while it reads it,
--   and one on the smaller pgpool_groups: the acks that record outcomes (kept results,
--   members of groups, follow-ups) wait for as long as that takes, about a second per
--   million rows of pgpool_done

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
