"""``pgpool status`` as text: `render` formats what `pgpool.observe.collect` read."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from .. import horizon as horizon_
from ..limits import Override
from ..observe import budget_text


def render(status: dict[str, Any]) -> str:
    """The human-readable report of a `collect` result."""
    hosts = status["hosts"]
    live = sum(h["live"] for h in hosts)
    out = [f"hosts: {live} live" + (f", {len(hosts) - live} stale" if live < len(hosts) else "")]
    out += _table(
        ("HOST", "PID", "PROCS", "BATCH", "QUEUES", "LAST SEEN", "STARTED", "DONE", "FAILED",
         "CLAIMED", "CLAIMS/S", "SHARE", "BUDGET"),
        [(h["hostname"], h["pid"], h["procs"], "-" if h["batch"] is None else h["batch"],
          ",".join(h["queues"]),
          _ago(h["last_seen_ago"]) + ("" if h["live"] else " (stale)"),
          _utc(h["started_at"]), h["jobs_done"], h["jobs_failed"], h["jobs_claimed"],
          _rate(h["claims_per_sec"]), _share(h), budget_text(h["max_claims_per_sec"]))
         for h in hosts],
    )
    out.append(_fleet_line(status["fleet"]))
    out += [f"warning: {w}" for w in status["fleet"]["warnings"]]
    out.append("")
    out.append("queues:")
    out += _table(
        ("QUEUE", "READY", "SCHEDULED", "RUNNING", "DEAD", "PARKED", "PARKED DONE", "LAG",
         "DEAD 24H", "CLAIMS/S", "CLAIM P99"),
        [(q["queue"] + (" (paused)" if q["paused"] else ""), q["ready"], q["scheduled"],
          q["running"], q["dead"], q["parked"], q["parked_done"],
          "-" if q["lag"] is None else _ago(q["lag"]).removesuffix(" ago"),
          f"+{q['dead_24h']}", _rate(q["claims_per_sec"]),
          "-" if q["claim_p99_ms"] is None else f"{q['claim_p99_ms']:.1f}ms")
         for q in status["queues"]],
    )
    out += [f"note: {q['waiting_on_limits']} of {q['queue']}'s ready jobs wait on their "
            "kinds' limits: LAG leaves them out (`pgpool limits`)"
            for q in status["queues"] if q["waiting_on_limits"]]
    parked = sum(q["parked"] + q["parked_done"] for q in status["queues"])
    if parked:
        out.append(f"warning: the database refused to ack or reap {parked} jobs: PARKED "
                   "wait for an operator, PARKED DONE succeeded but could not be deleted; "
                   "their last_error says why")
    vacuum = status["vacuum"]
    if vacuum is not None:
        ago = vacuum["last_autovacuum_ago"]
        out.append("")
        out.append(f"jobs table: {vacuum['dead_tuples']} dead tuples, "
                   f"{vacuum['live_tuples']} live; last autovacuum "
                   f"{'never' if ago is None else _ago(ago)}")
        if vacuum["warning"]:
            out.append(f"warning: {vacuum['warning']}")
    out += _horizon(status["horizon"])
    out.append("")
    out.append("kinds waiting with no live handler:")
    out += _table(
        ("QUEUE", "KIND", "READY", "OLDEST DUE"),
        [(u["queue"], u["kind"], u["ready"], _ago(u["oldest_ago"]))
         for u in status["unhandled"]],
    )
    # The sections below are for installations that use what they show.
    if status["schedules"]:
        out.append("")
        out.append("periodic schedules:")
        out += _table(
            ("SCHEDULE", "CRON", "TIMEZONE", "KIND", "QUEUE", "LAST RUN", "NEXT RUN"),
            [(s["name"], s["cron"], s["timezone"], s["kind"], s["queue"],
              "-" if s["last_run"] is None else _utc(s["last_run"]),
              "not declared by any live host" if not s["declared"]
              else "-" if s["next_run"] is None else _utc(s["next_run"]))
             for s in status["schedules"]],
        )
    groups = status["groups"]
    if groups["in_progress"]:
        shown = len(groups["oldest"])
        out.append("")
        out.append(f"groups in progress: {groups['in_progress']}"
                   + (f" (the {shown} oldest)" if shown < groups["in_progress"] else ""))
        out += _table(
            ("GROUP", "FINISHED", "DONE", "DEAD", "CALLBACK", "STARTED"),
            [(g["id"], f"{g['finished']}/{g['total']}", g["done"], g["dead"],
              g["callback"] or "-", _ago(g["age"])) for g in groups["oldest"]],
        )
    if status["limits"]:
        out.append("")
        out.append("limits (`pgpool limits`):")
        out += _table(
            ("KIND", "LIMIT", "OVERRIDE", "RUNNING", "RATE USED", "READY", "WAITING",
             "SCOPES"),
            [(u["kind"], "-" if u["in_force"] is None else _override(u["in_force"]),
              "-" if u["override"] is None else _override(u["override"]),
              u["running"], u["rate_used"], u["ready"], u["waiting"], u["scopes"] or "-")
             for u in status["limits"]],
        )
        out += ["  " + line for line in busiest_scopes(status["limits"])]
    if status["succeeded"]:
        out.append("")
        out.append("successes kept, per kind:")
        out += _table(
            ("KIND", "LAST HOUR", "LATEST"),
            [(s["kind"], f"{s['last_hour']}" + ("+" if s["last_hour_more"] else ""),
              "-" if s["last_ago"] is None else _ago(s["last_ago"]))
             for s in status["succeeded"]],
        )
    return "\n".join(out)


def _override(o: dict[str, Any]) -> str:
    return Override(o["concurrency"], o["rate"], o["per"], o.get("set_by", ""),
                    o.get("by")).describe()


def busiest_scopes(limits: list[dict[str, Any]]) -> list[str]:
    """A line per kind limited per tenant or per key (`pgpool.ops.LimitUse.as_json`): its
    busiest scopes, each with its running jobs and its ring's rows used in the period."""
    return [f"{u['kind']}, busiest of {u['scopes']} scopes: " + ", ".join(
                f"{t['scope']} ({t['running']} running, {t['rate_used']} started)"
                for t in u["top"])
            for u in limits if u["top"]]


def _horizon(h: dict[str, Any]) -> list[str]:
    """The xmin horizon's lines: who holds it, pgpool's tables' dead rows and vacuums, and
    the warning. The holders' query text and client address are shown: this is the
    operator's own command (the Security guide says what the other surfaces show)."""
    holders = h["holders"]
    out = [""]
    if not holders:
        out.append("xmin horizon: nothing holds back vacuum of pgpool's tables")
    else:
        oldest = holders[0]
        age = ("age unknown in time" if oldest["age_seconds"] is None
               else horizon_.span(oldest["age_seconds"]))
        out.append(f"xmin horizon: {age} ({oldest['age_transactions']} transactions), held by "
                   f"{horizon_.describe(oldest)}")
    shown = [x for x in holders
             if x["age_seconds"] is None or x["age_seconds"] >= h["shown_after"]]
    if shown:
        out += _table(
            ("HOLDER", "USER", "APPLICATION", "CLIENT", "STATE", "OPEN", "XIDS", "QUERY RAN",
             "QUERY", "END IT WITH"),
            [(_holder_name(x), x["user"] or "-", x["application_name"] or "-",
              x["client_addr"] or "-", x["state"] or "-",
              "?" if x["age_seconds"] is None else horizon_.span(x["age_seconds"]),
              x["age_transactions"],
              "-" if x["query_seconds"] is None else horizon_.span(x["query_seconds"]),
              _query(x), x["end"] or "(on the standby: see the warning)") for x in shown])
    for c in h["catalog_holders"]:
        out.append(f"not holding pgpool's tables: {horizon_.describe(c)} holds back vacuum of "
                   f"the system catalogs only ({c['age_transactions']} transactions)")
    if h["hidden_sessions"]:
        out.append(f"note: {h['hidden_sessions']} sessions of this database are hidden from "
                   "this role, and one may hold the horizon (their transactions and queries: "
                   f"{horizon_.HIDDEN_HINT})")
    growth = h["dead_rows_per_min"]
    out.append("pgpool's tables:" + ("" if growth is None
                                     else f" pgpool_jobs dead rows {growth:+.0f}/min"))
    out += _table(
        ("TABLE", "DEAD ROWS", "LIVE ROWS", "LAST VACUUM", "VACUUMS", "LAST AUTOVACUUM",
         "AUTOVACUUMS"),
        [(t["table"], t["dead_tuples"], t["live_tuples"], _ago_or_never(t["last_vacuum_ago"]),
          t["vacuums"], _ago_or_never(t["last_autovacuum_ago"]), t["autovacuums"])
         for t in h["tables"]])
    if h["warning"]:
        out.append(f"warning: {h['warning']}")
    return out


def _holder_name(holder: dict[str, Any]) -> str:
    kind = holder["kind"]
    if kind in ("backend", "standby"):
        return f"{kind} pid {holder['pid']}"
    return f"{kind} {holder['name']!r}"


def _query(holder: dict[str, Any]) -> str:
    if holder["kind"] != "backend":
        return "-"
    query = holder["query"]
    if query is None:
        return "(none shown)"
    return query if len(query) <= 60 else query[:59] + "…"


def _ago_or_never(seconds: float | None) -> str:
    return "never" if seconds is None else _ago(seconds)


def _fleet_line(fleet: dict[str, Any]) -> str:
    line = f"fleet: {_rate(fleet['claims_per_sec'])} claims/s"
    budget = fleet["max_claims_per_sec"]
    if budget is None:
        return line + ("; no live host reports a budget" if fleet["live_hosts"] else
                       " (no live hosts)")
    line += (f" of a {budget_text(budget)} claims/s budget "
             f"({100 * fleet['claims_per_sec'] / budget:.0f}%)")
    if fleet["fleet_budget"] is None:
        line += ", the hosts' own (none set with `pgpool budget set`)"
    return line


def _share(host: dict[str, Any]) -> str:
    """A host's share; ``+``: it wants more; ``lapsed``: the others no longer count it."""
    if not host["counted"]:
        return "lapsed"
    return _rate(host["claims_share"]) + ("+" if host["wants_more"] else "")


def _rate(per_sec: float | None) -> str:
    return "-" if per_sec is None else f"{per_sec:.1f}"


def _table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> list[str]:
    if not rows:
        return ["  (none)"]
    cells = [header, *[tuple(map(str, r)) for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in cells]


def _ago(seconds: float) -> str:
    return horizon_.span(seconds) + " ago"


def _utc(iso: str) -> str:
    return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
