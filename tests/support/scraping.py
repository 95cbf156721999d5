"""A host's Prometheus metrics (``--metrics-port``), read back with prometheus-client's own
parser."""

from __future__ import annotations

import urllib.request

from commands import RUN
from processes import Pgpool, start_pgpool
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample on /metrics, parsed by prometheus-client: {(name, labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def with_metrics(dsn: str, *args: str) -> tuple[Pgpool, int]:
    host = start_pgpool(dsn, *RUN, "--metrics-port", "0", "--metrics-host", "127.0.0.1",
                        *args)
    return host, host.event("metrics")["port"]
