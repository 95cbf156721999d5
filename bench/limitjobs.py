"""Handler modules' worth of limits for bench/limits.py: the bench kind given the limit the
environment variable ``PGPOOL_BENCH_LIMIT`` names (``concurrency:N`` or ``rate:R/PER``), set
on its handler before the host reads its handlers. Imported by the host (and its workers,
where it changes nothing they use)."""

import os

from pgpool import Limit
from pgpool.bench.jobs import bench_job

_what, _, _value = os.environ["PGPOOL_BENCH_LIMIT"].partition(":")
if _what == "concurrency":
    bench_job.limit = Limit(concurrency=int(_value))
else:
    _rate, _, _per = _value.partition("/")
    bench_job.limit = Limit(rate=int(_rate), per=float(_per))
