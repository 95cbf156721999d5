"""The dispatcher's process, one per host: it claims batches of ready jobs, feeds them to
its worker processes, heartbeats their leases and writes their outcomes back.

  pgpool_jobs ─▶ claimer (scheduler's claim loops, under budget) ─▶ pool ─▶ workers
       ▲                                                              │ outcomes
       └─────── completer (one ACK per flush) ◀── dispatcher ◀────────┘
       ▲
  parts/: heartbeat, reaper, stager, listener, hosts, control, retention, vacuum, periodic

`dispatcher` builds and supervises the rest (its docstring draws a job's path in full);
`attempt` holds what the host knows of a claimed job (`Job`) and how its attempt ended
(`AttemptEnd`); `tasks` stops the host's asyncio tasks, each cancelled once. Only
`dispatcher` imports the side parts (`pgpool.host.parts`). This wing imports the worker's
(`pgpool.worker`: the processes it starts and their messages), the database's
(`pgpool.db`) and the application API, never a front end.
"""
