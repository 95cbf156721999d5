"""``pgpool bench``: seed jobs, drive them through a real dispatcher, report the costs.

`pgpool.bench.run.run` runs the stages below in order and returns every figure as one
JSON-ready dict; `pgpool.bench.report.render` prints it as a table. This file is only this
docstring: workers import `pgpool.bench.jobs`, which runs it, and must not pay for psycopg
or asyncio.

Contract:

- Isolation (`scratch`): everything happens in a new schema ``pgpool_bench_<random>`` on
  the target database, reached through ``search_path``, migrated with `pgpool.migrate` and
  dropped at the end, also on error and Ctrl-C. The user's own pgpool tables are never read
  or written. Server settings (the version, and the durability settings ``fsync``,
  ``synchronous_commit``, ``full_page_writes``) are reported, never changed.
- Profiles (`profiles`, run by `jobs`): ``noop``; ``cpu``, a SHA-256 chain calibrated once
  on this host to take about 5 ms; ``sleep``, a random 2-5 ms; ``mixed``, the three in turn.
- Seed (`seed`): `pgpool.enqueue_many` of N jobs against a raw COPY of the same rows
  (encoded beforehand by `pgpool.enqueue.copy_rows`, the best any loader could do) into the
  same, empty table, alternating, `seed.SEED_ROUNDS` times each; the fastest round of each
  side gives rows/s and the ratio.
- Backlog (``--backlog N``, default 0; `run`): then N jobs due in a day are inserted (one
  ``INSERT ... SELECT`` from ``generate_series``) and the table analysed; they stay for the
  rest of the run. pgpool deletes finished jobs (dead-lettered ones move to
  ``pgpool_dead``, which a claim never reads), so rows not yet due are what makes the table
  a claim works on deep. Every later stage runs against that table, and checks at its end
  that no job is left due or running and that the N backlog rows are still there.
- Ceilings (`ceilings`): no framework, two connections in two threads, each repeating a
  hand-written claim of the drive's batch of rows (never pgpool's `pgpool.sql.jobs.CLAIM`)
  then a DELETE of those ids, until no job is due: the database's jobs/s for the cycle, in
  two forms. "One transaction": ``SELECT id ... ORDER BY priority DESC, run_at, id LIMIT n FOR
  NO KEY UPDATE SKIP LOCKED`` on the ready index (`queries.PICK`) and the delete commit
  together. "Lease cycle": an ``UPDATE`` of those rows to running with a lease
  (`queries.LEASE_CLAIM`) commits, then the delete commits, the two commits per batch that
  any lease-based queue needs (a claim must be durable before its work starts). Runs of
  half a second vary by about 20% on a small VM, so each ceiling is measured before the
  drive and again after it (on re-seeded jobs) and the mean is reported next to the single
  runs. With ``--batch auto`` the batch is only known once the drive has settled it, so
  both runs follow the drive.
- Drive (`drive`, CPU samples from `cpu`): an in-process `pgpool.host.dispatcher.Dispatcher` in
  burst mode with ``--procs`` workers until drained, watched through a
  `pgpool.host.dispatcher.DispatcherObserver`, with a progress line on stderr (rewritten in place
  every 0.5 s on a terminal, a new line every 5 s otherwise). Reports wall and steady jobs/s
  (steady: first to last completion) and the ratio to both ceilings; the batch (with
  ``auto``, the one the dispatcher settled at by the end); claims and their round trip
  p50/p99; claimed jobs/s in the steady window against this host's share of
  ``--max-claims-per-sec`` (without that option the drive runs unthrottled and is compared
  with run's default); ack flushes, their mean size and latency p50/p99; transactions per
  job (``pg_stat_database.xact_commit`` of the whole database, so other traffic counts);
  statements per job, counted as checkouts of the dispatcher's two connection pools from its
  start-up to its drain (claims, acks, heartbeats and reaper passes send one statement per
  checkout, a host registry beat two, a plain claim that finds tenants or keys waiting and
  makes way for the fair one two; the LISTEN connection, the vacuum keeper's own
  connections, the start-up schema check and the registration are not counted); queue lag
  p50/p99 (enqueue commit to handler start, for 1 job in 64, all seeded in one transaction,
  so the lag of the last ones is about the drain time); CPU seconds of the dispatcher, its
  workers and the local ``postgres`` processes (``n/a`` when none are visible); the formula
  ``procs * batch / (claim_rtt + batch * handle_time)`` next to what was achieved; and
  "workers only", procs / the workers' CPU per job, the most they could do with their cores
  to themselves (the cpu profile's reference).
- Pickup (`pickup`): then a real ``pgpool run --procs 1`` subprocess serves the bench
  schema. Once its LISTEN is in place and a warm-up job ran, jobs are enqueued one at a
  time, each in its own committed transaction, 5-20 ms apart so the queue is idle: pickup
  latency is the time from the commit returning to the handler starting, p50/p99/max over
  min(200, N) jobs (at least 20). Handlers report their start through
  `pgpool.bench.jobs.STAMPS_ENV`, as ``CLOCK_MONOTONIC`` (system-wide on Linux)
  nanoseconds. The subprocess is stopped with SIGTERM and must exit 0. The floor is
  measured the same way with no framework: a LISTENing connection, then the lease cycle's
  hand-written claim of 1 job (`queries.LEASE_CLAIM`) committed on a second one.
- Each ceiling run, the drive and the pickup start on a vacuumed table, as autovacuum keeps
  a live queue: the dead rows one stage leaves would otherwise slow the next.
- Targets from the issue are printed next to their figures (`report`): enqueue_many >= 0.8
  of raw COPY; noop steady >= 0.8 of the ceilings; transactions/job <= 0.05 at batch 50;
  pickup p50 <= 1.5 ms, p99 <= 3 ms. They are reported, not enforced.

The other modules: `options` (what to run, `BenchError`), `progress` (the stderr lines),
`queries` (the bench's own SQL; runtime statements stay in `pgpool.sql`) and `figures`
(quantiles and the throughput formula).
"""
