"""Where things are: the tests, the handler modules that worker processes import, the
benchmarks."""

from __future__ import annotations

from pathlib import Path

#: tests/
TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
#: The handler modules (`--handlers testjobs`...): the working directory of every `pgpool`
#: process a test starts, as a deployment runs pgpool from its project's directory.
HANDLERS = TESTS / "handlers"
BENCH = ROOT / "bench"
#: The helpers of the tests, and the chaos harness (`make chaos` runs its chaos.py).
SUPPORT = TESTS / "support"
