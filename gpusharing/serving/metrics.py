"""Prometheus exposition that stays right when gunicorn runs several worker processes.

``gpusharing.serving.server`` points PROMETHEUS_MULTIPROC_DIR at a fresh directory before the workers start;
each worker then writes its samples there, and /metrics merges them.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.registry import Collector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Request latencies of the services, from half a millisecond (an admission) to a second (a stalled database).
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

# The series a request is counted in, kept: prometheus_client's labels() costs as much as the increment. Only for
# labels a service chose (the webhook's endpoints, operations, decisions, dialects, verdicts, the priority classes
# it gives, which its settings name; the timekeeper's outcomes and endpoints): a few dozen series at most.
_SERIES: dict[tuple[Any, tuple[str, ...]], Any] = {}


def series(metric: Any, *labels: str) -> Any:
    """`metric.labels(*labels)`, made once."""
    key = (metric, labels)
    found = _SERIES.get(key)
    if found is None:
        found = _SERIES[key] = metric.labels(*labels)
    return found


def render_metrics(*extra: Collector) -> tuple[bytes, str]:
    """The exposition body and its content type; `extra` collectors are computed at scrape time."""
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    if extra:
        scraped = CollectorRegistry()
        for collector in extra:
            scraped.register(collector)
        return generate_latest(registry) + generate_latest(scraped), CONTENT_TYPE_LATEST
    return generate_latest(registry), CONTENT_TYPE_LATEST
