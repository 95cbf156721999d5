"""Every runtime SQL statement pgpool sends, by name, in one module per audience:

- `jobs`: the job protocol (enqueue, claim, heartbeat, ack, reap, stage, and the vacuum
  keeper that keeps claims fast), with the ownership guard every statement that changes a
  running job carries;
- `fleet`: what the hosts share (their ``pgpool_hosts`` rows, the claim budget, steering
  as a host reads it, periodic schedules);
- `observe`: what ``pgpool status``, the metrics and the dashboard read;
- `install`: locating, migrating and granting an installation;
- `ops`: the operators' commands (`pgpool.ops`) and dead-letter retention;
- `long`: long jobs' checkpoints and progress (`pgpool.host.long`);
- `common`: the installation's LISTEN/NOTIFY channel and its payloads, and `int_array`.

A caller imports the module of its audience (``from .sql import jobs as sql``); this package
re-exports nothing. The schema itself (DDL) lives in `pgpool.db.schema` as numbered
migrations. Every statement is parameterised; table names are fixed and resolved through
the connection's ``search_path``, so a deployment can put pgpool in its own schema with
``options=-csearch_path=...``.
"""
