"""Chaos soak: two dispatchers drain N jobs while processes and PostgreSQL are killed.

    python tests/support/chaos.py [--jobs 20000] [--groups 5] [--members 10000]
                                  [--parents 1000] [--steps 50] [--limited 200] [--rated 200]
                                  [--seconds 300] [--seed N]
                                  [--keep] [--summary FILE]

What it does, in order, all with real processes and a real server (``chaos_cluster``):

1. Starts its own embedded PostgreSQL in a fresh ``/tmp/pgpool-chaos-*`` directory (deleted
   at the end), migrates, and enqueues ``--jobs`` jobs of `chaosjobs.record` (1-5 ms of
   CPU each; every attempt durably records ``job attempt pid start_ns end_ns``), and the
   group workload (`chaosjobs`' other kinds, recorded the same way with their payloads):
   ``--groups`` groups (``pgpool.group``) sharing ``--members`` members, about 1 in 100 of
   them discarded on purpose (dead, and counted so in their group), each with a callback
   that reads its members (every other one then starts a nested group of 10); and
   ``--parents`` parents that enqueue 0-4 children through ``current_job().enqueue`` and,
   one in five, start a group of 5-30 members through ``current_job().group``. One
   parent in 20 is discarded after enqueueing its follow-ups (so they must never exist),
   one in 10 fails its first claim and is retried. Along with about one fault in three,
   a running member is cancelled (``pgpool.ops.cancel``, as an operator would): its host
   stops it, and it counts as finished in its group. The kinds of the workload keep their
   successes (``keep=``), so ``pgpool_done`` and ``pgpool_groups`` hold every outcome at
   the end. And ``--steps`` long jobs (`chaosjobs.steps`: 20 steps of 2-5 ms, a checkpoint
   after each): a claim after a fault resumes from the last stored checkpoint
   (`chaos_checks.judge_steps`). And jobs of two limited kinds: ``--limited`` of
   `chaosjobs.one_at_a_time` (one running at a time in the fleet) and ``--rated`` of
   `chaosjobs.rated` (at most 20 claimed in any second; a trigger notes the server's time of
   each claim), judged by `chaos_checks.judge_limits`: never over either limit.
2. Starts two ``pgpool run --handlers chaosjobs --lease 2 --procs 1 --batch 50``
   dispatchers.
3. Until the queue is empty, at random intervals (``--interval``), injects one fault:

   - ``worker kill``: SIGKILL one worker process of a random dispatcher (one that has
     started: a worker killed while importing the handler modules makes a starting
     dispatcher exit, which is pgpool's documented start-up check, not a fault to survive);
   - ``dispatcher kill``: SIGKILL a dispatcher (its workers die with it) and start a new one;
   - ``postgres restart``: ``pg_ctl restart -m fast`` (same socket, so the DSN stays valid);
   - ``backends terminated``: ``pg_terminate_backend`` on every client connection but its own.

   The first four faults are one of each kind in random order, and the run goes on until
   they are all done even if the queue empties first, so even a short run covers them all.
   Faults stop once 3/4 of ``--seconds`` has passed: the rest is fault-free time for the
   drain to finish, and ``--drain-grace`` more seconds if it has not (a machine shared
   with other work drains slower: how fast is not what the soak checks). A dispatcher that
   exits by itself is restarted (and reported).
4. When ``pgpool_jobs`` is empty (or that time is up) it stops the dispatchers with
   SIGTERM and checks the records against the database with ``chaos_checks.judge``, whose
   module docstring states the rules and why each is sound. Each fault carries the number
   of jobs it could have interrupted: 1 for a worker kill, the jobs the database showed a
   killed dispatcher owning right after the kill, and for a database fault the running jobs
   just before it plus one `pgpool.host.scheduler.capacity` per dispatcher. The group workload
   is judged by ``chaos_checks.judge_workflows`` (its docstring has the rules): every
   group's callback run exactly once and only after all its members had finished, no
   member lost, every group row counting its members, every parent that is done with
   exactly its children and group, and no follow-up of a failed or cut-off attempt.

It prints the figures (and with ``--summary`` writes them to FILE as one JSON object) and
exits 0 only if: nothing lost, nothing overlapping, everything drained, no unexplained
re-runs, re-runs within the bound, the same attempt never started twice, every rule of the
group workload held, neither limit exceeded, no dispatcher died on its own, and every
dispatcher exited 0 on the final SIGTERM. A dispatcher that could not connect at start-up
because PostgreSQL was restarting at that moment (exit 2, "cannot connect"), or lost its
connection before it started serving (backends terminated: exit 2, "lost the database",
with no start line of its own) is not a failure: pgpool documents that start-up needs the
database; it is restarted like a supervisor would, and counted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from chaos_checks import (
    ASKED_TO_FAIL,
    BACKENDS_TERMINATED,
    CALLBACK,
    DISPATCHER_KILL,
    FAULT_KINDS,
    LIMITED,
    LIMITED_CONCURRENCY,
    MEMBER,
    PARENT,
    POSTGRES_RESTART,
    RATED,
    RATED_PER_SECOND,
    STEPS,
    WORKER_KILL,
    Fault,
    Limits,
    Resumes,
    Verdict,
    Workflows,
    death_bound,
    failed_on_purpose,
    judge,
    judge_limits,
    judge_steps,
    judge_workflows,
    read_attempts,
    read_identities,
    read_steps,
)
from chaos_cluster import (
    KIND,
    RECORD_ENV,
    Db,
    Postgres,
    Watcher,
    alive,
    catches,
    now_ns,
    tied_python,
    workers_of,
    workflow_outcomes,
)
from places import HANDLERS

import pgpool
from pgpool.host.scheduler import ack_high_water, capacity
from pgpool.ops import JobNotFound, cancel

#: The dispatchers' settings (``--lease 2 --procs 1 --batch 50``).
LEASE = 2.0
PROCS = 1
BATCH = 50
DISPATCHERS = 2
#: Steps of each long job (`chaosjobs.steps`).
STEPS_PER_JOB = 20
#: Jobs a dispatcher holds at most (running, sent to its worker, or in its backlog).
CAPACITY = capacity(PROCS, BATCH)
#: The most unwritten acks a dispatcher keeps before it stops claiming: with the capacity,
#: what a dispatcher may hold when the database cannot say.
HIGH_WATER = ack_high_water(PROCS, BATCH)

#: How often each kind is drawn once the first four (one of each) are done.
WEIGHTS = {WORKER_KILL: 0.35, DISPATCHER_KILL: 0.25, POSTGRES_RESTART: 0.15,
           BACKENDS_TERMINATED: 0.25}


@dataclass
class Host:
    """One dispatcher process, when the soak started it (monotonic s), and where its output
    begins in its slot's log."""

    proc: subprocess.Popen[bytes]
    started: float
    log_from: int


class Soak:
    """The driver: processes, faults, and the final check."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.run_dir = Path(tempfile.mkdtemp(prefix="pgpool-chaos-run-", dir="/tmp"))
        self.record_dir = self.run_dir / "records"
        self.record_dir.mkdir()
        self.pg: Postgres | None = None
        self.db: Db | None = None
        self.hosts: dict[int, Host] = {}
        self.faults: list[Fault] = []
        self.problems: list[str] = []
        self.crashes = 0
        self.refused = 0
        self.starts = 0
        self.watcher = Watcher(self.record_dir)
        self.ids: list[int] = []
        #: The groups the driver enqueued: key -> members.
        self.planned: dict[str, int] = {}
        #: Members cancelled while they ran.
        self.cancelled: list[int] = []
        #: The jobs of the kind limited in concurrency.
        self.limited: set[int] = set()

    # --- set-up -------------------------------------------------------------------------

    def setup(self) -> None:
        self.pg = Postgres.start()
        self.db = Db(self.pg.dsn)
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            pgpool.migrate(conn)
            payloads = ({"ms": self.rng.randint(1, 5)} for _ in range(self.args.jobs))
            pgpool.enqueue_many(conn, KIND, payloads)
            self.enqueue_workflows(conn)
            pgpool.enqueue_many(conn, STEPS, ({"steps": STEPS_PER_JOB,
                                               "ms": self.rng.randint(2, 5)}
                                              for _ in range(self.args.steps)))
            self.enqueue_limited(conn)
            self.ids = [r[0] for r in conn.execute("SELECT id FROM pgpool_jobs")]
        expected = (self.args.jobs + sum(self.planned.values()) + len(self.planned)
                    + self.args.parents + self.args.steps + self.args.limited
                    + self.args.rated)
        if len(self.ids) != expected:
            raise RuntimeError(f"enqueued {len(self.ids)} jobs, not {expected}")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PGPOOL_", "PG"))}
        self.env.update(PGPOOL_DSN=self.pg.dsn, PGPOOL_HOME=str(self.run_dir / "home"),
                        **{RECORD_ENV: str(self.record_dir)})
        self.watcher.start()
        for slot in range(DISPATCHERS):
            self.start_dispatcher(slot)

    def enqueue_workflows(self, conn: psycopg.Connection) -> None:
        """The group workload: ``--groups`` groups of ``--members`` members in all, and
        ``--parents`` parents with follow-ups (see the module docstring)."""
        rng = self.rng
        groups = self.args.groups
        for g in range(groups):
            key = f"d{g}"
            size = self.args.members // groups + (g < self.args.members % groups)
            members = [{"g": key, "i": i, "ms": rng.randint(1, 3)}
                       | ({"fail": True} if rng.random() < 0.01 else {})
                       for i in range(size)]
            # Every other callback starts a nested group of 10.
            then = {"g": key, "total": size} | ({"group": 10} if g % 2 == 0 else {})
            pgpool.group(conn, MEMBER, members, then=(CALLBACK, then))
            self.planned[key] = size
        parents = []
        for _ in range(self.args.parents):
            payload: dict[str, Any] = {"ms": rng.randint(1, 3),
                                       "children": rng.randint(0, 4)}
            if rng.random() < 0.2:
                payload["group"] = rng.randint(5, 30)
            draw = rng.random()
            if draw < 0.05:
                payload["fail"] = True
            elif draw < 0.15:
                payload["flaky"] = True
            parents.append(payload)
        pgpool.enqueue_many(conn, PARENT, parents)

    def enqueue_limited(self, conn: psycopg.Connection) -> None:
        """``--limited`` and ``--rated`` jobs of the limited kinds, and the trigger that notes
        the server's time of every claim of a rated job (a re-claim too), which is what its
        rate limit holds: the claims' ``claimed_at``, in ``chaos_rated_claims``."""
        conn.execute(f"""
            CREATE TABLE chaos_rated_claims (id bigint, at timestamptz);
            CREATE FUNCTION chaos_note_claim() RETURNS trigger LANGUAGE plpgsql
            SET search_path = pg_catalog, public AS $$
            BEGIN
                INSERT INTO chaos_rated_claims VALUES (NEW.id, NEW.claimed_at);
                RETURN NULL;
            END $$;
            CREATE TRIGGER chaos_note_claim AFTER UPDATE OF state ON pgpool_jobs FOR EACH ROW
                WHEN (NEW.state = 'running' AND NEW.kind = '{RATED}')
                EXECUTE FUNCTION chaos_note_claim()""")
        if self.args.limited:
            pgpool.enqueue_many(conn, LIMITED, ({"ms": self.rng.randint(1, 5)}
                                                for _ in range(self.args.limited)))
        if self.args.rated:
            pgpool.enqueue_many(conn, RATED, ({"ms": 1} for _ in range(self.args.rated)))
        self.limited = {r for (r,) in conn.execute("SELECT id FROM pgpool_jobs WHERE kind = %s",
                                                   (LIMITED,))}

    def start_dispatcher(self, slot: int) -> None:
        cmd = tied_python("-m", "pgpool", "run", "--handlers", "chaosjobs",
                          "--lease", f"{LEASE:g}", "--procs", str(PROCS), "--batch", str(BATCH))
        with (self.run_dir / f"dispatcher-{slot}.log").open("ab") as log:
            log_from = log.tell()
            proc = subprocess.Popen(cmd, cwd=HANDLERS, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT)
        self.hosts[slot] = Host(proc, time.monotonic(), log_from)
        self.starts += 1

    def refused_at_start_up(self, slot: int, host: Host) -> bool:
        """Whether ``host`` exited on pgpool's user error for a database it cannot reach
        (it started while the server was restarting), or lost (its sessions were
        terminated) before it served: its own output has no start line."""
        with (self.run_dir / f"dispatcher-{slot}.log").open("rb") as log:
            log.seek(host.log_from)
            own = log.read().decode(errors="replace").splitlines()
        last = own[-1] if own else ""
        if last.startswith("pgpool: error: cannot connect to PostgreSQL"):
            return True
        return (last.startswith("pgpool: error: lost the database")
                and not any("pgpool.dispatcher: dispatcher " in line for line in own))

    def log_tail(self, slot: int, lines: int = 15) -> str:
        text = (self.run_dir / f"dispatcher-{slot}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> bool:
        """Inject faults until drained (and the first four faults are done) or out of time;
        True if the queue drained."""
        assert self.db is not None
        started = time.monotonic()
        faults_until = started + 0.75 * self.args.seconds
        hard_end = started + self.args.seconds + self.args.drain_grace
        lo, hi = self.args.interval
        plan = list(FAULT_KINDS)
        self.rng.shuffle(plan)
        next_fault = started + self.rng.uniform(lo, hi)
        while True:
            remaining = self.db.query("SELECT count(*) FROM pgpool_jobs")
            now = time.monotonic()
            if remaining == 0 and (not plan or now >= faults_until):
                return True
            if now >= hard_end:
                return False
            self.check_hosts()
            if next_fault <= now < faults_until:
                kind = (plan.pop(0) if plan
                        else self.rng.choices(list(WEIGHTS), list(WEIGHTS.values()))[0])
                fault = self.inject(kind)
                if fault is not None:
                    self.faults.append(fault)
                    _say(f"{len(self.faults):4d} {kind} ({remaining} jobs left)")
                if self.rng.random() < 1 / 3:
                    self.cancel_member()
                else:
                    plan.insert(0, kind)  # nothing to hit right now: try it again soon
                next_fault = time.monotonic() + self.rng.uniform(lo, hi)
            time.sleep(0.05)

    def check_hosts(self) -> None:
        """Restart dispatchers that exited by themselves, and say why they did."""
        for slot, host in list(self.hosts.items()):
            code = host.proc.poll()
            if code is None:
                continue
            tail = self.log_tail(slot)
            if code == 2 and self.refused_at_start_up(slot, host):
                self.refused += 1
            else:
                self.crashes += 1
                self.problems.append(
                    f"dispatcher {host.proc.pid} exited by itself with status {code} after "
                    f"{time.monotonic() - host.started:.1f}s; its log ends:\n{tail}")
                if self.crashes >= 20:
                    raise RuntimeError("dispatchers keep exiting by themselves; giving up")
            self.start_dispatcher(slot)

    def inject(self, kind: str) -> Fault | None:
        """Do one fault of ``kind``; None if there was nothing to hit."""
        assert self.db is not None and self.pg is not None
        if kind == WORKER_KILL:
            slot = self.rng.choice(sorted(self.hosts))
            # Only a worker that has started: one killed while importing the handler
            # modules makes a starting dispatcher exit (pgpool's documented start-up check).
            workers = workers_of(self.hosts[slot].proc.pid, ready=True)
            if not workers:
                return None
            pid = self.rng.choice(workers)
            t0 = now_ns()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return Fault(kind, t0, now_ns(), pid=pid, cap=1)
        if kind == DISPATCHER_KILL:
            slot = self.rng.choice(sorted(self.hosts))
            return self.kill_dispatcher(slot)
        running = self._running_or(DISPATCHERS * (CAPACITY + HIGH_WATER))
        cap = running + DISPATCHERS * CAPACITY
        if kind == POSTGRES_RESTART:
            t0 = now_ns()
            self.pg.restart()
            return Fault(kind, t0, now_ns(), cap=cap)
        t0 = now_ns()
        self.db.query(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'")
        return Fault(kind, t0, now_ns(), cap=cap)

    def cancel_member(self) -> None:
        """Cancel a running member of a group, as an operator would: its host stops it, and
        its group counts it finished. Nothing if none runs, the server is away, or it
        finished first (`pgpool.ops.cancel` then changes nothing)."""
        assert self.pg is not None
        try:
            with psycopg.connect(self.pg.dsn, autocommit=True, connect_timeout=5) as conn:
                row = conn.execute(
                    "SELECT id FROM pgpool_jobs WHERE kind = %s AND state = 'running' "
                    "AND locked_by IS NOT NULL ORDER BY random() LIMIT 1", (MEMBER,)).fetchone()
                if row is None:
                    return
                cancel(conn, [row[0]])
        except (psycopg.Error, JobNotFound):
            return
        self.cancelled.append(row[0])
        _say(f"     member {row[0]} cancelled")

    def _running_or(self, fallback: int) -> int:
        assert self.db is not None
        try:
            return int(self.db.query(
                "SELECT count(*) FROM pgpool_jobs WHERE state = 'running'", patience=2))
        except psycopg.Error:
            return fallback

    def kill_dispatcher(self, slot: int) -> Fault:
        """SIGKILL a dispatcher, see its workers die with it, count what it held, restart."""
        assert self.db is not None
        proc = self.hosts[slot].proc
        workers = workers_of(proc.pid)
        t0 = now_ns()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        t1 = now_ns()
        proc.wait()
        gone = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not any(alive(w) for w in workers):
                gone = now_ns()
                break
            time.sleep(0.002)
        else:
            orphans = [w for w in workers if alive(w)]
            self.problems.append(f"workers {orphans} outlived their killed dispatcher "
                                 f"{proc.pid} by 10s")
            for w in orphans:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w, signal.SIGKILL)
            gone = now_ns()
        # Its jobs stay as they are until their leases expire: count them now.
        owner = f"{socket.gethostname()}:{proc.pid}:%"
        try:
            cap = int(self.db.query(
                "SELECT count(*) FROM pgpool_jobs WHERE state = 'running' AND locked_by LIKE %s",
                (owner,), patience=LEASE / 2))
        except psycopg.Error:
            cap = CAPACITY + HIGH_WATER
        self.start_dispatcher(slot)
        return Fault(DISPATCHER_KILL, t0, t1, pid=proc.pid, cap=cap, workers_gone=gone,
                     workers=workers)

    def stop_dispatchers(self) -> None:
        """SIGTERM every dispatcher; each must exit 0 within a minute.

        A dispatcher restarted moments ago may still be starting its interpreter, where a
        SIGTERM kills it instead of stopping it: wait (30 s at most) until it catches the
        signal (``pgpool run`` then turns one even during start-up into a graceful stop).
        """
        deadline = time.monotonic() + 30
        for host in self.hosts.values():
            while (host.proc.poll() is None and time.monotonic() < deadline
                   and not catches(host.proc.pid, signal.SIGTERM)):
                time.sleep(0.05)
        for host in self.hosts.values():
            if host.proc.poll() is None:
                host.proc.send_signal(signal.SIGTERM)
        for slot, host in self.hosts.items():
            try:
                code: int | None = host.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                code = None
                host.proc.kill()
                host.proc.wait()
            if code != 0:
                self.problems.append(f"dispatcher {host.proc.pid} ended with status {code} on "
                                     f"SIGTERM; its log ends:\n{self.log_tail(slot)}")
        still = self.watcher.settle()
        if still:
            self.problems.append(f"workers {still} still alive after their dispatchers exited")

    def shutdown(self) -> None:
        for host in self.hosts.values():
            if host.proc.poll() is None:
                host.proc.kill()
                host.proc.wait()
        self.watcher.stop()
        if self.db is not None:
            self.db.close()
        if self.pg is not None:
            self.pg.stop()

    # --- the check ----------------------------------------------------------------------

    def check(self, drained: bool, elapsed: float) -> bool:
        """Judge the run, print the figures (and write them to ``--summary``); True if every
        rule held."""
        assert self.db is not None
        (self.run_dir / "faults.json").write_text(json.dumps(
            [{**dataclasses.asdict(f), "until": f.until} for f in self.faults], indent=1))
        attempts = read_attempts(self.record_dir)
        identities = read_identities(self.record_dir)
        died = death_bound(self.faults, self.watcher.died)
        assert self.pg is not None
        finished, left, groups = workflow_outcomes(self.pg.dsn)
        workflows = judge_workflows(attempts, identities, planned=self.planned,
                                    finished=finished, left=left, groups=groups, died=died,
                                    cancelled=self.cancelled)
        resumes = judge_steps(read_steps(self.record_dir), identities,
                              completed={job for job, runs in attempts.items()
                                         if any(a.end is not None for a in runs)})
        limits = judge_limits(
            attempts, died, limited=self.limited, concurrency=LIMITED_CONCURRENCY,
            claims=(at for (at,) in self._rows(
                "SELECT extract(epoch FROM at)::float8 FROM chaos_rated_claims")),
            rate=RATED_PER_SECOND, per=1.0)
        # Follow-ups are jobs of the run too: their ids are known from what they left.
        ids = set(self.ids) | set(identities) | set(finished) | set(left)
        verdict = judge(
            ids, attempts, self.faults, died=died, lease=LEASE,
            dead={r for (r,) in self._rows("SELECT id FROM pgpool_dead")},
            left=int(self.db.query("SELECT count(*) FROM pgpool_jobs")),
            failed=failed_on_purpose(attempts, identities))
        figures = {**verdict.figures(), **workflows.figures(), **resumes.figures(),
                   **limits.figures(),
                   "dispatcher starts": self.starts,
                   "postgres restarts": self.pg.restarts if self.pg else 0}
        self._print(verdict, workflows, resumes, limits, figures, drained, elapsed)
        if self.args.summary is not None:
            self.args.summary.write_text(json.dumps(figures, indent=1) + "\n")
        failures = (verdict.failures() + workflows.failures() + resumes.failures()
                    + limits.failures() + self.problems)
        if not drained:
            failures.append(
                f"not drained within {self.args.seconds + self.args.drain_grace:g}s")
        for failure in failures:
            print(f"FAIL: {failure}")
        if failures:
            print(f"records and dispatcher logs kept in {self.run_dir}")
            if self.pg is not None:
                print(f"postgres log ends:\n{self.pg.log_tail()}")
        return not failures

    def _print(self, verdict: Verdict, workflows: Workflows, resumes: Resumes, limits: Limits,
               figures: dict[str, int], drained: bool, elapsed: float) -> None:
        def breakdown(counts: Counter[str], kinds: tuple[str, ...] = FAULT_KINDS) -> str:
            return ", ".join(f"{k} {counts[k]}" for k in kinds)

        done = verdict.jobs - len(verdict.lost)
        print(f"chaos soak: {verdict.jobs} jobs, {DISPATCHERS} dispatchers x {PROCS} worker, "
              f"lease {LEASE:g}s, {'drained' if drained else 'stopped'} in {elapsed:.1f}s "
              f"({done / max(elapsed, 1e-9):.0f} jobs/s)")
        notes = {
            "faults": breakdown(verdict.faults),
            "re-runs": f"at most {verdict.bound} interruptible: "
                       f"{breakdown(verdict.interruptible)}",
            "attempts never run": "claimed, then lost before a worker started them",
            "groups": f"{len(self.planned)} enqueued, "
                      f"{workflows.expected_groups - len(self.planned)} started by parents "
                      "and callbacks",
            "callbacks run": "distinct callback jobs done, each after all its members",
            "members": "of every group, those started by parents and callbacks too",
            "members cancelled": "while they ran, by an operator; each must be dead",
            "orphans": "follow-up jobs and groups of failed or cut-off attempts",
            "duplicates": "a follow-up or member written twice",
            "long jobs": "checkpointing after each step",
            "resumed": "claims that started past step 0, from a checkpoint",
            "steps run twice": "a step cut off before its checkpoint was stored, run again",
            "limited jobs": f"of {LIMITED}, at most {limits.concurrency} running at once",
            "most running at once": f"of {LIMITED}, from the attempts' own records "
                                    f"(limit {limits.concurrency})",
            "rated claims": f"of {RATED}, at most {limits.rate} a second",
            "most claimed in a window": f"of {RATED}, in any second on the server's clock "
                                        f"(limit {limits.rate})",
            "dispatcher starts": f"refused at start-up while the server was away: "
                                 f"{self.refused}; exited by themselves: {self.crashes}",
        }
        for name, value in figures.items():
            if name == "interruptible":
                continue  # shown with the re-runs
            note = f"  ({notes[name]})" if name in notes else ""
            print(f"{name + ':':<23}{value}{note}")
            if name == "re-runs":
                print(f"{'re-runs by cause:':<23}{sum(verdict.causes.values())}  "
                      f"({breakdown(verdict.causes, (*FAULT_KINDS, ASKED_TO_FAIL))})")

    def _rows(self, sql: str) -> list[tuple[Any, ...]]:
        assert self.pg is not None
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            return conn.execute(sql).fetchall()


def _say(message: str) -> None:
    print(f"chaos: {message}", file=sys.stderr, flush=True)


def _interval(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    try:
        pair = (float(lo), float(hi or lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN,MAX seconds") from None
    if not 0 < pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 < MIN <= MAX")
    return pair


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs to drain (default 20000)")
    parser.add_argument("--groups", type=int, default=5,
                        help="groups the driver enqueues (default 5)")
    parser.add_argument("--members", type=int, default=10_000,
                        help="members of those groups in all (default 10000)")
    parser.add_argument("--parents", type=int, default=1000,
                        help="parents that enqueue follow-ups and groups (default 1000)")
    parser.add_argument("--steps", type=int, default=50,
                        help="long jobs that checkpoint after each step (default 50)")
    parser.add_argument("--limited", type=int, default=200,
                        help=f"jobs of a kind limited to {LIMITED_CONCURRENCY} running at once "
                             "(default 200)")
    parser.add_argument("--rated", type=int, default=200,
                        help=f"jobs of a kind limited to {RATED_PER_SECOND} claimed a second "
                             "(default 200)")
    parser.add_argument("--seconds", type=float, default=300,
                        help="time limit of the drain; faults stop after 3/4 of it (default 300)")
    parser.add_argument("--drain-grace", type=float, default=0.0, metavar="SECONDS",
                        help="more seconds for the drain to finish after --seconds, with no "
                             "faults (default 0)")
    parser.add_argument("--interval", type=_interval, default=(0.5, 2.0), metavar="MIN,MAX",
                        help="seconds between faults, drawn uniformly (default 0.5,2.0)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the records and logs even when every check passes")
    parser.add_argument("--summary", type=Path, default=None, metavar="FILE",
                        help="also write the figures to FILE as one JSON object")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 32)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    soak = Soak(args)
    _say(f"seed {args.seed}; records and logs in {soak.run_dir}")
    ok = False
    try:
        soak.setup()
        _say(f"{len(soak.ids)} jobs enqueued (the group workload's too); dispatchers started")
        started = time.monotonic()
        drained = soak.run()
        elapsed = time.monotonic() - started
        soak.stop_dispatchers()
        ok = soak.check(drained, elapsed)
    except (subprocess.SubprocessError, psycopg.Error, RuntimeError) as exc:
        # pg_ctl failing to restart the server, the server not coming back, or dispatchers
        # that keep dying.
        print(f"FAIL: the soak broke down: {type(exc).__name__}: {exc}")
        for problem in soak.problems:
            print(f"FAIL: {problem}")
        if soak.pg is not None:
            print(f"postgres log ends:\n{soak.pg.log_tail()}")
        print(f"records and dispatcher logs kept in {soak.run_dir}")
    finally:
        soak.shutdown()
        if ok and not args.keep:
            shutil.rmtree(soak.run_dir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
