"""The dashboard in a real browser: headless Chromium (Debian's, driven by Playwright for
Python) against a real `pgpool web`, real dispatchers and the suite's throwaway PostgreSQL.

Run by `make web-test` (not by `make test`: pyproject's norecursedirs), which installs
Playwright; Chromium comes from Debian (`.ci/run` installs it). Every wait is a condition
in the page (Playwright's ``expect``, which polls it) or in the database (`wait_until`).
Screenshots of the main views land in tests/web/browser/artifacts/ (gitignored).
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from commands import MARKER, RUN, run_pgpool
from dbtools import listeners, one, queue_counts
from horizon_holds import hold_horizon, pile_dead_rows
from playwright.sync_api import Browser, Page, expect, sync_playwright
from playwright.sync_api import Error as PlaywrightError
from processes import start_pgpool
from records import read_records
from waits import wait_until

import pgpool
from pgpool import ops

CHROMIUM = os.environ.get("PGPOOL_CHROMIUM", "/usr/bin/chromium")
#: What headless Chromium needs here: as root, no sandbox; no GPU; and nothing that phones
#: home (this closed network refuses those connections, and they slow the start).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
ARTIFACTS = Path(__file__).parent / "artifacts"
#: Page conditions wait this long. The server sends a snapshot at least every 2 s, a new
#: lag sample goes into the chart's history every 5 s, and a dispatcher started with
#: --lease 3 beats every second; 20 s leaves room for a machine shared by several runs.
expect.set_options(timeout=20_000)
#: The dispatchers' lease: short, so hosts report their claims (at each beat, lease/3) fast.
LEASE = ("--lease", "3")


# --- fixtures: the browser, a page (`web`, the server, is tests/conftest.py's) ------------

@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no Chromium at {CHROMIUM}: `apt-get install chromium` (.ci/run does), "
                    "or point PGPOOL_CHROMIUM at one")
    with sync_playwright() as p:
        # Playwright gives each launch a fresh temporary profile (--user-data-dir).
        launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def open_page(browser: Browser) -> Iterator[Callable[..., Page]]:
    """A new page in a new browser context (its own cookies and credentials); a JavaScript
    error, or anything the server's Content-Security-Policy refused, on any page fails the
    test."""
    contexts = []
    errors: list[str] = []

    def open_(**context: Any) -> Page:
        ctx = browser.new_context(viewport={"width": 1400, "height": 900}, **context)
        contexts.append(ctx)
        page = ctx.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text)
                if msg.type == "error" and "Content Security Policy" in msg.text else None)
        return page

    yield open_
    for ctx in contexts:
        ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def load(page: Page, url: str) -> Page:
    """Open the dashboard and wait for its first snapshot."""
    page.goto(url)
    expect(page.locator("body")).to_have_attribute("data-snapshots", re.compile(r"^\d+$"))
    return page


def card(page: Page, queue: str) -> Any:
    return page.locator(f'[data-testid="queue"][data-queue="{queue}"]')


def host_row(page: Page, owner: str) -> Any:
    return page.locator(f'[data-testid="host"][data-owner="{owner}"]')


def screenshot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / f"{name}.png", full_page=True)


def dead_count(db: psycopg.Connection, queue: str) -> int:
    return one(db, "SELECT count(*) FROM pgpool_dead WHERE queue = %s", queue)[0]


def owners(db: psycopg.Connection) -> list[str]:
    return [o for (o,) in db.execute("SELECT owner FROM pgpool_hosts ORDER BY owner")]


# --- the tests ------------------------------------------------------------------------------

@pytest.mark.own_schema  # it takes pgpool_jobs' autovacuum settings away
def test_the_page_shows_what_the_database_holds(db, dsn, record_dir, web, open_page):
    # alpha: 3 ready, 2 scheduled, no host. busy: a host that ran 2 jobs into the dead
    # letters and now runs a long one.
    for _ in range(3):
        pgpool.enqueue(db, "record", {}, queue="alpha")
    for _ in range(2):
        pgpool.enqueue(db, "record", {}, queue="alpha", delay=600)
    host = start_pgpool(dsn, *RUN, "--queue", "busy", "--procs", "1", *LEASE,
                        record_dir=record_dir)
    for _ in range(2):
        pgpool.enqueue(db, "fail", {}, queue="busy", max_attempts=1)
    wait_until(lambda: dead_count(db, "busy") == 2, "the two failing jobs to die")
    long = pgpool.enqueue(db, "record", {"sleep": 300, "secret": MARKER}, queue="busy")
    wait_until(lambda: queue_counts(db, "busy")["running"] == 1, "the long job to run")

    page = load(open_page(), web()[1])
    for queue in ("alpha", "busy"):
        for what, count in queue_counts(db, queue).items():
            expect(card(page, queue).get_by_test_id(what)).to_have_text(str(count))
    expect(card(page, "busy").get_by_test_id("dead24h")).to_have_text("+2")
    expect(card(page, "alpha").get_by_test_id("paused")).to_have_text("active")
    # The one host, live, with its procs and queues.
    (owner,) = owners(db)
    expect(page.get_by_test_id("host")).to_have_count(1)
    expect(host_row(page, owner)).to_contain_text("busy")
    expect(host_row(page, owner).get_by_test_id("last-seen")).not_to_contain_text("stale")
    # The jobs list: every live job, in the state the table says.
    jobs = dict(db.execute("SELECT id, state FROM pgpool_jobs"))
    rows = page.locator('[data-testid="job"]')
    expect(rows).to_have_count(len(jobs))
    shown = {int(r.get_attribute("data-job-id")): r.get_attribute("data-state")
             for r in rows.all()}
    assert shown == jobs
    screenshot(page, "dashboard")
    # Filtered: alpha's scheduled jobs only.
    page.get_by_test_id("f-queue").select_option("alpha")
    page.get_by_test_id("f-state").select_option("scheduled")
    expect(rows).to_have_count(2)
    assert {r.get_attribute("data-state") for r in rows.all()} == {"scheduled"}
    page.get_by_test_id("f-state").select_option("")
    page.get_by_test_id("f-queue").select_option("")
    expect(rows).to_have_count(len(jobs))

    # The running job's detail: attempts, owner, lease left; no payload (not allowed).
    page.locator(f'[data-testid="job"][data-job-id="{long}"]').click()
    detail = page.get_by_test_id("job-detail")
    expect(detail.get_by_test_id("d-state")).to_have_text("running")
    expect(detail.get_by_test_id("d-owner")).to_have_text(owner)
    expect(detail.get_by_test_id("d-attempts")).to_contain_text("1 of ")
    expect(detail.get_by_test_id("d-lease")).to_have_text(re.compile(r"^\d"))
    expect(detail.get_by_test_id("d-payload-hidden")).to_be_visible()
    assert MARKER not in page.content()
    screenshot(page, "job-detail")

    # The dead letters: one group of two.
    page.get_by_test_id("tab-dead").click()
    group = page.locator('[data-testid="dead-group"][data-kind="fail"]')
    expect(group.get_by_test_id("group-count")).to_have_text("2")
    screenshot(page, "dead-letters")

    # Autovacuum: fine, then flagged as the runbook says once the table's settings are lost.
    expect(page.get_by_test_id("vac-flag")).to_have_text("no vacuum debt")
    expect(page.get_by_test_id("warning-vacuum")).to_have_count(0)
    db.execute("ALTER TABLE pgpool_jobs RESET (autovacuum_vacuum_scale_factor)")
    expect(page.get_by_test_id("warning-vacuum")).to_contain_text("lost its autovacuum")
    expect(page.get_by_test_id("vac-settings")).to_have_text("lost")

    # The host dies: its row is marked stale once it is three of its leases (9 s) past its
    # last beat; 30 s leaves room for a loaded machine.
    host.kill()
    expect(host_row(page, owner).get_by_test_id("last-seen")).to_contain_text(
        "stale", timeout=30_000)
    expect(page.get_by_test_id("fleet")).to_contain_text("0 live hosts, 1 stale")


def test_outcomes_groups_in_progress_and_a_finished_job(db, dsn, web, open_page):
    # A real host runs a kept job and a group of two to the end; a second group waits.
    kept = pgpool.enqueue(db, "out.child", {"secret": MARKER}, queue="oq")
    pgpool.group(db, "out.score", [{"doc": 1}, {"doc": 2}], then=("out.combine", {}),
                 queue="oq")
    ran = run_pgpool(dsn, "run", "--handlers", "outcomejobs", "--burst", "--queue", "oq")
    assert ran.returncode == 0, ran.stderr
    waiting = pgpool.group(db, "out.score", [{"doc": 3}, {"doc": 4}],
                           then=("out.combine", {}), queue="later")
    members = [i for (i,) in db.execute("SELECT id FROM pgpool_jobs WHERE group_id = %s "
                                        "ORDER BY id", (waiting.id,))]
    page = load(open_page(), web()[1])

    # Successes kept in the last hour, per kind; the group in progress and its callback.
    succeeded = {k: page.locator(f'[data-testid="succeeded-kind"][data-kind="{k}"]')
                 for k in ("out.child", "out.score", "out.combine")}
    for kind, count in (("out.child", "1"), ("out.score", "2"), ("out.combine", "1")):
        expect(succeeded[kind].get_by_test_id("succeeded-hour")).to_have_text(count)
    group = page.locator(f'[data-testid="group"][data-group-id="{waiting.id}"]')
    expect(page.get_by_test_id("group")).to_have_count(1)
    expect(group.get_by_test_id("group-progress")).to_have_text("0/2")
    expect(group.get_by_test_id("group-callback")).to_have_text("waiting")
    screenshot(page, "outcomes")

    # The group's row lists its members and shows its callback, with the group's progress.
    group.click()
    expect(page.get_by_test_id("f-group")).to_have_value(str(waiting.id))
    rows = page.locator('[data-testid="job"]')
    expect(rows).to_have_count(2)
    assert [int(r.get_attribute("data-job-id")) for r in rows.all()] == members
    detail = page.get_by_test_id("job-detail")
    expect(detail.get_by_test_id("d-state")).to_have_text("waiting")
    expect(detail.get_by_test_id("d-group")).to_contain_text("0/2 finished")
    rows.first.click()
    expect(detail.get_by_test_id("d-group-id")).to_have_text(f"group {waiting.id}")
    # A member cancelled counts as finished: the progress follows.
    ops.cancel(db, [members[1]])
    expect(group.get_by_test_id("group-progress")).to_have_text("1/2")

    # A finished job, found by its id: done, when, and its result hidden.
    page.get_by_test_id("find-job").fill(str(kept))
    page.get_by_test_id("find-job-show").click()
    expect(detail.get_by_test_id("d-state")).to_have_text("done")
    expect(detail.get_by_test_id("d-finished")).to_contain_text("ago")
    expect(detail.get_by_test_id("d-result-hidden")).to_be_visible()
    assert MARKER not in page.content()
    screenshot(page, "finished-job")

    # With --allow-payloads, its result.
    page = load(open_page(), web("--allow-payloads")[1])
    page.get_by_test_id("find-job").fill(str(kept))
    page.get_by_test_id("find-job").press("Enter")
    expect(page.get_by_test_id("d-result")).to_contain_text(MARKER)


def test_lag_changes_live_as_jobs_wait_and_run(db, dsn, web, open_page):
    page = load(open_page(), web()[1])
    expect(card(page, "lagq")).to_have_count(0)
    for _ in range(60):
        pgpool.enqueue(db, "record", {}, queue="lagq")
    # The enqueue's notification brings the queue in, with its lag; then the lag grows.
    lag = card(page, "lagq").get_by_test_id("lag")
    expect(card(page, "lagq").get_by_test_id("ready")).to_have_text("60")
    expect(lag).to_have_attribute("data-lag", re.compile(r"^\d"))
    first = float(lag.get_attribute("data-lag"))
    page.wait_for_function(
        """([el, first]) => el.dataset.lag !== "" && Number(el.dataset.lag) >= first + 1""",
        arg=[lag.element_handle(), first], timeout=20_000)
    expect(card(page, "lagq").get_by_test_id("lag-chart")).not_to_have_attribute(
        "data-points", re.compile(r"^[01]$"))
    screenshot(page, "lag")
    # The jobs list pages through them, 50 at a time.
    rows = page.get_by_test_id("job")
    page.get_by_test_id("jobs-refresh").click()
    expect(rows).to_have_count(50)
    page.get_by_test_id("jobs-next").click()
    expect(rows).to_have_count(10)
    expect(page.get_by_test_id("jobs-page")).to_have_text("page 2")
    expect(page.get_by_test_id("jobs-next")).to_be_disabled()
    page.get_by_test_id("jobs-prev").click()
    expect(rows).to_have_count(50)
    # A host drains the queue: the lag falls to nothing.
    start_pgpool(dsn, *RUN, "--queue", "lagq", "--procs", "1")
    expect(card(page, "lagq").get_by_test_id("ready")).to_have_text("0")
    expect(lag).to_have_attribute("data-lag", "")
    expect(lag).to_have_text("0s")


def test_replaying_a_dead_group_runs_its_jobs(db, dsn, record_dir, web, open_page):
    start_pgpool(dsn, *RUN, "--queue", "rq", "--procs", "1", *LEASE, record_dir=record_dir)
    # Two jobs that fail for real, and five cancelled before their time: two groups.
    for _ in range(2):
        pgpool.enqueue(db, "fail", {}, queue="rq", max_attempts=1)
    wait_until(lambda: dead_count(db, "rq") == 2, "the two failing jobs to die")
    cancelled = [pgpool.enqueue(db, "record", {}, queue="rq", delay=600) for _ in range(5)]
    ops.cancel(db, cancelled)

    page = load(open_page(), web("--read-write")[1])
    page.get_by_test_id("tab-dead").click()
    group = page.locator('[data-testid="dead-group"][data-kind="record"]')
    expect(group.get_by_test_id("group-count")).to_have_text("5")
    expect(group.get_by_test_id("group-reason")).to_have_text("cancelled")
    expect(page.locator('[data-testid="dead-group"][data-kind="fail"]')
           .get_by_test_id("group-reason")).to_have_text("failed")
    group.get_by_test_id("replay").click()
    # The confirmation states the count the dry run found, and takes a rate.
    expect(page.get_by_test_id("confirm-text")).to_contain_text(
        "Replay 5 dead record jobs (cancelled)")
    page.get_by_test_id("confirm-rate").fill("100")
    screenshot(page, "replay-confirm")
    page.get_by_test_id("confirm-ok").click()
    expect(page.get_by_test_id("flash")).to_have_text("replaying 5 jobs at 100/s")

    # The group is gone, the other one stays, and the host runs the five.
    expect(group).to_have_count(0)
    expect(page.locator('[data-testid="dead-group"][data-kind="fail"]')
           .get_by_test_id("group-count")).to_have_text("2")
    expect(card(page, "rq").get_by_test_id("dead")).to_have_text("2")
    (owner,) = owners(db)
    expect(host_row(page, owner).get_by_test_id("done")).to_have_text("5")
    done = {job for job, _, _, event in read_records(record_dir) if event == "end"}
    assert done == set(cancelled)
    expect(card(page, "rq").get_by_test_id("ready")).to_have_text("0")
    expect(card(page, "rq").get_by_test_id("running")).to_have_text("0")


def test_pausing_a_queue_stops_both_hosts_claiming_from_it(db, dsn, record_dir, web,
                                                           open_page):
    hosts = [start_pgpool(dsn, *RUN, "--queue", "pq", "--procs", "1", "--batch", "1",
                          *LEASE, record_dir=record_dir) for _ in range(2)]
    for host in hosts:
        host.event("started")
    # Both listening before the jobs come ("started" is logged before the listener has
    # connected): a host that misses the notifications waits for its idle poll. (A
    # dashboard LISTENs too, under its own application_name.)
    def hosts_listening() -> int:
        web = {pid for (pid,) in db.execute("SELECT pid FROM pg_stat_activity "
                                            "WHERE application_name = 'pgpool web'")}
        return len(set(listeners(db)) - web)

    wait_until(lambda: hosts_listening() == 2, "both hosts to LISTEN")
    # Jobs of 0.2 s, one at a time per host: a host holds at most a few (procs plus a
    # batch per claim loop), so both take some of the ten.
    first = [pgpool.enqueue(db, "record", {"sleep": 0.2}, queue="pq") for _ in range(10)]
    page = load(open_page(), web("--read-write")[1])
    expect(page.get_by_test_id("host")).to_have_count(2)
    wait_until(lambda: len({pid for _, _, pid, e in read_records(record_dir) if e == "end"})
               == 2 and len([e for *_, e in read_records(record_dir) if e == "end"]) == 10,
               "both hosts to run the first jobs")

    # A POST without the CSRF token is refused, whatever the mode.
    refused = page.evaluate("""async () => (await fetch("/api/queues/pq/pause",
                               {method: "POST", body: "{}"})).status""")
    assert refused == 403
    card(page, "pq").get_by_test_id("pause").click()
    expect(card(page, "pq").get_by_test_id("paused")).to_have_text("paused")
    assert one(db, "SELECT count(*) FROM pgpool_paused WHERE queue = 'pq'") == (1,)
    # Hosts report their claims at their beats: wait until the ten are all counted.
    wait_until(lambda: one(db, "SELECT sum(jobs_claimed) FROM pgpool_hosts") == (10,),
               "the hosts to report claiming the first ten jobs")
    claimed = dict(db.execute("SELECT owner, jobs_claimed FROM pgpool_hosts"))
    later = [pgpool.enqueue(db, "record", {}, queue="pq") for _ in range(6)]
    # Both hosts beat twice more (so each has looked at the queue since), claiming nothing:
    # the page shows them at 0 claims/s and the six jobs waiting.
    for when in ("after the pause", "again"):
        beats = dict(db.execute("SELECT owner, last_seen FROM pgpool_hosts"))
        wait_until(lambda beats=beats: all(
            seen > beats[o] for o, seen in db.execute("SELECT owner, last_seen FROM pgpool_hosts")),
            f"both hosts to beat {when}")
    for owner in claimed:
        expect(host_row(page, owner).get_by_test_id("host-rate")).to_have_text("0.0")
    expect(card(page, "pq").get_by_test_id("ready")).to_have_text(str(len(later)))
    expect(card(page, "pq").get_by_test_id("running")).to_have_text("0")
    assert dict(db.execute("SELECT owner, jobs_claimed FROM pgpool_hosts")) == claimed
    screenshot(page, "paused")

    # Resumed, they drain it.
    card(page, "pq").get_by_test_id("resume").click()
    expect(card(page, "pq").get_by_test_id("paused")).to_have_text("active")
    wait_until(lambda: {j for j, _, _, e in read_records(record_dir) if e == "end"}
               == set(first) | set(later), "the hosts to run the jobs enqueued while paused")
    expect(card(page, "pq").get_by_test_id("ready")).to_have_text("0")


def test_a_limit_set_and_reset_on_the_page_reaches_every_host(db, dsn, web, open_page):
    # A host (of another queue: it applies every kind's override, and logs it), and three
    # jobs no host serves, which stay ready.
    host = start_pgpool(dsn, *RUN, "--queue", "lh", "--procs", "1", *LEASE)
    host.event("started")
    for _ in range(3):
        pgpool.enqueue(db, "record", {}, queue="lq")
    page = load(open_page(), web("--read-write")[1])
    expect(page.get_by_test_id("limit")).to_have_count(0)

    # A bad value is refused, and the page says what is wrong.
    page.get_by_test_id("l-kind").fill("record")
    page.get_by_test_id("l-concurrency").fill("none")
    page.get_by_test_id("limit-set").click()
    expect(page.get_by_test_id("flash")).to_contain_text("concurrency must be a positive integer")
    assert one(db, "SELECT count(*) FROM pgpool_limits") == (0,)

    # One at a time: 1 of the 3 ready jobs could start, 2 wait on the limit (not lag).
    page.get_by_test_id("l-concurrency").fill("1")
    page.get_by_test_id("limit-set").click()
    expect(page.get_by_test_id("flash")).to_contain_text(
        "limit of kind record set to concurrency 1")
    row = page.locator('[data-testid="limit"][data-kind="record"]')
    expect(row.get_by_test_id("limit-in-force")).to_have_text("concurrency 1")
    expect(row.get_by_test_id("limit-override")).to_have_text("concurrency 1")
    expect(row.get_by_test_id("limit-ready")).to_have_text("3")
    expect(row.get_by_test_id("limit-waiting")).to_have_text("2")
    expect(card(page, "lq").get_by_test_id("on-limits")).to_have_text("2")
    assert one(db, "SELECT concurrency, rate FROM pgpool_limits WHERE kind = 'record'") == (
        1, None)
    set_ = host.event("limit_set")  # the audit trail: each host logs who set what
    assert (set_["kind"], set_["concurrency"]) == ("record", 1)
    assert set_["set_by"] == one(db, "SELECT session_user")[0]
    screenshot(page, "limits")

    row.get_by_test_id("limit-reset").click()
    expect(page.get_by_test_id("flash")).to_contain_text("limit of kind record reset")
    expect(page.get_by_test_id("limit")).to_have_count(0)  # no limit in force is left
    expect(card(page, "lq").get_by_test_id("on-limits")).to_have_text("0")
    assert one(db, "SELECT count(*) FROM pgpool_limits") == (0,)
    assert host.event("limit_reset")["kind"] == "record"
    assert host.stop() == 0, host.stderr


def test_read_only_mode_refuses_every_action(db, dsn, web, open_page):
    job = pgpool.enqueue(db, "record", {}, queue="ro")
    ops.cancel(db, [pgpool.enqueue(db, "record", {}, queue="ro", delay=600)])
    page = load(open_page(), web()[1])  # read-only is the default

    expect(page.get_by_test_id("mode")).to_have_text("read-only")
    expect(page.get_by_test_id("readonly-note")).to_be_visible()
    page.locator(f'[data-testid="job"][data-job-id="{job}"]').click()
    expect(page.get_by_test_id("cancel-job")).to_be_visible()
    page.get_by_test_id("tab-dead").click()
    expect(page.get_by_test_id("dead-group")).to_have_count(1)
    # Every action control: pause, resume, cancel, replay, purge, set limit; all disabled.
    actions = page.locator("[data-action]")
    verbs = {a.get_attribute("data-action") for a in actions.all()}
    assert verbs == {"pause", "resume", "cancel", "replay", "purge", "set limit"}
    for action in actions.all():
        expect(action).to_be_disabled()
    screenshot(page, "read-only")

    # A control enabled by hand is refused by the server, and says why.
    page.evaluate("""() => document.querySelector('[data-queue="ro"] [data-testid="pause"]')
                               .disabled = false""")
    card(page, "ro").get_by_test_id("pause").click()
    expect(page.get_by_test_id("flash")).to_contain_text("read-only")
    # And every action's endpoint, with the right CSRF token, answers 403.
    statuses = page.evaluate(
        """async (job) => {
             const token = (await (await fetch("/api/session")).json()).csrf_token;
             const post = async (path, body) => (await fetch(path, {method: "POST",
               headers: {"Content-Type": "application/json", "X-CSRF-Token": token},
               body: JSON.stringify(body)})).status;
             return [await post(`/api/jobs/${job}/cancel`, {}),
                     await post("/api/queues/ro/pause", {}),
                     await post("/api/queues/ro/resume", {}),
                     await post("/api/dead/replay", {kind: "record", dry_run: false}),
                     await post("/api/dead/purge", {kind: "record", dry_run: false}),
                     await post("/api/limits/set", {kind: "record", concurrency: 1}),
                     await post("/api/limits/reset", {kind: "record"})];
           }""", job)
    assert statuses == [403] * 7
    assert one(db, "SELECT count(*) FROM pgpool_limits") == (0,)
    assert one(db, "SELECT state FROM pgpool_jobs WHERE id = %s", job) == ("ready",)
    assert one(db, "SELECT count(*) FROM pgpool_paused") == (0,)
    assert dead_count(db, "ro") == 1


def test_the_warning_names_who_holds_the_horizon_and_how_to_end_it(db, dsn, web, open_page):
    with hold_horizon(dsn, "write") as holder:
        pid = holder.info.backend_pid
        end = f"SELECT pg_terminate_backend({pid})"
        pile_dead_rows(db)
        # Read-only: the holder and the statement that ends it, never its query.
        page = load(open_page(), web("--horizon-warn", "1s")[1])
        warning = page.get_by_test_id("warning-horizon")
        expect(warning).to_contain_text(f"held by backend pid {pid} (user ")
        expect(warning).to_contain_text(end)
        row = page.locator(f'[data-testid="horizon-holder"][data-pid="{pid}"]')
        expect(row.get_by_test_id("horizon-end")).to_have_text(end)
        expect(row).to_contain_text("idle in transaction")
        expect(row.get_by_test_id("horizon-query")).to_contain_text("--allow-payloads")
        expect(page.get_by_test_id("horizon-flag")).to_contain_text("⚠ the xmin horizon")
        expect(page.get_by_test_id("horizon-dead")).not_to_have_text("—")
        assert MARKER not in page.content()
        screenshot(page, "horizon")
        # With payloads allowed, its query's first line too (the second has the marker).
        page = load(open_page(), web("--horizon-warn", "1s", "--allow-payloads")[1])
        row = page.locator(f'[data-testid="horizon-holder"][data-pid="{pid}"]')
        expect(row.get_by_test_id("horizon-query")).to_have_text(
            "SELECT txid_current() -- the forgotten one")
        assert MARKER not in page.content()
    # Let go: the warning leaves the page (the dead rows stay until a vacuum).
    expect(page.get_by_test_id("warning-horizon")).to_have_count(0)
    expect(page.locator(f'[data-testid="horizon-holder"][data-pid="{pid}"]')).to_have_count(0)


def test_authentication_is_required_when_configured(db, dsn, web, open_page):
    job = pgpool.enqueue(db, "record", {"secret": MARKER}, queue="authq")
    _, url = web("--allow-payloads", PGPOOL_WEB_USER="oncall", PGPOOL_WEB_PASSWORD="pw-1234")

    # Without credentials: the page is refused, and so is every API path.
    page = open_page()
    try:
        refused: object = page.goto(url).status
    except PlaywrightError as exc:  # headless Chromium gives up on a login it cannot answer
        refused = 401 if "ERR_INVALID_AUTH_CREDENTIALS" in str(exc) else exc
    assert refused == 401
    expect(page.locator("body[data-ready]")).to_have_count(0)
    for path in ("/", "/static/app.js", "/api/session", "/api/snapshot", "/api/jobs",
                 "/api/dead/groups"):
        assert page.request.get(f"{url}{path}").status == 401, path
        # Wrong credentials are refused too (Chromium's own login with a wrong password
        # ends in a navigation error, not a page: asked of the API directly).
        wrong = {"Authorization": "Basic " + base64.b64encode(b"oncall:wrong").decode()}
        assert page.request.get(f"{url}{path}", headers=wrong).status == 401, path
    page = load(open_page(http_credentials={"username": "oncall", "password": "pw-1234"}), url)
    expect(page.get_by_test_id("user")).to_have_text("signed in as oncall")
    # /healthz stays open to probes (200 now that a snapshot was taken).
    assert open_page().request.get(f"{url}/healthz").status == 200
    expect(card(page, "authq").get_by_test_id("ready")).to_have_text("1")
    # This server allows payloads: the detail shows it.
    page.locator(f'[data-testid="job"][data-job-id="{job}"]').click()
    expect(page.get_by_test_id("d-payload")).to_contain_text(MARKER)


def test_a_long_jobs_progress_and_checkpoint_are_shown(db, dsn, record_dir, tmp_path, web,
                                                       open_page):
    release = tmp_path / "release"
    host = start_pgpool(dsn, "run", "--handlers", "longjobs", "--procs", "2", *LEASE,
                        record_dir=record_dir)
    host.event("started")
    total = 10**9
    reporting = pgpool.enqueue(db, "progressing", {"total": total, "release": str(release)})
    stepping = pgpool.enqueue(db, "steps", {"steps": 600, "seconds": 0.05})
    try:
        wait_until(lambda: pgpool.job_status(db, reporting).progress is not None
                   and pgpool.job_status(db, stepping).checkpoint_at is not None,
                   "progress and a checkpoint written")
        page = load(open_page(), web()[1])
        row = page.locator(f'[data-testid="job"][data-job-id="{reporting}"]')
        expect(row.get_by_test_id("job-progress")).to_have_attribute("max", str(total))
        row.click()
        detail = page.get_by_test_id("job-detail")
        # The share is whatever the handler reached by now: 0% or 1% on a fast machine.
        expect(detail.get_by_test_id("d-progress")).to_contain_text(
            re.compile(rf"of {total} \(\d+%\)"))
        expect(detail.get_by_test_id("d-checkpoint")).to_have_text("none")
        # A later report: the rate and the time left, from the two seen.
        first = pgpool.job_status(db, reporting).progress
        wait_until(lambda: pgpool.job_status(db, reporting).progress.at > first.at,
                   "a later beat wrote the progress again")
        row.click()
        expect(detail.get_by_test_id("d-progress")).to_contain_text(
            re.compile(r"\d/s, about \S+ left"))
        assert "frame" not in detail.inner_text()  # the note: --allow-payloads only
        screenshot(page, "job-progress")
        page.locator(f'[data-testid="job"][data-job-id="{stepping}"]').click()
        expect(detail.get_by_test_id("d-checkpoint")).to_have_text(re.compile(r"^stored \S+ ago$"))
        expect(detail.get_by_test_id("d-progress")).to_have_text("—")
    finally:
        release.touch()
    run_pgpool(dsn, "cancel", str(stepping))
    assert host.stop() == 0
