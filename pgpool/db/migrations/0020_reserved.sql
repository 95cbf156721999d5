-- description: reserved (a fleet-wide limits migration in review takes this version)

-- Nothing: this version belongs to a migration being written alongside (issue 34's
-- elected maintenance is 0022). Whichever branch lands first, the other's file takes
-- this place; this placeholder only keeps the versions without a gap meanwhile.
SELECT 1;
