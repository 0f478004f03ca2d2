"""Prometheus exposition that stays right when gunicorn runs several worker processes.

``gpusharing.serving`` points PROMETHEUS_MULTIPROC_DIR at a fresh directory before the workers start;
each worker then writes its samples there, and /metrics merges them.
"""

from __future__ import annotations

import os

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.registry import Collector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


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
