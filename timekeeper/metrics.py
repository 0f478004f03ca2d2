"""The timekeeper's Prometheus metrics: counters merged across gunicorn workers, budget gauges read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpusharing.contract import BudgetState
from gpusharing.metrics import LATENCY_BUCKETS
from timekeeper.budget import MICROS_PER_GPU_MINUTE

if TYPE_CHECKING:
    from timekeeper.accounting import ReportLedger

MAX_RUNNING_PODS = 10_000

REPORTS = Counter(
    "gpusharing_timekeeper_reports",
    "Meter reports answered, by outcome (charged, duplicate, regressed, after-final, rejected, unauthenticated, forbidden).",
    ["outcome"],
)
LATENCY = Histogram(
    "gpusharing_timekeeper_request_duration_seconds",
    "Time to answer one API request.",
    ["endpoint"],
    buckets=LATENCY_BUCKETS,
)
EVICTIONS = Counter("gpusharing_timekeeper_evictions", "Evictions asked of the API server, by result.", ["result"])
EVENTS = Counter("gpusharing_timekeeper_events", "Events recorded on namespaces, by reason.", ["reason"])


class LedgerCollector(Collector):
    """Per-namespace budget gauges and per-pod memory overruns, computed from the database at each scrape.

    Read from the database rather than kept in each worker, so that every worker and every replica agrees.
    """

    def __init__(self, ledger: "ReportLedger"):
        self.ledger = ledger

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        budget = GaugeMetricFamily(
            "gpusharing_timekeeper_budget_gpu_minutes", "Budget plus this period's top-ups (absent: unlimited).", labels=["namespace"]
        )
        used = GaugeMetricFamily(
            "gpusharing_timekeeper_used_gpu_minutes", "GPU-minutes used in the current period.", labels=["namespace"]
        )
        remaining = GaugeMetricFamily(
            "gpusharing_timekeeper_remaining_gpu_minutes", "GPU-minutes left in the current period.", labels=["namespace"]
        )
        state = GaugeMetricFamily(
            "gpusharing_timekeeper_budget_state", "1 for the namespace's current state.", labels=["namespace", "state"]
        )
        for status in self.ledger.budgets.statuses():
            ns = status.namespace
            used.add_metric([ns], status.used_gpu_minutes)
            if status.allowance_gpu_minutes is not None:
                budget.add_metric([ns], status.allowance_gpu_minutes)
                remaining.add_metric([ns], status.remaining_gpu_minutes or 0.0)
            for candidate in (BudgetState.IN_BUDGET, BudgetState.OVER_BUDGET, BudgetState.UNLIMITED):
                state.add_metric([ns, candidate.value], 1.0 if status.state is candidate else 0.0)
        over = GaugeMetricFamily(
            "gpusharing_timekeeper_pod_gpu_memory_over_request_mib",
            "GPU memory a running pod uses beyond what it requested (MiB); only pods that overrun are listed.",
            labels=["namespace", "pod"],
        )
        for pod in self.ledger.pods(over_memory=True, limit=MAX_RUNNING_PODS):
            over.add_metric([pod.namespace, pod.pod], pod.memory_over_request_mib or 0.0)
        # Running pods by the labels OpenCost and kube-state-metrics use, so that cost tools charge the fraction of a
        # GPU a pod is billed for instead of the whole device (README: "Usage in cost tools").
        pod_labels = ["namespace", "pod", "uid"]
        share = GaugeMetricFamily(
            "gpusharing_timekeeper_pod_billed_gpu_share", "The share of a GPU a running pod is billed for.", labels=pod_labels
        )
        minutes = CounterMetricFamily(
            "gpusharing_timekeeper_pod_billed_gpu_minutes",
            "Weighted GPU-minutes (x the GPU model's billing weight) a running pod was charged since it started.",
            labels=pod_labels,
        )
        running = self.ledger.pods(running=True, limit=MAX_RUNNING_PODS)
        billed = self.ledger.usage.billed([pod.pod_uid for pod in running])
        for pod in running:
            share.add_metric([pod.namespace, pod.pod, pod.pod_uid], pod.billed_share)
            minutes.add_metric([pod.namespace, pod.pod, pod.pod_uid], billed.get(pod.pod_uid, 0) / MICROS_PER_GPU_MINUTE)
        yield from (budget, used, remaining, state, over, share, minutes)
