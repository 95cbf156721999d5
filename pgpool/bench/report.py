"""The bench report as an aligned, human-readable table (``--json`` prints the dict as is).

Targets from the issue are printed next to their figures; they are reported, not enforced.
"""

from __future__ import annotations

from typing import Any


def render(report: dict[str, Any]) -> str:
    """The report as an aligned, human-readable table."""
    s, o, cal = report["server"], report["options"], report["calibration"]
    seed, ceil, d, p = report["seed"], report["ceiling"], report["drive"], report["pickup"]
    cpu = d["cpu_seconds"]
    pg_cpu = "n/a" if cpu["postgres"] is None else f"{cpu['postgres']:.2f}"
    profile = o["profile"]
    if cal["cpu_rounds"]:
        profile += f" (cpu job = {cal['cpu_rounds']} SHA-256 rounds)"
    batch = f"auto (settled at {d['batch']})" if o["batch"] == "auto" else str(o["batch"])
    one, lease = ceil["one_transaction"], ceil["lease_cycle"]
    rows = [
        ("PostgreSQL", f"{s['version']}; fsync={s['fsync']}, synchronous_commit="
                       f"{s['synchronous_commit']}, full_page_writes={s['full_page_writes']}, "
                       f"shared_buffers={s['shared_buffers']} (reported, never changed)"),
        ("run", f"{o['jobs']} jobs, profile {profile}, {o['procs']} workers, batch {batch}, "
                f"backlog {o['backlog']} jobs due in a day"),
        ("mean job time", f"{cal['handle_time_ms']:.4f} ms (measured in-process)"),
        ("seed: enqueue_many", f"{seed['enqueue_many_rows_per_s']:,.0f} rows/s"),
        ("seed: raw COPY", f"{seed['raw_copy_rows_per_s']:,.0f} rows/s; enqueue_many/raw "
                           f"= {seed['ratio']:.2f} (target >= 0.8; best of {seed['rounds']} "
                           "alternating rounds each)"),
        ("ceiling: 1 transaction", f"{one['jobs_per_s']:,.0f} jobs/s (claim + delete, one "
                                   f"commit per batch; {_runs(one)})"),
        ("ceiling: lease cycle", f"{lease['jobs_per_s']:,.0f} jobs/s (claim commit, then "
                                 f"delete commit; {_runs(lease)})"),
        ("", f"both: hand-written SQL, not pgpool's claim; {ceil['connections']} connections, "
             f"batch {ceil['batch']}"),
        ("drained", f"{d['jobs_drained']} jobs in {d['seconds']:.2f}s"),
        ("wall", f"{d['wall_jobs_per_s']:,.0f} jobs/s (including worker start-up)"),
        ("steady", f"{d['steady_jobs_per_s']:,.0f} jobs/s (first to last completion)"),
        ("vs ceilings", f"{d['ratio_to_one_transaction']:.2f} of 1 transaction, "
                        f"{d['ratio_to_lease_cycle']:.2f} of the lease cycle "
                        "(target >= 0.8 for noop)"),
        ("predicted", f"{d['predicted_jobs_per_s']:,.0f} jobs/s = procs x batch / "
                      "(claim_rtt p50 + batch x job time)"),
        ("workers only", f"{d['workers_only_jobs_per_s']:,.0f} jobs/s = procs / worker CPU "
                         f"per job ({d['worker_cpu_per_job_ms']:.4f} ms); "
                         f"steady is {d['steady_jobs_per_s'] / d['workers_only_jobs_per_s']:.2f}"
                         " of it (target >= 0.95 for cpu)"),
        ("claims", f"{d['claims']}, {d['claimed_per_claim']:.1f} jobs per claim; round trip "
                   f"p50 {d['claim_rtt_p50_ms']:.2f} ms, p99 {d['claim_rtt_p99_ms']:.2f} ms"),
        ("claim budget", _budget_row(d)),
        ("ack flushes", f"{d['ack_flushes']}, {d['mean_flush_size']:.1f} acks per flush; "
                        f"p50 {d['flush_p50_ms']:.2f} ms, p99 {d['flush_p99_ms']:.2f} ms"),
        ("transactions", f"{d['transactions']} = {d['transactions_per_job']:.3f} per job "
                         "(whole database; target <= 0.05 at batch 50)"),
        ("statements", f"{d['statements']} = {d['statements_per_job']:.3f} per job "
                       "(checkouts of the dispatcher's pooled connections: one statement "
                       "each, a host registry beat two; LISTEN not counted)"),
        ("WAL per job", f"{d['wal_bytes_per_job']['total']:,.0f} bytes = enqueue "
                        f"{d['wal_bytes_per_job']['enqueue']:,.0f} + claim, ack and upkeep "
                        f"{d['wal_bytes_per_job']['drain']:,.0f} (the whole server's WAL "
                        "while each ran; target <= 600)"),
        ("queue lag", f"p50 {d['queue_lag_p50_ms']:,.1f} ms, p99 {d['queue_lag_p99_ms']:,.1f} "
                      f"ms (enqueue commit -> handler start, {d['queue_lag_samples']} "
                      "sampled jobs, all seeded at once)"),
        ("pickup, idle queue", f"p50 {p['p50_ms']:.2f} ms (target <= 1.5), p99 "
                               f"{p['p99_ms']:.2f} ms (target <= 3), max {p['max_ms']:.2f} "
                               f"ms; {p['samples']} jobs, `pgpool run --procs {p['procs']}`"),
        ("pickup floor", f"p50 {p['floor_p50_ms']:.2f} ms, p99 {p['floor_p99_ms']:.2f} ms: "
                         "enqueue commit -> notification -> a hand-written claim committed, "
                         "no framework"),
        ("CPU seconds", f"dispatcher {cpu['dispatcher']:.2f}, workers {cpu['workers']:.2f}, "
                        f"local postgres {pg_cpu}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}".rstrip() for k, v in rows)


def _runs(ceiling: dict[str, Any]) -> str:
    """"mean of A before the drive, B after the drive", or "mean of A and B, both after
    the drive" (``--batch auto``)."""
    runs = ceiling["runs"]
    if len({r["when"] for r in runs}) == 1:
        figures = " and ".join(f"{r['jobs_per_s']:,.0f}" for r in runs)
        return f"mean of {figures}, both {runs[0]['when']}"
    return "mean of " + ", ".join(f"{r['jobs_per_s']:,.0f} {r['when']}" for r in runs)


def _budget_row(d: dict[str, Any]) -> str:
    rate, budget = d["claims_per_s"], d["claim_budget_per_s"]
    if d["claim_budget_applied"]:
        return (f"{rate:,.0f} claimed jobs/s (steady) = {rate / budget:.2f} of this host's share "
                f"of --max-claims-per-sec, {budget:,.0f}/s (its bucket starts with 1 s of "
                "budget)")
    return (f"{rate:,.0f} claimed jobs/s (steady) = {rate / budget:.2f} of the default fleet "
            f"budget, {budget:,.0f}/s (not applied here: the drive measures the engine; "
            "pass --max-claims-per-sec to apply one)")
