"""A worker process: it imports the handler modules, runs the jobs its dispatcher sends
through its task pipe, one at a time, and writes their outcomes back.

  task pipe ─▶ main.main(): ipc.Jobs ─▶ run_job(): handler(payload) ─▶ ipc.Done | Failed
                                          │ follow-ups (followups), output (output)
                                          └─▶ result pipe, and the doorbell when the
                                              dispatcher must act (ipc.Outbox)
  fence: the kernel ends the worker at its running job's lease deadline

`main` is the process's entry point and `pgpool.current_job`; `ipc` the messages both
sides exchange; `portable` what differs where there are no pidfds. This wing imports the
application API only: a worker never opens a database connection, and imports neither
psycopg nor asyncio.
"""
