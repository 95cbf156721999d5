"""A worker whose dispatcher is gone (its result pipe closed) ends quietly: no traceback in
the host's log for what is not a failure (the chaos soak saw one after a dispatcher kill)."""

from __future__ import annotations

import multiprocessing

import pytest

from pgpool.worker import main as worker


def test_a_worker_whose_results_nobody_reads_exits_without_a_traceback(
        capfd: pytest.CaptureFixture[str]) -> None:
    ctx = multiprocessing.get_context("spawn")
    tasks, tasks_in = ctx.Pipe(duplex=False)
    results_out, results = ctx.Pipe(duplex=False)
    bell_out, bell = ctx.Pipe(duplex=False)
    results_out.close()  # the dispatcher's ends: nobody will read what the worker writes
    bell_out.close()
    process = ctx.Process(target=worker.main, name="pgpool-worker-0",
                          args=(0, ["pgpool.bench.jobs"], tasks, results, bell,
                                multiprocessing.current_process().pid))
    process.start()
    process.join(60)
    tasks_in.close()
    assert process.exitcode == 0
    assert "Traceback" not in capfd.readouterr().err
