"""The operator commands of ``pgpool``: jobs, dead, cancel, retry, pause, resume.

Each parses its options, calls the `pgpool.ops` function on an autocommit connection and
prints the result (text, or ``--json``). The functions check their input and raise
`PgpoolError`s, which the CLI prints as one line; nothing is changed then.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .. import names, ops, outcomes
from ..db import schema
from ..errors import ConfigError
from ..horizon import span
from ..host.config import parse_duration
from ..limits import OVERRIDE_BY
from .status import busiest_scopes

if TYPE_CHECKING:
    import psycopg


def duration(text: str) -> float:
    """argparse type: ``90s``, ``15m``, ``2h``, ``7d``... in seconds."""
    try:
        return parse_duration(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _job_id(text: str) -> int:
    try:
        return ops.parse_job_id(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of jobs per "
                                         "second")
    return value


def _rate_per(text: str) -> tuple[int, float]:
    """``R/PERIOD`` of ``pgpool limits set --rate``: R jobs per PERIOD (a duration, 1s, 1m,
    1h, or seconds)."""
    count, _, period = text.partition("/")
    try:
        rate = int(count)
        per = duration(period or "1s")
    except (ValueError, argparse.ArgumentTypeError):
        rate, per = 0, 0.0
    if rate <= 0 or per <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rate: give R/PERIOD, e.g. 100/1m "
                                         "or 20/1s")
    return rate, per


def add_commands(sub: Any, common: argparse.ArgumentParser, dsn_help: str) -> None:
    """Add the operator commands to the ``pgpool`` parser's subcommands ``sub``."""
    def command(name: str, help: str, func: Callable[[argparse.Namespace], int],
                into: Any = sub, dsn_default: object = None) -> argparse.ArgumentParser:
        p = into.add_parser(name, parents=[common], help=help)
        p.add_argument("--dsn", help=dsn_help, default=dsn_default)
        p.set_defaults(func=func)
        return p

    def dry_run(p: argparse.ArgumentParser) -> None:
        p.add_argument("--dry-run", action="store_true",
                       help="say what would change, and change nothing")

    jobs = sub.add_parser("jobs", parents=[common],
                          help="list live jobs (ready, scheduled, running, waiting); "
                          "`jobs show ID`")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", parser_class=type(jobs),
                                   help="without one: list jobs")
    jobs.add_argument("--dsn", help=dsn_help)
    jobs.add_argument("--queue", type=names.name_arg("queue"), help="only this queue")
    jobs.add_argument("--kind", type=names.name_arg("kind"), help="only this kind")
    jobs.add_argument("--state", choices=ops.JOB_STATES,
                      help="only jobs that are ready (due), scheduled (due later), running, "
                      "waiting (a group's callback, until its members have finished), "
                      "parked or done (their ack was refused)")
    jobs.add_argument("--group", type=_job_id, metavar="ID",
                      help="only the members of this group (its id is its callback's: "
                      "`jobs show ID` shows its progress)")
    jobs.add_argument("--older-than", type=duration, metavar="DURATION",
                      help="only jobs enqueued longer ago than this (90s, 15m, 2h, 7d)")
    jobs.add_argument("--limit", type=_positive, default=ops.DEFAULT_LIMIT, metavar="N",
                      help=f"list at most N (default {ops.DEFAULT_LIMIT})")
    jobs.add_argument("--json", action="store_true", help="one JSON object per line")
    jobs.add_argument("--payload", action="store_true",
                      help="include payloads (user data: shown only when asked for)")
    jobs.set_defaults(func=cmd_jobs)
    # Its --dsn is SUPPRESSed when absent, so that `jobs --dsn X show ID` keeps X.
    show = command("show", "show one job: live, with its whole last error, or kept as done "
                   "after its success; a group's callback with its group's progress",
                   cmd_jobs_show, jobs_sub, argparse.SUPPRESS)
    show.add_argument("id", type=_job_id, help="the job's id")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.add_argument("--payload", action="store_true", help="include the payload")
    show.add_argument("--result", action="store_true",
                      help="include a finished job's result (user data: shown only when "
                      "asked for)")

    dead = sub.add_parser("dead", parents=[common],
                          help="dead jobs: list (--group), show, replay, purge")
    dead_sub = dead.add_subparsers(dest="dead_command", required=True, metavar="COMMAND",
                                   parser_class=type(dead),
                                   help="what to do (`pgpool dead COMMAND --help`)")
    listing = command("list", "list dead jobs, newest first, or --group them", cmd_dead_list,
                      dead_sub)
    _dead_filters(listing)
    listing.add_argument("--group", action="store_true",
                         help="count by kind, reason and error signature instead (the triage "
                         "view)")
    listing.add_argument("--limit", type=_positive, default=ops.DEFAULT_LIMIT, metavar="N",
                         help=f"list at most N rows (default {ops.DEFAULT_LIMIT})")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.add_argument("--payload", action="store_true",
                         help="include payloads (user data: shown only when asked for)")
    show = command("show", "show one dead job, with its whole last error", cmd_dead_show,
                   dead_sub)
    show.add_argument("id", type=_job_id, help="the dead job's id")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.add_argument("--payload", action="store_true", help="include the payload")
    replay = command("replay", "move dead jobs back to ready (same id, attempts from 0), "
                     "optionally trickled at --rate", cmd_dead_replay, dead_sub)
    _dead_filters(replay)
    replay.add_argument("--all", action="store_true",
                        help="every dead job (needed when no filter or --limit is given)")
    replay.add_argument("--limit", type=_positive, metavar="N", help="at most N jobs")
    replay.add_argument("--rate", type=_rate, metavar="JOBS_PER_S",
                        help="at most this many jobs per second, in small transactions")
    dry_run(replay)
    purge = command("purge", "delete dead jobs older than --older-than, in bounded batches",
                    cmd_dead_purge, dead_sub)
    _dead_filters(purge, older_than_required=True)
    purge.add_argument("--limit", type=_positive, metavar="N", help="at most N jobs")
    purge.add_argument("--force", action="store_true",
                       help="delete members of groups whose callback has not run yet too "
                       "(kept by default: the callback reads them)")
    dry_run(purge)

    cancel = command("cancel", "cancel jobs: ready or scheduled ones never run, running ones "
                     "are stopped; each moves to the dead jobs (reason cancelled)", cmd_cancel)
    cancel.add_argument("ids", type=_job_id, nargs="+", metavar="ID", help="job ids")
    dry_run(cancel)
    retry = command("retry", "run jobs waiting out a retry's backoff (or a delay) now",
                    cmd_retry)
    retry.add_argument("ids", type=_job_id, nargs="+", metavar="ID", help="job ids")
    dry_run(retry)
    limits = sub.add_parser("limits", parents=[common],
                            help="the kinds' limits and their use; `limits set`, `limits reset`")
    limits_sub = limits.add_subparsers(dest="limits_command", parser_class=type(limits),
                                       help="without one: list the limits")
    limits.add_argument("--dsn", help=dsn_help)
    limits.add_argument("--json", action="store_true", help="one JSON object per line")
    limits.set_defaults(func=cmd_limits)
    limit_set = command("set", "override a kind's limit on every host (logged by each), "
                        "until `limits reset`", cmd_limits_set, limits_sub, argparse.SUPPRESS)
    limit_set.add_argument("kind", type=names.name_arg("kind"), help="the kind")
    limit_set.add_argument("--concurrency", type=_positive, metavar="N",
                           help="at most N of its jobs running at once, fleet-wide")
    limit_set.add_argument("--rate", type=_rate_per, metavar="R/PERIOD",
                           help="at most R of its jobs started in any PERIOD (100/1m, 20/1s)")
    limit_set.add_argument("--by", choices=OVERRIDE_BY,
                           help="what the limit is counted per: each tenant, each "
                           "concurrency key, or the kind as a whole")
    dry_run(limit_set)
    limit_reset = command("reset", "drop a kind's override: the code's limit holds again",
                          cmd_limits_reset, limits_sub, argparse.SUPPRESS)
    limit_reset.add_argument("kind", type=names.name_arg("kind"), help="the kind")
    dry_run(limit_reset)

    pause = command("pause", "stop claiming from a queue on every host (running jobs "
                    "finish) until `pgpool resume`", cmd_pause)
    pause.add_argument("queue", type=names.name_arg("queue"), help="the queue")
    pause.add_argument("--force", action="store_true",
                       help="pause a queue no job, dead job or host names yet")
    dry_run(pause)
    resume = command("resume", "claim from a paused queue again", cmd_resume)
    resume.add_argument("queue", type=names.name_arg("queue"), help="the queue")
    dry_run(resume)


def _dead_filters(p: argparse.ArgumentParser, *, older_than_required: bool = False) -> None:
    p.add_argument("--id", type=_job_id, action="append", dest="ids", metavar="ID",
                   help="only this dead job (repeatable)")
    p.add_argument("--queue", type=names.name_arg("queue"), help="only this queue")
    p.add_argument("--kind", type=names.name_arg("kind"), help="only this kind")
    p.add_argument("--error", metavar="TEXT", help="only jobs whose last error contains TEXT")
    p.add_argument("--signature", metavar="SIG",
                   help="only jobs with this error signature (as `dead list --group` shows)")
    p.add_argument("--reason", choices=ops.DEAD_REASONS,
                   help="only jobs that failed, only cancelled ones (by an operator or "
                   "their handler), or only those their handler discarded")
    p.add_argument("--since", type=duration, metavar="DURATION",
                   help="only jobs that died within this long (90s, 15m, 2h, 7d)")
    p.add_argument("--older-than", type=duration, metavar="DURATION",
                   required=older_than_required,
                   help="only jobs that died longer ago than this")


def _dead_filter(args: argparse.Namespace) -> ops.DeadFilter:
    return ops.DeadFilter(ids=args.ids, queue=args.queue, kind=args.kind, error=args.error,
                          signature=args.signature, reason=args.reason, since=args.since,
                          older_than=args.older_than)


@contextmanager
def _connect(args: argparse.Namespace) -> Iterator[psycopg.Connection]:
    from ..db import dsn as dsnlib

    with dsnlib.connect(dsnlib.resolve(args.dsn), autocommit=True) as conn:
        schema.check_version(schema.schema_version(conn))
        yield conn


# --- commands -----------------------------------------------------------------------------

def cmd_jobs(args: argparse.Namespace) -> int:
    where = ops.JobFilter(queue=args.queue, kind=args.kind, state=args.state,
                          older_than=args.older_than, group=args.group)
    with _connect(args) as conn:
        _check_queue(conn, args.queue)
        if args.group is not None:
            outcomes.group_status(conn, args.group)  # GroupNotFound: a one-line error
        listing = ops.list_jobs(conn, where, limit=args.limit, payload=args.payload)
    if args.json:
        _json_lines(j.as_dict() for j in listing.rows)
        return 0
    now = datetime.now(UTC)
    header = ["ID", "KIND", "QUEUE", "STATE", "ATTEMPTS", "DUE / LEASE", "OWNER", "ERROR"]
    # Only when a listed job reported progress: most listings have none.
    progress = any(j.progress is not None for j in listing.rows)
    if progress:
        header.append("PROGRESS")
    if args.payload:
        header.append("PAYLOAD")
    rows = []
    for j in listing.rows:
        row = [j.id, j.kind, j.queue, j.state, _attempts(j.attempts, j.max_attempts),
               _due(j, now), j.owner or "-", _clip(j.error)]
        if progress:
            row.append(_progress(j.progress, now, width=30) if j.progress else "-")
        if args.payload:
            row.append(_payload(j.payload))
        rows.append(row)
    _print_table(header, rows)
    _footer(len(listing.rows), listing.more, "job")
    return 0


def cmd_jobs_show(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        job = ops.show_job(conn, args.id, payload=args.payload, result=args.result)
    if args.json:
        print(json.dumps(job.as_dict()))
        return 0
    now = datetime.now(UTC)
    if isinstance(job, ops.DoneJob):
        print(f"job {job.id}")
        for name, value in [
            ("kind", job.kind), ("queue", job.queue), ("state", "done"),
            ("attempts", job.attempts), ("tenant", job.tenant or "-"),
            ("enqueued", _when(job.created_at, now)),
            ("finished", _when(job.finished_at, now)),
            ("kept until", _utc(job.keep_until)),
            *_groups(job, now),
            ("result", json.dumps(job.result) if args.result
             else "(not shown: --result shows it)"),
            ("payload", "(not kept once a job succeeds)"),
        ]:
            print(f"  {name:<12}{value}")
        return 0
    state = (f"{job.state}, parked: its ack was refused (see its last error), so its result "
             "and follow-ups were not stored" if job.state == "done" else job.state)
    _print_fields(f"job {job.id}", [
        ("kind", job.kind), ("queue", job.queue),
        ("state", state), ("attempts", _attempts(job.attempts, job.max_attempts)),
        ("due / lease", _due(job, now)), ("owner", job.owner or "-"),
        ("priority", job.priority), ("enqueued", _when(job.created_at, now)), *_groups(job, now),
        *_long(job, now, args.payload),
    ], job.last_error, job.payload if args.payload else None, args.payload)
    return 0


def _long(job: ops.LiveJob, now: datetime, with_payload: bool) -> list[tuple[str, object]]:
    """The lines on a long job: its checkpoint (its content is user data: shown with
    ``--payload``) and its progress."""
    lines: list[tuple[str, object]] = []
    if job.checkpoint_at is not None:
        lines.append(("checkpoint", f"stored {_when(job.checkpoint_at, now)}"))
        lines.append(("  state", json.dumps(job.checkpoint) if with_payload
                      else "(not shown: --payload shows it)"))
    if job.progress is not None:
        lines.append(("progress", _progress(job.progress, now)))
    return lines


def _progress(progress: outcomes.Progress, now: datetime, width: int = 60) -> str:
    """``done/total (percent)``, the note, and how old the report is."""
    done = _amount(progress.done)
    if progress.total is not None:
        done += f"/{_amount(progress.total)}"
        if progress.fraction is not None:
            done += f" ({progress.fraction:.0%})"
    note = f" {_clip(progress.note, width)}" if progress.note else ""
    return f"{done}{note}, {_ago(progress.at, now)}"


def _amount(value: float) -> str:
    """A progress count as a reader takes it in: a whole number in full, with thousands
    separators (1,026,671, not 1.02667e+06), anything else to six significant digits."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.6g}"


def _groups(job: ops.LiveJob | ops.DoneJob, now: datetime) -> list[tuple[str, object]]:
    """The lines on a job's groups: the one it is a member of, and its own when it is a
    group's callback (its progress)."""
    lines: list[tuple[str, object]] = []
    if job.group_id is not None:
        lines.append(("member of", f"group {job.group_id} (`pgpool jobs show "
                                    f"{job.group_id}` shows its progress)"))
    g = job.group
    if g is not None:
        lines.append(("group", f"{g.finished}/{g.total} members finished ({g.done} done, "
                               f"{g.dead} dead or cancelled); callback {g.callback}"
                               + ("" if g.completed_at is None else
                                  f"; completed {_when(g.completed_at, now)}")))
    return lines


def cmd_dead_list(args: argparse.Namespace) -> int:
    where = _dead_filter(args)
    with _connect(args) as conn:
        _check_queue(conn, args.queue)
        if args.group:
            groups = ops.group_dead(conn, where, limit=args.limit)
        else:
            listing = ops.list_dead(conn, where, limit=args.limit, payload=args.payload)
    now = datetime.now(UTC)
    if args.group:
        if args.json:
            _json_lines(g.as_dict() for g in groups.rows)
            return 0
        _print_table(["COUNT", "KIND", "REASON", "SIGNATURE", "LAST DIED", "FIRST DIED",
                      "EXAMPLE"],
                     [[g.count, g.kind, g.reason, g.signature or "(no error)",
                       _ago(g.last_died_at, now), _ago(g.first_died_at, now), g.example_id]
                      for g in groups.rows])
        total = sum(g.count for g in groups.rows)
        if not groups.rows:
            print("(no dead jobs match)")
        else:
            print(f"({total} dead jobs in {len(groups.rows)} groups"
                  + ("; more groups match: raise --limit)" if groups.more else ")"))
        return 0
    if args.json:
        _json_lines(d.as_dict() for d in listing.rows)
        return 0
    header = ["ID", "KIND", "QUEUE", "REASON", "ATTEMPTS", "DIED", "ERROR"]
    if args.payload:
        header.append("PAYLOAD")
    rows = []
    for d in listing.rows:
        row = [d.id, d.kind, d.queue, d.reason, _attempts(d.attempts, d.max_attempts),
               _ago(d.died_at, now), _clip(d.error)]
        if args.payload:
            row.append(_payload(d.payload))
        rows.append(row)
    _print_table(header, rows)
    _footer(len(listing.rows), listing.more, "dead job")
    return 0


def cmd_dead_show(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        job = ops.show_dead(conn, args.id, payload=args.payload)
    if args.json:
        print(json.dumps(job.as_dict()))
        return 0
    now = datetime.now(UTC)
    _print_fields(f"dead job {job.id}", [
        ("kind", job.kind), ("queue", job.queue), ("reason", job.reason),
        ("attempts", _attempts(job.attempts, job.max_attempts)),
        ("priority", job.priority), ("enqueued", _when(job.created_at, now)),
        ("died", _when(job.died_at, now)), ("signature", job.signature or "(no error)"),
    ], job.last_error, job.payload if args.payload else None, args.payload)
    return 0


def cmd_dead_replay(args: argparse.Namespace) -> int:
    where = _dead_filter(args)
    if args.all and not where.empty:
        raise ConfigError("conflicting options: --all takes every dead job, and filters "
                          "were given too: drop --all or the filters")
    if where.empty and not args.all and args.limit is None:
        raise ConfigError("say which dead jobs to replay: give filters (--kind, --error, "
                          "--since...), --limit N, or --all for every one")
    with _connect(args) as conn:
        _check_queue(conn, args.queue)
        done = ops.replay_dead(conn, where, limit=args.limit, rate=args.rate,
                               dry_run=args.dry_run)
    if args.dry_run:
        print(f"pgpool: dry run: would replay {_n(done.would_move, 'dead job')}; "
              "nothing changed")
        return 0
    rate = f" at up to {args.rate:g} jobs/s" if args.rate else ""
    print(f"pgpool: replayed {_n(done.moved, 'dead job')} back to ready in "
          f"{done.seconds:.2f}s ({_n(done.batches, 'batch')}{rate})")
    for note in done.notes():
        print(f"pgpool: {note}", file=sys.stderr)
    return 0


def cmd_dead_purge(args: argparse.Namespace) -> int:
    where = _dead_filter(args)
    with _connect(args) as conn:
        _check_queue(conn, args.queue)
        done = ops.purge_dead(conn, where, limit=args.limit, dry_run=args.dry_run,
                              force=args.force)
    if args.dry_run:
        print(f"pgpool: dry run: would delete {_n(done.would_delete, 'dead job')}; "
              "nothing changed")
    else:
        print(f"pgpool: deleted {_n(done.deleted, 'dead job')} in {done.seconds:.2f}s "
              f"({_n(done.batches, 'batch')})")
    for note in done.notes():
        print(f"pgpool: {note}", file=sys.stderr)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        cancelled = ops.cancel(conn, args.ids, dry_run=args.dry_run)
    verb = "would cancel" if args.dry_run else "cancelled"
    for c in cancelled:
        what = (f"was running on {c.owner}; its worker is stopped and the attempt not "
                "retried; it holds its keys until its lease ends, then it is a dead job"
                if c.was == "running" else f"was {c.was}; it will not run")
        print(f"pgpool: {verb} job {c.id} ({what})")
    if args.dry_run:
        print("pgpool: dry run: nothing changed")
    else:
        print(f"pgpool: `pgpool dead list --reason cancelled` lists cancelled jobs; "
              f"`pgpool dead replay --id {cancelled[0].id}` would run one again")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        done = ops.retry(conn, args.ids, dry_run=args.dry_run)
    verb = "would run now" if args.dry_run else "runs now"
    for job_id in done.now:
        print(f"pgpool: job {job_id} {verb}")
    for job_id in done.already_due:
        print(f"pgpool: job {job_id} was already due; unchanged")
    if args.dry_run:
        print("pgpool: dry run: nothing changed")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        changed = ops.pause(conn, args.queue, force=args.force, dry_run=args.dry_run)
    if not changed:
        print(f"pgpool: queue {args.queue} is already paused")
    elif args.dry_run:
        print(f"pgpool: dry run: would pause queue {args.queue}; nothing changed")
    else:
        print(f"pgpool: paused queue {args.queue}: no host claims from it until "
              f"`pgpool resume {args.queue}`; running jobs finish")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        changed = ops.resume(conn, args.queue, dry_run=args.dry_run)
    if not changed:
        print(f"pgpool: queue {args.queue} was not paused")
    elif args.dry_run:
        print(f"pgpool: dry run: would resume queue {args.queue}; nothing changed")
    else:
        print(f"pgpool: resumed queue {args.queue}")
    return 0


def cmd_limits(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        found = ops.limits(conn)
    if args.json:
        _json_lines(u.as_json() for u in found)
        return 0
    if not found:
        print("pgpool: no limit is overridden or in use (the code's limits apply as their "
              "kinds' jobs are claimed)")
        return 0
    rows = [("KIND", "LIMIT", "OVERRIDE", "SET BY", "RUNNING", "RATE USED", "READY",
             "WAITING", "SCOPES")]
    rows += [(u.kind, u.in_force(), "-" if u.override is None else u.override.describe(),
              "-" if u.override is None else u.override.set_by,
              str(u.running), str(u.rate_used), str(u.ready), str(u.waiting),
              str(u.scopes or "-")) for u in found]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    for line in busiest_scopes([u.as_json() for u in found]):
        print(line)
    return 0


def cmd_limits_set(args: argparse.Namespace) -> int:
    rate, per = args.rate if args.rate else (None, None)
    with _connect(args) as conn:
        set_ = ops.set_limit(conn, args.kind, concurrency=args.concurrency, rate=rate, per=per,
                             by=args.by, dry_run=args.dry_run)
    if args.dry_run:
        print(f"pgpool: dry run: would set the limit of kind {args.kind} to "
              f"{set_.describe()}; nothing changed")
    else:
        print(f"pgpool: limit of kind {args.kind} set to {set_.describe()} on every host "
              f"until `pgpool limits reset {args.kind}`")
    return 0


def cmd_limits_reset(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        changed = ops.reset_limit(conn, args.kind, dry_run=args.dry_run)
    if not changed:
        print(f"pgpool: kind {args.kind} had no override")
    elif args.dry_run:
        print(f"pgpool: dry run: would reset the limit of kind {args.kind}; nothing changed")
    else:
        print(f"pgpool: limit of kind {args.kind} reset: the code's limit holds again")
    return 0


# --- formatting ---------------------------------------------------------------------------

def _check_queue(conn: psycopg.Connection, queue: str | None) -> None:
    """A --queue filter naming no queue at all is a typo: say so rather than list nothing."""
    if queue is not None and not ops.queue_known(conn, queue):
        raise ConfigError(f"unknown queue {queue!r}: no job, dead job, live host or pause "
                          "names it; check the name (`pgpool status` lists the queues)")


def _json_lines(rows: Iterator[dict[str, Any]]) -> None:
    for row in rows:
        print(json.dumps(row))


def _footer(shown: int, more: bool, what: str) -> None:
    if not shown:
        print(f"(no {what}s match)")
    else:
        print(f"({shown} {what}s" + ("; more match: raise --limit)" if more else ")"))


def _print_table(header: list[str], rows: list[list[Any]]) -> None:
    if not rows:
        return  # the footer says so
    cells = [header, *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _print_fields(title: str, fields: list[tuple[str, object]], error: str | None,
                  payload: Any, with_payload: bool) -> None:
    print(title)
    for name, value in fields:
        print(f"  {name:<12}{value}")
    print(f"  {'payload':<12}" + (json.dumps(payload) if with_payload
                                   else "(not shown: --payload shows it)"))
    if error:
        print("  last error:")
        for line in error.rstrip().splitlines():
            print(f"    {line}")
    else:
        print(f"  {'last error':<12}-")


def _attempts(attempts: int, max_attempts: int | None) -> str:
    return f"{attempts}/{max_attempts}" if max_attempts else str(attempts)


def _due(job: ops.LiveJob, now: datetime) -> str:
    if job.state == "waiting":
        return "when its group finishes"
    if job.state == "running":
        if job.lease_left is None:
            return "running"
        left = job.lease_left
        return f"lease {span(left)} left" if left >= 0 else f"lease expired {span(-left)} ago"
    seconds = (job.run_at - now).total_seconds()
    return f"in {span(seconds)}" if seconds > 0 else f"due {span(-seconds)} ago"


def _ago(when: datetime, now: datetime) -> str:
    return f"{span((now - when).total_seconds())} ago"


def _when(when: datetime, now: datetime) -> str:
    return f"{_utc(when)} ({_ago(when, now)})"


def _utc(when: datetime) -> str:
    return f"{when.astimezone(UTC):%Y-%m-%d %H:%M:%SZ}"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "es" if noun.endswith("ch") else "s")


def _clip(text: str | None, width: int = 60) -> str:
    if not text:
        return "-"
    return text if len(text) <= width else text[: width - 3] + "..."


def _payload(payload: Any) -> str:
    return _clip(json.dumps(payload), 80)
