"""The ``pgpool`` command: run, migrate, enqueue, status, health, dsn, bench, and the
operator commands of `pgpool.cli.operate` (jobs, dead, cancel, retry, pause, resume).

Every error a user can cause ends as one line on stderr, ``pgpool: error: <what and how to
fix it>``, with exit status 2 and no traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from .. import extras, logs, names, registry
from ..db import schema
from ..enqueue import enqueue, max_payload_bytes, too_deep
from ..errors import ConfigError, PgpoolError, first_line
from ..host.budget import DEFAULT_MAX_CLAIMS_PER_SEC
from ..host.config import (
    FAIR_BY,
    RunConfig,
    auto_procs,
    parse_duration,
    usable_cpus,
    workers_that_fit,
)
from ..sql import fleet as sql
from ..sql.fleet import STALE_AFTER_LEASES
from ..sql.install import INSTALLED_SCHEMA
from ..worker import portable

if TYPE_CHECKING:
    from ..host.pool import Launched

# psycopg (through pgpool.db.dsn) is imported by the commands, not here: the worker processes
# of `pgpool run` import this module again (multiprocessing's "spawn" re-runs the main
# script), and must not pay about 0.15 s of CPU each for a library they never use.

log = logging.getLogger("pgpool")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"pgpool: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)


def _number(kind: type, *, minimum: float, inclusive: bool, what: str,
            maximum: float = math.inf) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        if value < minimum or (value == minimum and not inclusive) or value > maximum:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


positive_int = _number(int, minimum=1, inclusive=True, what="a positive integer")
spare_workers = _number(int, minimum=0, inclusive=True, maximum=64,
                        what="a whole number of spare workers from 0 to 64")
#: --tenant-cap: compared with a count in SQL, as a PostgreSQL integer.
tenant_cap = _number(int, minimum=1, inclusive=True, maximum=2**31 - 1,
                     what="a positive integer number of running jobs")
positive_seconds = _number(float, minimum=0, inclusive=False, what="a positive number of seconds")
seconds = _number(float, minimum=0, inclusive=True, what="a non-negative number of seconds")
# Bounds the database and the machine can honour; past them a run could only fail later.
procs_count = _number(int, minimum=1, inclusive=True, maximum=4096,
                      what="a number of processes from 1 to 4096")
batch_size = _number(int, minimum=1, inclusive=True, maximum=10_000,
                     what="a batch size from 1 to 10000")
lease_seconds = _number(float, minimum=1, inclusive=True, maximum=86_400,
                        what="a lease from 1 to 86400 seconds")
claims_rate = _number(float, minimum=0, inclusive=False, maximum=1e7,
                      what="a positive number of claims per second")
memory_mib = _number(int, minimum=64, inclusive=True, maximum=2**30,
                     what="a memory size in MiB, at least 64")
poll_seconds = _number(float, minimum=0.01, inclusive=True, maximum=3600,
                       what="a poll interval from 0.01 to 3600 seconds")
tcp_port = _number(int, minimum=0, inclusive=True, maximum=65535,
                   what="a TCP port from 0 to 65535")


def _or_auto(parse: Callable[[str], int]) -> Callable[[str], int | Literal["auto"]]:
    def parse_or_auto(text: str) -> int | Literal["auto"]:
        return "auto" if text.strip().lower() == "auto" else parse(text)

    return parse_or_auto


#: ``--batch``: a batch size, or ``auto`` (`pgpool.host.sizing`).
batch_or_auto = _or_auto(batch_size)


def _queue_list(text: str) -> list[str]:
    return [names.name_arg("queue")(name.strip()) for name in text.split(",")]


def _kind_list(text: str) -> list[str]:
    return [names.name_arg("kind")(name.strip()) for name in text.split(",")]


def _log_errors(text: str) -> str:
    value = text.strip().lower()
    if value not in logs.LOG_ERRORS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(logs.LOG_ERRORS)}")
    return value


def _fair_by(text: str) -> str:
    value = text.strip().lower()
    if value not in FAIR_BY:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not one of {', '.join(FAIR_BY)}: what tenants share, jobs (count) "
            "or CPU time (cpu)")
    return value


def _boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean: use 1 or 0")


def _retention(text: str) -> float:
    """``--dead-retention``, ``--keep-done`` and ``--horizon-warn``: a duration in seconds;
    0 or off: 0 (for dead letters, kept forever; for successes, not kept; for the horizon,
    no warning; not None, which means "not given")."""
    if text.strip().lower() == "off":
        return 0.0
    try:
        return parse_duration(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: `pgpool run`'s options an environment variable can set: the option's dest, the variable,
#: its parser (the flag's, so a bad value gets the flag's message) and the default when
#: neither is given. A flag given on the command line wins and the variable is not read.
#: PGPOOL_HANDLERS (`registry.resolve_modules`) and PGPOOL_DSN (`dsn.locate`) are read there.
RUN_ENVIRONMENT: tuple[tuple[str, str, Callable[[str], Any], Any], ...] = (
    ("procs", "PGPOOL_PROCS", _or_auto(procs_count), "auto"),
    ("batch", "PGPOOL_BATCH", batch_or_auto, "auto"),
    ("queue", "PGPOOL_QUEUES", _queue_list, ("default",)),
    ("kinds", "PGPOOL_KINDS", _kind_list, None),
    ("lease", "PGPOOL_LEASE", lease_seconds, RunConfig.lease),
    ("timeout", "PGPOOL_TIMEOUT", positive_seconds, None),
    ("grace", "PGPOOL_GRACE", seconds, RunConfig.grace),
    ("poll", "PGPOOL_POLL", poll_seconds, RunConfig.poll),
    ("idle_poll", "PGPOOL_IDLE_POLL", poll_seconds, RunConfig.idle_poll),
    ("max_tasks_per_child", "PGPOOL_MAX_TASKS_PER_CHILD", positive_int, None),
    ("spare_workers", "PGPOOL_SPARE_WORKERS", spare_workers, RunConfig.spare_workers),
    ("max_memory", "PGPOOL_MAX_MEMORY", memory_mib, None),
    ("max_claims_per_sec", "PGPOOL_MAX_CLAIMS_PER_SEC", claims_rate, None),
    ("tenant_cap", "PGPOOL_TENANT_CAP", tenant_cap, None),
    ("fair_by", "PGPOOL_FAIR_BY", _fair_by, RunConfig.fair_by),
    ("burst", "PGPOOL_BURST", _boolean, False),
    ("metrics_port", "PGPOOL_METRICS_PORT", tcp_port, None),
    ("metrics_host", "PGPOOL_METRICS_HOST", str, RunConfig.metrics_host),
    ("dead_retention", "PGPOOL_DEAD_RETENTION", _retention, RunConfig.dead_retention),
    ("keep_done", "PGPOOL_KEEP_DONE", _retention, None),
    ("log_errors", "PGPOOL_LOG_ERRORS", _log_errors, RunConfig.log_errors),
    ("log_jobs", "PGPOOL_LOG_JOBS", _boolean, False),
    ("log_summary", "PGPOOL_LOG_SUMMARY", _retention, RunConfig.log_summary),
)
_RUN_VARIABLES = {dest: variable for dest, variable, _, _ in RUN_ENVIRONMENT}
#: ``--horizon-warn``'s variable, read by status, health and web.
HORIZON_WARN_VARIABLE = "PGPOOL_HORIZON_WARN"


def _horizon_warn(args: argparse.Namespace) -> float | None:
    """``--horizon-warn``, else its variable, else the default, in seconds; None: off."""
    from ..horizon import HORIZON_WARN

    value = _from_env(args.horizon_warn, HORIZON_WARN_VARIABLE, _retention)
    if value is None:
        return HORIZON_WARN
    return value or None


def _add_run_option(parser: argparse.ArgumentParser, *flags: str, **kwargs: Any) -> None:
    """``parser.add_argument``, whose help names the option's `RUN_ENVIRONMENT` variable."""
    action = parser.add_argument(*flags, **kwargs)
    if action.dest in _RUN_VARIABLES:
        action.help = f"{action.help} (env {_RUN_VARIABLES[action.dest]})"


class _Version(argparse.Action):
    """``--version``: like ``pgpool.__version__``, the installed distribution's (pyproject.toml
    is its one source), read only when asked: importlib.metadata costs 50 ms to import."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from importlib.metadata import version

        print(f"pgpool {version('pgpool')}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pgpool",
        description="CPU-heavy jobs on every core of every host; PostgreSQL is the queue.",
    )
    parser.add_argument("--version", action=_Version, help="print pgpool's version and exit")
    # The logging options go before or after the subcommand. The subcommand's copies are
    # SUPPRESSed when absent: a default there would overwrite a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    for options, default in ((parser, None), (common, argparse.SUPPRESS)):
        options.add_argument("--log-level", choices=LOG_LEVELS, type=str.upper,
                             default=default,
                             help="log verbosity (env PGPOOL_LOG_LEVEL; default INFO)")
        options.add_argument("--log-format", choices=logs.LOG_FORMATS, type=str.lower,
                             default=default,
                             help="log lines as text, or one JSON object each with the "
                                  "events' fields (env PGPOOL_LOG_FORMAT; default text)")
    sizing = argparse.ArgumentParser(add_help=False)
    # No argparse defaults here (nor for run's other RUN_ENVIRONMENT options): None means
    # "not given", so `apply_environment` can tell a flag from a default.
    _add_run_option(sizing, "--procs", type=_or_auto(procs_count),
                    help="worker processes, or auto: the usable CPUs, respecting "
                         "affinity and the cgroup CPU quota, and no more than the cgroup "
                         "memory limit holds at --max-memory each (default auto)")
    _add_run_option(sizing, "--batch", type=batch_or_auto,
                    help="jobs claimed per statement, or auto: sized from the measured "
                         "claim round trip and job time (default auto)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser,
                                help="what to do (`pgpool COMMAND --help` for its options)")
    dsn_help = ("PostgreSQL DSN (default: $PGPOOL_DSN, then the PG* environment, then the "
                "embedded server in $PGPOOL_HOME or the per-user data directory, unless "
                "PGPOOL_EMBEDDED=0)")

    run = sub.add_parser("run", parents=[common, sizing],
                         help="run a dispatcher and its worker processes on this host")
    run.add_argument("--dsn", help=dsn_help)
    run.add_argument("--handlers", action="append", metavar="MODULE",
                     help="handler module to import (repeatable; default $PGPOOL_HANDLERS)")
    _add_run_option(run, "--queue", action="append", type=names.name_arg("queue"),
                    metavar="NAME", help="queue to serve (repeatable; default: default)")
    _add_run_option(run, "--kinds", type=_kind_list, metavar="KIND,...",
                    help="serve only these of the kinds the handler modules register "
                         "(comma-separated; default: all of them)")
    _add_run_option(run, "--lease", type=lease_seconds,
                    help="lease length in seconds, extended every lease/3 (default 30)")
    _add_run_option(run, "--timeout", type=positive_seconds,
                    help="hard per-attempt time limit for handlers that set none")
    _add_run_option(run, "--grace", type=seconds,
                    help="on SIGTERM, how long running jobs may take to finish (default 30)")
    _add_run_option(run, "--poll", type=poll_seconds,
                    help="backstop poll interval when no notification arrives (default 1)")
    _add_run_option(run, "--idle-poll", type=poll_seconds, metavar="SECONDS",
                    help="backstop poll interval of an idle host (nothing ready) while its "
                         "listener is connected; at least --poll (default 30)")
    _add_run_option(run, "--max-tasks-per-child", type=positive_int, metavar="N",
                    help="replace each worker after N jobs (bounds slow leaks)")
    _add_run_option(run, "--spare-workers", type=spare_workers, metavar="N",
                    help="workers kept started beside --procs, their handler modules "
                         "imported: one replaces a worker that ends (a crash, "
                         "--max-tasks-per-child) at once; 0: none (default "
                         f"{RunConfig.spare_workers})")
    _add_run_option(run, "--max-memory", type=memory_mib, metavar="MIB",
                    help="cap each worker's memory at MIB mebibytes: a job that needs more "
                         "fails with MemoryError, alone")
    _add_run_option(run, "--max-claims-per-sec", type=claims_rate, metavar="N",
                    help="claims per second for the whole fleet, shared by demand, when "
                         "`pgpool budget set` set none (default "
                         f"{DEFAULT_MAX_CLAIMS_PER_SEC:g})")
    _add_run_option(run, "--tenant-cap", type=tenant_cap, metavar="N",
                    help="start no job of a tenant that has N jobs running anywhere in the "
                         "fleet (concurrent claims may overshoot it: see the Fairness guide; "
                         "default: no cap)")
    _add_run_option(run, "--fair-by", type=_fair_by, metavar="{count,cpu}",
                    help="what the fair claim evens out between tenants: their jobs, or "
                         "the CPU time their jobs used over the last 30 s, fleet-wide (see "
                         "the Fairness guide; default count)")
    _add_run_option(run, "--burst", action="store_true", default=None,
                    help="exit 0 once no runnable job is ready and nothing is in flight")
    _add_run_option(run, "--metrics-port", type=tcp_port, metavar="PORT",
                    help="serve Prometheus /metrics and /healthz on this port (default: "
                         "not served)")
    _add_run_option(run, "--metrics-host", metavar="ADDRESS",
                    help="address to serve metrics on (default 0.0.0.0: every interface)")
    _add_run_option(run, "--dead-retention", type=_retention, metavar="DURATION",
                    help="delete dead jobs older than this (90s, 15m, 2h, 7d; 0 or off keeps "
                         "them forever; default 30d): one live host at a time does, in "
                         "bounded batches")
    _add_run_option(run, "--keep-done", type=_retention, metavar="DURATION",
                    help="keep every job that succeeds this long, with what its handler "
                         "returned, for pgpool.job_status, pgpool.wait and `pgpool jobs "
                         "show` (a handler's keep= wins; default: only kinds whose handler "
                         "says keep=)")
    _add_run_option(run, "--log-errors", type=_log_errors, metavar="{none,message,traceback}",
                    help="what the log line of a failed job shows of its error: its type "
                         "only, the first line of its message (at most 300 characters, "
                         "secrets masked; the traceback at DEBUG), or its traceback too "
                         "(default message; see the Security guide)")
    _add_run_option(run, "--log-jobs", action="store_true", default=None,
                    help="log each job that succeeds too, with its run time (failures "
                         "always are)")
    _add_run_option(run, "--log-summary", type=_retention, metavar="DURATION",
                    help="log what the jobs that ended did (counts per outcome, run time "
                         "p50/p95 per kind) at most this often while jobs end, the first "
                         "line within 5s (0 or off: never; default 60s)")
    run.set_defaults(func=cmd_run)

    migrate = sub.add_parser("migrate", parents=[common], help="create or upgrade pgpool's tables")
    migrate.add_argument("--dsn", help=dsn_help)
    migrate.set_defaults(func=cmd_migrate)

    enq = sub.add_parser("enqueue", parents=[common], help="enqueue one job and print its id")
    enq.add_argument("kind", type=names.name_arg("kind"),
                     help="the job's kind (its handler's name)")
    enq.add_argument("payload", metavar="JSON",
                     help="the payload, a JSON object; - reads it from stdin, @FILE from FILE")
    enq.add_argument("--queue", type=names.name_arg("queue"), default="default",
                     help="queue to put the job in (default: default)")
    enq.add_argument("--priority", type=int, default=0, help="higher runs first (default 0)")
    enq.add_argument("--delay", type=seconds, help="run no sooner than this many seconds")
    enq.add_argument("--unique-key", type=_unique_key, metavar="KEY",
                     help="skip if a job of this kind and key is ready or running")
    enq.add_argument("--max-attempts", type=positive_int, metavar="N",
                     help="attempts before the job is dead-lettered (default: the "
                          "handler's setting, else 20)")
    enq.add_argument("--tenant", metavar="NAME",
                     help="the job's fairness group (see the Fairness guide; default: none)")
    enq.add_argument("--concurrency-key", metavar="KEY",
                     help="run no two jobs of this key at once, fleet-wide (default: none)")
    enq.add_argument("--dsn", help=dsn_help)
    enq.set_defaults(func=cmd_enqueue)

    from ..horizon import HORIZON_WARN  # here: worker processes import this module, never parse

    horizon_warn: dict[str, Any] = dict(
        type=_retention, metavar="DURATION",
        help="warn when what holds back vacuum of pgpool's tables (a transaction, a "
             "prepared transaction, a slot, a standby's feedback) is older than this while "
             "pgpool_jobs' dead rows pile up (90s, 15m, 2h; 0 or off: never; env "
             f"{HORIZON_WARN_VARIABLE}; default {HORIZON_WARN / 60:g}m)")
    status = sub.add_parser("status", parents=[common],
                            help="show hosts, per-queue counts and kinds no live host handles")
    status.add_argument("--dsn", help=dsn_help)
    status.add_argument("--json", action="store_true", help="print one JSON object instead")
    status.add_argument("--watch", nargs="?", const=2.0, type=poll_seconds, metavar="SECONDS",
                        help="refresh every SECONDS (default 2) until interrupted: in place "
                             "on a terminal; with --json, one object per line")
    status.add_argument("--horizon-warn", **horizon_warn)
    status.set_defaults(func=cmd_status)

    health = sub.add_parser("health", parents=[common],
                            help="exit 0 if the dispatcher on this host is healthy, else 1 "
                                 "(for exec probes)")
    health.add_argument("--port", type=tcp_port,
                        help="the dispatcher's --metrics-port (default $PGPOOL_METRICS_PORT)")
    health.add_argument("--host", default="127.0.0.1", metavar="ADDRESS",
                        help="where the dispatcher serves it (default 127.0.0.1)")
    health.add_argument("--timeout", type=positive_seconds, default=5.0,
                        help="seconds to wait for the answer (default 5)")
    health.add_argument("--dsn", help="PostgreSQL DSN to read the xmin horizon from (default: "
                                      "$PGPOOL_DSN, then the PG* environment; never the "
                                      "embedded server: without one, no horizon is read)")
    health.add_argument("--horizon-warn", **horizon_warn)
    health.set_defaults(func=cmd_health)

    budget = sub.add_parser("budget", parents=[common],
                            help="show or set the claims per second the whole fleet shares")
    budget.add_argument("--dsn", help=dsn_help)
    budget.set_defaults(func=cmd_budget, action="show")
    # --dsn after the action too; SUPPRESSed when absent, as for the logging options.
    budget_dsn = argparse.ArgumentParser(add_help=False)
    budget_dsn.add_argument("--dsn", default=argparse.SUPPRESS, help=dsn_help)
    actions = budget.add_subparsers(dest="action", parser_class=_Parser,
                                    help="what to do (default: show)")
    actions.add_parser("show", parents=[common, budget_dsn],
                       help="print the fleet's budget (the default)")
    set_budget = actions.add_parser("set", parents=[common, budget_dsn],
                                    help="set the fleet's budget; hosts take it at their "
                                         "next beat")
    set_budget.add_argument("rate", type=claims_rate, metavar="N",
                            help="claims per second for the whole fleet")
    actions.add_parser("unset", parents=[common, budget_dsn],
                       help="clear it: each host uses its --max-claims-per-sec again")

    grant = sub.add_parser("grants", parents=[common],
                           help="print (or apply) least-privilege grants for an application "
                                "role and a worker role")
    grant.add_argument("--app", metavar="ROLE",
                       help="the role applications enqueue and read status as")
    grant.add_argument("--worker", metavar="ROLE", help="the role `pgpool run` connects as")
    grant.add_argument("--schema", metavar="NAME",
                       help="the schema holding pgpool's tables (default: where they are "
                            "found through the DSN's search_path)")
    grant.add_argument("--apply", action="store_true",
                       help="run the statements (as the tables' owner) instead of printing "
                            "them")
    grant.add_argument("--dsn", help=dsn_help)
    grant.set_defaults(func=cmd_grants)

    where = sub.add_parser("dsn", parents=[common],
                           help="print the DSN an application should use to reach pgpool's "
                                "database (starts the embedded server if that is the default)")
    where.add_argument("--dsn", help=dsn_help)
    where.set_defaults(func=cmd_dsn)

    bench = sub.add_parser("bench", parents=[common, sizing],
                           help="measure this host and database in a throwaway schema")
    bench.add_argument("--dsn", help=dsn_help)
    bench.add_argument("--jobs", type=positive_int, default=20_000,
                       help="jobs to seed and drain (default 20000)")
    bench.add_argument("--profile", choices=("noop", "cpu", "sleep", "mixed"), default="noop",
                       help="what each job does: nothing, ~5 ms of CPU, a 2-5 ms sleep, or "
                            "a mix of the three (default noop)")
    bench.add_argument("--backlog", type=_number(int, minimum=0, inclusive=True,
                                                 maximum=100_000_000,
                                                 what="a number of jobs from 0 to 100000000"),
                       default=0, metavar="N",
                       help="first fill the table with N jobs due in a day, so claims and "
                            "the ceilings work on a deep table (default 0)")
    bench.add_argument("--max-claims-per-sec", type=claims_rate, metavar="N",
                       help="apply this fleet claim budget, as for run (default: none, so "
                            "the drive measures the engine; its claims/s are compared with "
                            f"run's default budget, {DEFAULT_MAX_CLAIMS_PER_SEC:g})")
    bench.add_argument("--metrics", action="store_true",
                       help="serve /metrics during the drive, as run --metrics-port does "
                            "(to measure what the metrics cost)")
    bench.add_argument("--json", action="store_true", help="print one JSON object instead")
    bench.set_defaults(func=cmd_bench)
    web = sub.add_parser("web", parents=[common],
                         help="serve the live dashboard (needs the web extra: "
                              "pip install 'pgpool[web]')")
    web.add_argument("--dsn", help=dsn_help)
    web.add_argument("--host", metavar="ADDRESS",
                     help="address to serve on (env PGPOOL_WEB_HOST; default 127.0.0.1: "
                          "this machine only)")
    web.add_argument("--port", type=tcp_port,
                     help="port to serve on (env PGPOOL_WEB_PORT; default 8080)")
    web.add_argument("--read-write", action="store_true",
                     help="allow actions (cancel, pause, resume, replay, purge); default "
                          "read-only. Off loopback, only with PGPOOL_WEB_USER and "
                          "PGPOOL_WEB_PASSWORD set")
    web.add_argument("--allow-payloads", action="store_true",
                     help="show job payloads and error text, and the query and client "
                          "address of a session holding back vacuum (user data; hidden by "
                          "default)")
    web.add_argument("--horizon-warn", **horizon_warn)
    web.set_defaults(func=cmd_web)
    # Imported here, not at the top: worker processes import this module and never parse.
    from . import devdb
    from . import operate as ops_cli

    ops_cli.add_commands(sub, common, dsn_help)
    devdb.add_command(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the real command line: hide a password before anything slow
        from .passwords import hide_passwords

        hide_passwords()
    args = build_parser().parse_args(argv)
    level, log_format = _log_settings(args)
    if level not in LOG_LEVELS:
        print(f"pgpool: error: PGPOOL_LOG_LEVEL={level!r} is not one of "
              f"{', '.join(LOG_LEVELS)}", file=sys.stderr)
        return 2
    if log_format not in logs.LOG_FORMATS:
        print(f"pgpool: error: PGPOOL_LOG_FORMAT={log_format!r} is not one of "
              f"{', '.join(logs.LOG_FORMATS)}", file=sys.stderr)
        return 2
    logs.configure(level, log_format, sys.stderr)
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    try:
        return int(args.func(args))
    except PgpoolError as exc:
        print(f"pgpool: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if (status := _database_failure(exc)) is not None:
            return status
        if os.environ.get("PGPOOL_DEBUG"):
            raise
        # The last line of defence: users never see a traceback.
        print(f"pgpool: internal error: {type(exc).__name__}: {exc} (set PGPOOL_DEBUG=1 to "
              "see the traceback, and please report it)", file=sys.stderr)
        return 1


def _database_failure(exc: Exception) -> int | None:
    """Print what a failure of the database means and return the exit status, or None if
    ``exc`` is not one. psycopg is imported here, on the way out, and not before the command
    runs: `pgpool run` starts its workers before it pays for that import."""
    import psycopg
    import psycopg_pool

    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        print(f"pgpool: error: the database refused: {first_line(exc)}: grant this role "
              "the privileges pgpool needs (migrations need CREATE on the schema; `pgpool "
              "grants` prints an application's and a worker's)", file=sys.stderr)
        return 2
    if isinstance(exc, psycopg_pool.PoolTimeout):
        print(f"pgpool: error: could not open database connections ({first_line(exc)}): "
              "check that the server accepts more connections (max_connections)",
              file=sys.stderr)
        return 2
    if isinstance(exc, psycopg.OperationalError):
        print(f"pgpool: error: lost the database: {first_line(exc)}: check that the server "
              "is up and reachable, then run the command again", file=sys.stderr)
        return 2
    return None


_early_signals: list[int] = []


def _record_signal(signum: int, frame: object) -> None:
    # Only records the request: the dispatcher acts on it once its event loop runs.
    _early_signals.append(signum)


def apply_environment(args: argparse.Namespace, dests: Sequence[str] = tuple(_RUN_VARIABLES)
                      ) -> None:
    """Fill each `RUN_ENVIRONMENT` option in ``dests`` not given as a flag from its variable,
    else its default; `ConfigError` naming the variable if its value is bad."""
    for dest, variable, parse, default in RUN_ENVIRONMENT:
        if dest in dests and getattr(args, dest) is None:
            value = _from_env(None, variable, parse)
            setattr(args, dest, default if value is None else value)


def _log_settings(args: argparse.Namespace) -> tuple[str, str]:
    """The log level and format: the options, else the environment, else INFO and text."""
    return (args.log_level or os.environ.get("PGPOOL_LOG_LEVEL", "INFO").upper(),
            args.log_format or os.environ.get("PGPOOL_LOG_FORMAT", "text").lower())


def cmd_run(args: argparse.Namespace) -> int:
    extras.require("worker", "pgpool run")
    apply_environment(args)
    portable.check(args.max_memory)
    # A SIGTERM while handler modules import or the database is checked must still mean
    # "stop gracefully", not instant death: catch it from here on.
    from ..host import pid1 as init

    for sig in init.FORWARDED:
        signal.signal(sig, _record_signal)
    # As PID 1 (a container without an init), a small init stays PID 1 to reap orphans and
    # forward signals, and the dispatcher goes on in a child.
    init.split_if_pid1(_early_signals)
    from ..db import dsn as dsnlib
    from ..host import pool

    modules = registry.resolve_modules(args.handlers)
    found = registry.entry_point_modules()
    procs = _resolve_procs(args.procs, args.max_memory)
    log_level, log_format = _log_settings(args)  # checked by main
    dsn, source = dsnlib.locate(args.dsn)
    max_memory = args.max_memory * 2**20 if args.max_memory else None
    # The workers start now (a fresh interpreter each, importing the handler modules) while
    # this process imports psycopg and the dispatcher, checks the DSN and loads the handler
    # modules itself: start-up takes the longer of the two, not their sum. Their handlers
    # reach the host's database through PGPOOL_DSN (a group's callback reading its members),
    # in their environment from their start; an invalid one ends them with this process.
    os.environ["PGPOOL_DSN"] = dsn
    launched = {i: pool.launch(i, (*modules, *found), (args.max_tasks_per_child, max_memory),
                               (log_level, log_format), cpu=args.fair_by == "cpu")
                for i in range(procs)}
    try:
        return _run_dispatcher(args, RunConfig(
            dsn=dsnlib.normalise(dsn, source),
            modules=(*modules, *found),
            procs=procs,
            queues=tuple(dict.fromkeys(args.queue)),
            batch=args.batch,
            lease=args.lease,
            timeout=args.timeout,
            grace=args.grace,
            burst=args.burst,
            poll=args.poll,
            idle_poll=args.idle_poll,
            max_tasks_per_child=args.max_tasks_per_child,
            spare_workers=args.spare_workers,
            max_claims_per_sec=args.max_claims_per_sec,
            tenant_cap=args.tenant_cap,
            fair_by=args.fair_by,
            max_memory=max_memory,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
            dead_retention=args.dead_retention or None,
            keep_done=args.keep_done or None,
            log_level=log_level,
            log_format=log_format,
            log_errors=args.log_errors,
            log_jobs=args.log_jobs,
            log_summary=args.log_summary or None,
        ), modules, found, launched)
    finally:
        for worker in launched.values():  # those the dispatcher never adopted
            pool.abandon(worker)


def _run_dispatcher(args: argparse.Namespace, config: RunConfig, modules: list[str],
                    found: dict[str, str], launched: dict[int, Launched]) -> int:
    """`cmd_run`'s dispatcher, with the workers it ``launched`` (taken out as they are
    adopted), once this process has loaded the handler modules too."""
    from .. import schedules
    from ..host.dispatcher import Dispatcher

    handlers = registry.select(registry.load(modules, found), args.kinds)
    if _early_signals:
        return 0  # asked to stop before anything started: nothing to hand back
    return Dispatcher(config, handlers, early_signals=_early_signals,
                      schedules=schedules.declared(), workers=launched).run_sync()


def _from_env(value: Any, variable: str, parse: Callable[[str], Any]) -> Any:
    """The flag's value if given, else the environment variable's, parsed like the flag."""
    if value is not None or variable not in os.environ:
        return value
    try:
        return parse(os.environ[variable])
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"{variable}: {exc}") from None


def cmd_health(args: argparse.Namespace) -> int:
    import urllib.error
    import urllib.request

    port = _from_env(args.port, "PGPOOL_METRICS_PORT", tcp_port)
    if port is None:
        raise ConfigError("pgpool health asks a running dispatcher: give --port (its "
                          "--metrics-port) or set PGPOOL_METRICS_PORT")
    horizon_warn = _horizon_warn(args)
    url = f"http://{args.host}:{port}/healthz"
    healthy = False
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as answer:
            print(f"pgpool: healthy: {answer.read().decode().strip()}")
            healthy = True
    except urllib.error.HTTPError as exc:
        print(f"pgpool: unhealthy: {exc.read().decode().strip()}")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        print(f"pgpool: unhealthy: no dispatcher answered on {args.host}:{port} ({reason})")
    if horizon_warn is not None:
        _horizon_health(args.dsn, horizon_warn, args.timeout)
    # A held horizon never fails the check: restarting a dispatcher does not release it,
    # and a liveness probe failing on it would restart healthy hosts.
    return 0 if healthy else 1


def _horizon_health(cli_dsn: str | None, warn_after: float, timeout: float) -> None:
    """Print the horizon's warning, if any, from the configured database; never start the
    embedded server for it, and say in one line when it cannot be read."""
    import psycopg

    from ..db import dsn as dsnlib
    from ..horizon import collect

    dsn = dsnlib.configured(cli_dsn)
    if dsn is None:
        return
    try:
        with dsnlib.connect(dsn, autocommit=True, connect_timeout=max(1, round(timeout))
                            ) as conn:
            conn.execute(f"SET statement_timeout = {round(timeout * 1000)}")
            warning = collect(conn, warn_after)["warning"]
    except psycopg.Error as exc:
        print(f"pgpool: horizon not read: {first_line(exc)}")
        return
    except PgpoolError as exc:  # cannot connect: the message says where and why
        print(f"pgpool: horizon not read: {' '.join(str(exc).split())}")
        return
    if warning:
        print(f"pgpool: warning: {warning}")


def cmd_web(args: argparse.Namespace) -> int:
    from ..db import dsn as dsnlib
    from ..web.config import MISSING_EXTRA, WebConfig, credentials

    user, password = credentials()
    port = _from_env(args.port, "PGPOOL_WEB_PORT", tcp_port)
    config = WebConfig(
        dsn="", host=_from_env(args.host, "PGPOOL_WEB_HOST", str) or "127.0.0.1",
        port=8080 if port is None else port,
        read_write=args.read_write, allow_payloads=args.allow_payloads, user=user,
        password=password, horizon_warn=_horizon_warn(args))
    config.check()
    try:
        from ..web import server
    except ImportError:
        raise ConfigError(MISSING_EXTRA) from None
    if not config.auth and not config.loopback:
        log.warning("serving the dashboard on %s without authentication: anyone who reaches "
                    "it sees the queue; set PGPOOL_WEB_USER and PGPOOL_WEB_PASSWORD",
                    config.host)
    dsn = dsnlib.resolve(args.dsn)
    with dsnlib.connect(dsn, autocommit=True) as conn:
        schema.check(conn)
    return server.serve(dataclasses.replace(config, dsn=dsn))


def _resolve_procs(value: int | Literal["auto"], max_memory_mib: int | None = None) -> int:
    """``--procs``: auto is `config.auto_procs` (CPUs, and the memory limit at
    --max-memory); more than 4x the CPUs, or more than the memory limit holds, is allowed
    with a warning."""
    cpus = usable_cpus()
    max_memory = max_memory_mib * 2**20 if max_memory_mib else None
    if value == "auto":
        procs = auto_procs(max_memory)
        if procs < cpus:
            log.info("--procs auto: %d workers, not %d (one per usable CPU): the memory "
                     "limit holds no more at --max-memory %d MiB each", procs, cpus,
                     max_memory_mib)
        return procs
    if value > 4 * cpus:
        log.warning("--procs %d is more than 4x the %d usable CPUs: CPU-bound handlers will "
                    "only take turns; use fewer processes", value, cpus)
    fit = workers_that_fit(max_memory)
    if fit is not None and value > fit:
        log.warning("--procs %d at --max-memory %d MiB each is more than the memory limit "
                    "holds: the kernel may kill workers; use fewer processes or less memory",
                    value, max_memory_mib)
    return value


def cmd_migrate(args: argparse.Namespace) -> int:
    from ..db import dsn as dsnlib

    dsn = dsnlib.resolve(args.dsn)
    with dsnlib.connect(dsn, autocommit=True) as conn:
        for m in schema.to_drain_for(schema.schema_version(conn)):
            print(f"pgpool: warning: migration {m.version} {m.drain}; stop every `pgpool run` "
                  "host first (or migrate while the tables are small)", file=sys.stderr)
        applied = schema.migrate(conn)
        found = schema.locate(conn)
    where = f'in schema "{found.schema}" at {dsnlib.describe(dsn)}'
    if applied[:1] == [schema.MIGRATIONS[0].version] and found.elsewhere:
        others = ", ".join(f'"{name}"' for name in found.elsewhere)
        print(f"pgpool: notice: pgpool is also installed in schema {others}, not on this "
              f'DSN\'s search_path: the installation in "{found.schema}" is a separate one, '
              "with jobs of its own", file=sys.stderr)
    if applied:
        print(f"pgpool: schema migrated to version {schema.SCHEMA_VERSION} "
              f"(applied {', '.join(map(str, applied))}) {where}")
    else:
        print(f"pgpool: schema already at version {schema.SCHEMA_VERSION} {where}")
    return 0


def cmd_enqueue(args: argparse.Namespace) -> int:
    from ..db import dsn as dsnlib

    text = _payload_text(args.payload)
    try:
        # The stdlib parser keeps big integers exact (orjson would round them to floats,
        # silently changing the data); encode_payload then refuses what JSON cannot hold.
        payload = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        hint = ("" if args.payload == "-" or args.payload.startswith("@")
                else """; quote it for the shell, e.g. '{"n": 1}'""")
        raise ConfigError(f"the JSON payload is not valid JSON ({exc}){hint}") from None
    except RecursionError:  # nested deeper than about 1000 levels
        raise too_deep() from None
    dsn = dsnlib.resolve(args.dsn)
    with dsnlib.connect(dsn, autocommit=True) as conn:
        schema.check(conn)
        job_id = enqueue(conn, args.kind, payload, queue=args.queue, priority=args.priority,
                         delay=args.delay, unique_key=args.unique_key,
                         max_attempts=args.max_attempts, tenant=args.tenant,
                         concurrency_key=args.concurrency_key)
        served = conn.execute(sql.KIND_SERVED, {"queue": args.queue, "kind": args.kind,
                                                "stale_leases": STALE_AFTER_LEASES}).fetchone()[0]
    if job_id is None:
        print(f"pgpool: not enqueued: a {args.kind} job with unique key {args.unique_key!r} "
              "is already ready or running", file=sys.stderr)
        return 0
    print(job_id)
    if not served:
        print(f"pgpool: notice: no live host serves kind {args.kind} on queue {args.queue}: "
              "the job waits until one does (start `pgpool run` with a handler for it"
              + ("" if args.queue == "default" else f" and --queue {args.queue}") + ")",
              file=sys.stderr)
    return 0


def _payload_text(arg: str) -> str:
    """The JSON text of ``pgpool enqueue``'s payload argument: itself, or stdin for ``-``,
    or a file's contents for ``@FILE``; never more than the payload limit allows."""
    if arg != "-" and not arg.startswith("@"):
        return arg
    # The compact encoding stored is usually smaller than the text read, but not always
    # (\u escapes shrink; spaces go): allow 4x the limit, plus room for a final newline.
    cap = 4 * max_payload_bytes() + 2
    if arg == "-":
        data = sys.stdin.buffer.read(cap + 1)
        where = "stdin"
    else:
        path = arg[1:]
        where = f"file {path!r}"
        if not path:
            raise ConfigError("@ must be followed by a file name, e.g. @payload.json")
        try:
            with open(path, "rb") as f:
                data = f.read(cap + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read the payload from {where}: "
                              f"{exc.strerror or exc}") from None
    if len(data) > cap:
        raise ConfigError(f"the payload from {where} is over {cap:,} bytes, 4 times the "
                          f"{max_payload_bytes():,}-byte limit: store large data elsewhere "
                          "and pass a reference, or raise PGPOOL_MAX_PAYLOAD_BYTES")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"the payload from {where} is not UTF-8: save it as UTF-8 "
                          "JSON") from None


def _unique_key(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("the key is empty: give a non-empty key, or leave "
                                         "out --unique-key")
    return text


def cmd_status(args: argparse.Namespace) -> int:
    from ..db import dsn as dsnlib
    from ..horizon import DeadRowsTrend
    from ..observe import collect
    from .status import render

    horizon_warn = _horizon_warn(args)
    dsn = dsnlib.resolve(args.dsn)
    with dsnlib.connect(dsn, autocommit=True) as conn:
        schema.check(conn)
        if args.watch is None:
            report = collect(conn, horizon_warn)
            print(json.dumps(report) if args.json else render(report))
            return 0
        clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() and not args.json else ""
        trend = DeadRowsTrend()  # a watch sees the dead rows grow; one report cannot
        try:
            while True:
                report = collect(conn, horizon_warn)
                trend.add(report["horizon"])
                if args.json:
                    print(json.dumps(report), flush=True)
                else:
                    print(f"{clear}every {args.watch:g}s (Ctrl-C to stop)\n"
                          f"{render(report)}\n", flush=True)
                time.sleep(args.watch)
        except KeyboardInterrupt:  # the way out of a watch, not an error
            return 0


def cmd_budget(args: argparse.Namespace) -> int:
    """Show, set or clear the fleet's claims/s budget (the one pgpool_fleet row)."""
    import psycopg

    from ..db import dsn as dsnlib

    dsn = dsnlib.resolve(args.dsn)
    with dsnlib.connect(dsn, autocommit=True) as conn:
        schema.check_version(schema.schema_version(conn))
        if args.action in ("set", "unset"):
            try:
                conn.execute(sql.FLEET_SET, {
                    "max_claims_per_sec": args.rate if args.action == "set" else None})
            except psycopg.errors.InsufficientPrivilege:
                raise ConfigError("this role may not change the fleet's budget: run `pgpool "
                                  "budget` as the owner of pgpool's tables") from None
        row = conn.execute(sql.FLEET_SHOW).fetchone()
    rate, since = row if row else (None, None)
    if rate is None:
        print("fleet budget: not set; each host uses its --max-claims-per-sec (default "
              f"{DEFAULT_MAX_CLAIMS_PER_SEC:g} claims/s)")
    else:
        print(f"fleet budget: {rate:g} claims/s, shared by demand (set "
              f"{since:%Y-%m-%d %H:%M:%S%z}); hosts take a change at their next beat")
    return 0


def cmd_grants(args: argparse.Namespace) -> int:
    """Print, or with --apply run, the least-privilege grants (pgpool.db.grants)."""
    import psycopg

    from ..db import dsn as dsnlib
    from ..db import grants

    if not (args.app or args.worker):
        raise ConfigError("give --app ROLE, --worker ROLE or both: the roles to grant to")
    if args.schema and not args.apply:
        for statement in grants.statements(args.schema, app=args.app, worker=args.worker):
            print(statement.as_string(None) + ";")
        return 0
    dsn = dsnlib.resolve(args.dsn)
    with dsnlib.connect(dsn, autocommit=True) as conn:
        schema.check_version(schema.schema_version(conn))
        found, owner = conn.execute(INSTALLED_SCHEMA).fetchone()
        where = args.schema or found
        statements = grants.statements(where, app=args.app, worker=args.worker)
        if not args.apply:
            for statement in statements:
                print(statement.as_string(conn) + ";")
            return 0
        if not owner:
            raise ConfigError("the database refused: this role does not own pgpool's tables: "
                              "apply the grants as the owner of pgpool's tables")
        try:
            with conn.transaction():
                for statement in statements:
                    conn.execute(statement)
        except psycopg.errors.UndefinedObject as exc:
            raise ConfigError(f"{first_line(exc)}: create the role first "
                              "(CREATE ROLE ... LOGIN)") from None
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigError(f"the database refused: {first_line(exc)}: apply the grants "
                              "as the owner of pgpool's tables") from None
    roles = " and the ".join(f"{what} role {role}" for what, role in
                         (("application", args.app), ("worker", args.worker)) if role)
    print(f"pgpool: granted the {roles} their privileges on pgpool's tables in schema {where}")
    return 0


def cmd_dsn(args: argparse.Namespace) -> int:
    """Print the configured DSN as given (validated), or the embedded server's."""
    from ..db import dsn as dsnlib

    dsn, source = dsnlib.locate(args.dsn)
    dsnlib.normalise(dsn, source)
    if source == dsnlib.PG_ENVIRONMENT:
        print("pgpool: the PG* environment (PGHOST, PGDATABASE, ...) selects the database: "
              "an empty DSN uses it", file=sys.stderr)
    elif source == dsnlib.EMBEDDED:
        print("pgpool: the embedded server runs while a pgpool process uses it (`pgpool db "
              "start` keeps it up); this DSN stays valid across its restarts", file=sys.stderr)
    print(dsn)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Seed and drive jobs in a schema of its own, dropped at the end; print the figures."""
    extras.require("worker", "pgpool bench")  # before the imports that need it
    from ..bench.options import BenchOptions
    from ..bench.progress import Progress
    from ..bench.report import render
    from ..bench.run import run
    from ..db import dsn as dsnlib

    if args.log_level is None and "PGPOOL_LOG_LEVEL" not in os.environ:
        logging.getLogger("pgpool").setLevel(logging.WARNING)  # the report is the output
    apply_environment(args, ("procs", "batch"))  # the sizing options it shares with run
    opts = BenchOptions(dsn=dsnlib.resolve(args.dsn), jobs=args.jobs,
                        procs=_resolve_procs(args.procs),
                        batch=args.batch, profile=args.profile, backlog=args.backlog,
                        max_claims_per_sec=args.max_claims_per_sec, metrics=args.metrics)
    report = run(opts, Progress(sys.stderr))
    print(json.dumps(report) if args.json else render(report))
    return 0


def _reject_constant(name: str) -> None:
    raise json.JSONDecodeError(f"{name} is not valid JSON", name, 0)
