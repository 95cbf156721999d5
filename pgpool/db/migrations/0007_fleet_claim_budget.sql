-- description: the fleet's claim budget in one row, shared by demand

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
