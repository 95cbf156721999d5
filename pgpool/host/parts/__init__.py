"""The side parts of a dispatcher: what keeps the queue and the host in order beside the
data path (enqueue, claim, the worker pool, ack), one module each.

- `heartbeat`: extends the leases of the jobs this host holds; the only judge of a lost lease.
- `reaper`: returns jobs whose lease expired, or dead-letters them.
- `stager`: makes scheduled jobs ready when they fall due.
- `listener`: relays LISTEN/NOTIFY wake-ups to the claim loops, the control poll and the
  stager.
- `hosts`: this host's ``pgpool_hosts`` row and its share of the fleet's claim budget.
- `control`: operators' paused queues and cancellations, as this host sees them.
- `retention`: deletes dead jobs older than ``--dead-retention``.
- `vacuum`: vacuums pgpool_jobs before its dead rows slow claims.
- `periodic`: enqueues the ticks of the schedules the handler modules declare.

Each is a `loop.Part`: a ``name``, ``run()`` (until cancelled) and ``wake()``, and each
repeats its step in a `loop.Loop`, which rides out database outages and logs them once. The
dispatcher starts them as a list and stops the host if one ends (`pgpool.host.dispatcher`).
Like River's maintenance services and Oban's plugins, a part may stop, fail or lag without
losing a job: leases, the reaper and the database's guards keep the data path correct.
"""
