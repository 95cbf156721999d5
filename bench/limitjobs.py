"""Handler modules' worth of limits for bench/limits.py: the bench kind given the limit the
environment variable ``PGPOOL_BENCH_LIMIT`` names (``concurrency:N`` or ``rate:R/PER``, each
optionally ending ``@tenant``: per tenant), set on its handler before the host reads its
handlers. Imported by the host (and its workers, where it changes nothing they use)."""

import os

from pgpool import Limit
from pgpool.bench.jobs import bench_job

_spec, _, _by = os.environ["PGPOOL_BENCH_LIMIT"].partition("@")
_what, _, _value = _spec.partition(":")
if _what == "concurrency":
    bench_job.limit = Limit(concurrency=int(_value), by=_by or None)  # type: ignore[arg-type]
else:
    _rate, _, _per = _value.partition("/")
    bench_job.limit = Limit(rate=int(_rate), per=float(_per), by=_by or None)  # type: ignore[arg-type]
