-- description: the fleet's maintenance leader: one lease row, with a fencing token

-- One row per elected role ('maintenance': the reaper, the stager, the vacuum keeper,
-- retention and the pruning of stale hosts, run by one host for the whole fleet;
-- pgpool.host.parts.leader). holder is the leading dispatcher's owner until
-- expires_at; token grows by one at every change of holder, and every statement of
-- the elected parts runs in a transaction that first locks this row FOR SHARE with
-- its token and an unexpired lease, so a successor (which must update the row) can
-- only take over between two of them, and a deposed leader's next one finds the
-- token changed.
CREATE TABLE pgpool_leader (
    role        text        PRIMARY KEY,
    holder      text,
    token       bigint      NOT NULL DEFAULT 0,
    expires_at  timestamptz NOT NULL DEFAULT '-infinity',
    acquired_at timestamptz
);
COMMENT ON TABLE pgpool_leader IS
    'pgpool fleet leadership: who runs the fleet''s maintenance (holder, a dispatcher''s '
    'owner) until expires_at; token counts the changes of holder (a fencing token).';
INSERT INTO pgpool_leader (role) VALUES ('maintenance');
