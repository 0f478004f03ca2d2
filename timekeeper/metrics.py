"""The timekeeper's Prometheus metrics: counters merged across gunicorn workers, budget gauges read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpusharing.contract import BudgetState
from gpusharing.serving.metrics import LATENCY_BUCKETS
from gpusharing.units.weights import MICROS_PER_SECOND

if TYPE_CHECKING:
    from timekeeper.budgets.status import BudgetStatus
    from timekeeper.database.accounting.charging import ReportLedger
    from timekeeper.database.accounting.streaks import IdleLedger
    from timekeeper.database.cluster.commitments import PublishedCommitments

MIB = 1024 * 1024
# The per-pod series (pods overrunning their GPU memory, running pods) are at most this many each: bounded cardinality.
MAX_RUNNING_PODS = 10_000

NODE_READINGS = Counter(
    "gpusharing_timekeeper_node_readings",
    "Node agents' batches of readings answered, by outcome (recorded, rejected, unauthenticated, forbidden).",
    ["outcome"],
)
REPORTS = Counter(
    "gpusharing_timekeeper_reports",
    "Meter reports answered, by outcome "
    "(charged, duplicate, regressed, after-final, rejected, unauthenticated, forbidden).",
    ["outcome"],
)
LATENCY = Histogram(
    "gpusharing_timekeeper_request_duration_seconds",
    "Time to answer one API request.",
    ["endpoint"],
    buckets=LATENCY_BUCKETS,
    unit="seconds",
)
EVICTIONS = Counter("gpusharing_timekeeper_evictions", "Evictions asked of the API server, by result.", ["result"])
EVENTS = Counter(
    "gpusharing_timekeeper_events", "Events recorded on namespaces and budget resources, by reason.", ["reason"]
)
WARNINGS = Counter(
    "gpusharing_timekeeper_budget_warnings",
    "Budgets that reached a warning threshold (each once per period), by the highest threshold reached.",
    ["threshold"],
)
IDLE_ACTIONS = Counter(
    "gpusharing_timekeeper_idle_actions",
    "What the idle policies did, by action (warning: a GPUIdleWarning; warn, demote, evict: the policy's action) and "
    "result (done, evicted, refused by a PodDisruptionBudget, gone, spared: left running by demote).",
    ["action", "result"],
)
POD_SYNCS = Counter(
    "gpusharing_timekeeper_pod_syncs",
    "Lists and watches of the cluster's GPU pods (for safe admission's commitments, and for billing), by outcome.",
    ["outcome"],
)


# The controller's machinery (timekeeper.cluster.manager): its tasks, its Event queue, its caches.
TASK_DURATION = Histogram(
    "gpusharing_controller_task_duration_seconds",
    "Time one run of a controller task took, by task.",
    ["task"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0),
    unit="seconds",
)
TASK_LAG = Histogram(
    "gpusharing_controller_task_lag_seconds",
    "How late a controller task's run began after it was due, by task (another task's slow run never adds to it).",
    ["task"],
    buckets=(0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0),
    unit="seconds",
)
EVENTS_QUEUED = Gauge("gpusharing_controller_events_queued", "Events waiting in the controller's queue to be sent.",
                      multiprocess_mode="livesum")
EVENTS_DROPPED = Counter(
    "gpusharing_controller_events_dropped", "Events dropped because the controller's queue was full."
)
CACHED_OBJECTS = Gauge(
    "gpusharing_controller_cached_objects",
    "Objects held in the controller's informer caches, by kind.",
    ["kind"],
    multiprocess_mode="livesum",
)
FAIR_SHARE_NAMESPACES = Gauge("gpusharing_controller_fair_share_namespaces",
                              "Namespaces in each fair-share band, as the fairshare task last ranked them.", ["band"],
                              multiprocess_mode="livesum")
FAIR_SHARE_PODS = Gauge("gpusharing_controller_fair_share_pods", "Running GPU pods admitted in each fair-share band.",
                        ["band"], multiprocess_mode="livesum")
FAIR_SHARE_QUEUED = Gauge("gpusharing_controller_fair_share_queued_pods",
                          "GPU pods waiting in the fair-share queue (behind its scheduling gate) after the last pass.",
                          multiprocess_mode="livesum")
FAIR_SHARE_RELEASED = Counter("gpusharing_controller_fair_share_released_pods",
                              "GPU pods the fair-share queue released to kube-scheduler.")
GPU_NODES_UNKNOWN_MODEL = Gauge(
    "gpusharing_controller_gpu_nodes_unknown_model",
    "GPU nodes whose GPU model the catalogue does not know (no product label, or a model it lacks): their pods are "
    "billed on the default model.", multiprocess_mode="livesum")
GPU_CAPACITY = Gauge(
    "gpusharing_controller_gpu_capacity",
    "GPUs the cluster's nodes have, cordoned or not (MIG slices as their fraction), as the capacity task last read "
    "them.",
    multiprocess_mode="livesum")
GPUS_DOWN = Gauge("gpusharing_controller_gpus_down",
                  "Of those GPUs, the ones on nodes that are not Ready, as the capacity task last read them.",
                  multiprocess_mode="livesum")
STATEMENTS_WRITTEN = Counter("gpusharing_controller_statements_written",
                             "Signed statements this replica wrote, by kind (period: a closed billing period's; key: a "
                             "handover to a new signing key).", ["kind"])
STATED_UNTIL = Gauge("gpusharing_controller_stated_until_seconds",
                     "The end of the last billing period stated and signed (Unix time).", multiprocess_mode="max",
                     unit="seconds")
STATEMENT_KEY_UNRECOGNISED = Gauge(
    "gpusharing_controller_statement_key_unrecognised",
    "1 while the chain's key in force is neither the signing key nor the previous one configured: no statement is "
    "written until it is.", multiprocess_mode="max")
STATEMENT_CHAIN_REWOUND = Gauge(
    "gpusharing_controller_statement_chain_rewound",
    "1 while the chain of statements is shorter than, or other than, this replica saw it (statements removed or "
    "replaced in the database): no statement is written until a restart.", multiprocess_mode="max")
LEADING = Gauge("gpusharing_controller_leading", "1 while this controller replica holds the Lease, else 0.",
                multiprocess_mode="livesum")
UTILISATION_READINGS = Gauge(
    "gpusharing_controller_utilisation_readings",
    "Pods' GPU utilisation readings the last utilisation run read from Prometheus, by reading (known, unknown).",
    ["reading"], multiprocess_mode="livesum")


def observe_task(task: str, seconds: float, late: float) -> None:
    TASK_DURATION.labels(task).observe(seconds)
    TASK_LAG.labels(task).observe(late)


def record_pod_sync(ok: bool) -> None:
    POD_SYNCS.labels("ok" if ok else "failed").inc()


TOP_PODS = 20  # the pods shown by GPU time: a bounded number of series, whatever the number of pods
# A running pod whose meter is not heard from for the contract's two meter intervals (the ledger's fresh_seconds) is
# silent; one not heard from this long (killed without its final report) is let go.
GONE_AFTER_SECONDS = 3600


class LedgerCollector(Collector):
    """Per-budget gauges (namespaces' and groups'), the pods using the most GPU time, silent meters and per-pod
    memory overruns, computed from the database at each scrape.

    Read from the database rather than kept in each worker, so that every worker and every replica agrees.
    """

    def __init__(
        self,
        ledger: "ReportLedger",
        commitments: "PublishedCommitments | None" = None,
        idle: "IdleLedger | None" = None,
    ):
        self.ledger = ledger
        self.commitments = commitments
        self.idle = idle

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        # Prometheus' base units: GPU-seconds (budgets are set in GPU-minutes), bytes (meters report MiB).
        budget = GaugeMetricFamily(
            "gpusharing_timekeeper_budget_gpu_seconds", "Budget plus this period's top-ups (absent: unlimited).",
            labels=["namespace"], unit="gpu_seconds",
        )
        used = GaugeMetricFamily(
            "gpusharing_timekeeper_used_gpu_seconds",
            "GPU time used in the current period.",
            labels=["namespace"],
            unit="gpu_seconds",
        )
        remaining = GaugeMetricFamily(
            "gpusharing_timekeeper_remaining_gpu_seconds", "GPU time left in the current period.", labels=["namespace"],
            unit="gpu_seconds",
        )
        state = GaugeMetricFamily(
            "gpusharing_timekeeper_budget_state",
            "1 for the namespace's current (effective) state.",
            labels=["namespace", "state"],
        )
        info = GaugeMetricFamily(
            "gpusharing_timekeeper_budget_info",
            "1 per budget: its kind (namespace or group), parent and the budget that limits it ('' for none).",
            labels=["namespace", "kind", "parent", "limited_by"],
        )
        statuses = self.ledger.budgets.statuses()
        for status in statuses:
            ns = status.namespace
            used.add_metric([ns], status.used_gpu_minutes * 60)
            if status.allowance_gpu_minutes is not None:
                budget.add_metric([ns], status.allowance_gpu_minutes * 60)
                remaining.add_metric([ns], (status.remaining_gpu_minutes or 0.0) * 60)
            for candidate in (
                BudgetState.IN_BUDGET,
                BudgetState.WARNING,
                BudgetState.OVER_BUDGET,
                BudgetState.UNLIMITED,
            ):
                state.add_metric([ns, candidate.value], 1.0 if status.state is candidate else 0.0)
            info.add_metric([ns, status.kind, status.parent or "", status.limited_by or ""], 1.0)
        top = GaugeMetricFamily(
            "gpusharing_timekeeper_pod_gpu_seconds",
            f"GPU time billed to each of the {TOP_PODS} running pods that used the most "
            "(cumulative, since each started).",
            labels=["namespace", "pod"],
            unit="gpu_seconds",
        )
        for pod in self.ledger.top_pods(TOP_PODS):
            top.add_metric([pod.namespace, pod.pod], pod.micro_gpu_seconds / 1_000_000)
        silent = GaugeMetricFamily(
            "gpusharing_timekeeper_meters_silent",
            "Running pods whose meter is silent: flagged by the controller (no report for two meter intervals; the pod "
            "is billed all the same), or off a cluster, heard from within the last hour but not for two meter "
            "intervals.",
        )
        silent.add_metric([], float(self.ledger.silent_meters(self.ledger.fresh_seconds, GONE_AFTER_SECONDS)))
        disagreeing = GaugeMetricFamily(
            "gpusharing_timekeeper_meter_model_disagreements",
            "Pods not ended whose node agent or meter names a GPU model other than the one they are billed on (the "
            "node's): evidence to look into, never the bill.",
        )
        disagreeing.add_metric([], float(self.ledger.model_disagreements()))
        over = GaugeMetricFamily(
            "gpusharing_timekeeper_pod_gpu_memory_over_request_bytes",
            "GPU memory a running pod uses beyond what it requested; only pods that overrun are listed.",
            labels=["namespace", "pod"], unit="bytes",
        )
        for pod in self.ledger.pods(over_memory=True, limit=MAX_RUNNING_PODS):
            over.add_metric([pod.namespace, pod.pod], (pod.memory_over_request_mib or 0.0) * MIB)
        # Running pods by the labels OpenCost and kube-state-metrics use, so that cost tools charge the fraction of a
        # GPU a pod is billed for instead of the whole device (docs/budgets.md, "Usage in cost tools").
        pod_labels = ["namespace", "pod", "uid"]
        share = GaugeMetricFamily(
            "gpusharing_timekeeper_pod_billed_gpu_share",
            "The share of a GPU a running pod is billed for.",
            labels=pod_labels,
        )
        seconds = CounterMetricFamily(
            "gpusharing_timekeeper_pod_billed_gpu_seconds",
            "Weighted GPU-seconds (x the GPU model's billing weight) a running pod was charged since it started.",
            labels=pod_labels, unit="gpu_seconds",
        )
        running = self.ledger.pods(running=True, limit=MAX_RUNNING_PODS)
        billed = self.ledger.usage.billed([pod.pod_uid for pod in running])
        for pod in running:
            share.add_metric([pod.namespace, pod.pod, pod.pod_uid], pod.billed_share)
            seconds.add_metric([pod.namespace, pod.pod, pod.pod_uid], billed.get(pod.pod_uid, 0) / MICROS_PER_SECOND)
        committed = GaugeMetricFamily(
            "gpusharing_timekeeper_committed_gpu_seconds",
            "Weighted GPU time the namespace's pods with a deadline can still use (safe admission's commitments).",
            labels=["namespace"], unit="gpu_seconds",
        )
        by_namespace = self.commitments.by_namespace() if self.commitments is not None else None
        for ns, commitment in sorted((by_namespace or {}).items()):
            committed.add_metric([ns], commitment.micro_gpu_seconds / MICROS_PER_SECOND)
        yield from (budget, used, remaining, state, info, top, silent, disagreeing, over, share, seconds, committed)
        if self.idle is not None:
            yield from self._idle(self.idle, statuses)

    def _idle(self, idle: "IdleLedger", statuses: list["BudgetStatus"]) -> Iterator[GaugeMetricFamily]:
        """Per namespace: its GPU pods idle now and beyond their policy's warning, and its idle GPU time this period."""
        pods = GaugeMetricFamily(
            "gpusharing_timekeeper_idle_pods",
            "Running GPU pods whose latest reading (the node agent's or Prometheus's where fresh, else the meter's "
            "within two meter intervals) continued an idle streak: GPU utilisation under the idle policy's threshold "
            "(1 % without one). Unknown utilisation is never idle.",
            labels=["namespace"],
        )
        warned = GaugeMetricFamily(
            "gpusharing_timekeeper_idle_pods_warned",
            "Of those, the pods idle beyond the warning of the idle policy in force "
            "(warned, or acted on and still running).",
            labels=["namespace"],
        )
        for ns, (now_idle, beyond) in sorted(
            idle.idle_now(self.ledger.budgets.clock(), self.ledger.fresh_seconds).items()
        ):
            pods.add_metric([ns], float(now_idle))
            warned.add_metric([ns], float(beyond))
        seconds = GaugeMetricFamily(
            "gpusharing_timekeeper_idle_gpu_seconds",
            "GPU time the namespace's pods were billed for in its current period while their GPU was idle "
            "(share x time x (1 - utilisation), where the meter read utilisation; raw, not weighted).",
            labels=["namespace"],
            unit="gpu_seconds",
        )
        windows = [status.window for status in statuses if status.kind == "namespace"]
        use = idle.idle_use(min((w.start for w in windows), default=self.ledger.budgets.clock()).date())
        for status in statuses:
            if status.kind == "namespace" and status.namespace in use:
                window = status.window
                raw, _ = use[status.namespace].between(window.start.date(), window.end.date() if window.end else None)
                seconds.add_metric([status.namespace], raw / MICROS_PER_SECOND)
        yield from (pods, warned, seconds)
