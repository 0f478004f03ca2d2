"""Acting on namespaces that cross their budget: an Event on the namespace, and evictions where the admin asked.

The state itself needs no action: it is computed from the ledger on every read, so the webhook sees a namespace
over budget as soon as the report that crossed is committed. What is done here goes to the Kubernetes API and is
done off the request path, by one timekeeper process at a time (a lease in the database), every
TIMEKEEPER_DEMOTION_INTERVAL_SECONDS and at once when a report or a budget change crosses. Each pass looks at the
whole picture again, so an eviction a PodDisruptionBudget refused is retried on the next pass, and a process that
dies leaves nothing half-done that another cannot finish.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpusharing.contract import ANNOTATION_GPU_SHARE, BudgetState
from timekeeper import metrics
from timekeeper.budget import BudgetStatus
from timekeeper.kube import EvictionResult, KubeApi, KubeUnavailable
from timekeeper.store import BudgetStore

log = logging.getLogger(__name__)

LEASE = "demoter"
EXHAUSTED = "GPUBudgetExhausted"
RESTORED = "GPUBudgetRestored"


def eviction_candidates(pods: Iterable[Any], in_budget_class: str) -> list[str]:
    """Names of the running GPU pods that still carry the in-budget priority class (the webhook's GPU pods)."""
    names = []
    for pod in pods:
        metadata, spec, status = pod.metadata, pod.spec, pod.status
        if metadata is None or spec is None or metadata.deletion_timestamp is not None:
            continue
        if spec.priority_class_name != in_budget_class or ANNOTATION_GPU_SHARE not in (metadata.annotations or {}):
            continue
        if status is not None and status.phase == "Running":
            names.append(metadata.name)
    return sorted(names)


def transition_event(status: BudgetStatus, previous: BudgetState) -> tuple[str, str, bool] | None:
    """(reason, message, warning) of the Event for a change of state, or None when it deserves none."""
    if status.state is BudgetState.OVER_BUDGET:
        action = "its running GPU pods are being evicted" if status.evict_on_exhaustion else "running pods are left alone"
        return (
            EXHAUSTED,
            f"GPU budget exhausted: {status.used_gpu_minutes:.1f} of {status.allowance_gpu_minutes:g} GPU-minutes used "
            f"in the {status.period} period; new GPU pods get the over-budget priority class and {action}",
            True,
        )
    if previous is BudgetState.OVER_BUDGET:
        return RESTORED, f"GPU budget available again ({status.state}); new GPU pods get the in-budget priority class", False
    return None


@dataclass
class DemotionPass:
    events: list[tuple[str, str]] = field(default_factory=list)  # (namespace, reason)
    evicted: list[str] = field(default_factory=list)  # namespace/pod
    refused: list[str] = field(default_factory=list)


class Demoter:
    def __init__(self, budgets: BudgetStore, kube: KubeApi, in_budget_class: str, interval_seconds: float):
        self.budgets = budgets
        self.kube = kube
        self.in_budget_class = in_budget_class
        self.interval = interval_seconds
        self.holder = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._running = threading.Lock()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="demoter", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def run_once(self) -> DemotionPass | None:
        """One pass; None when another process holds the lease."""
        with self._running:
            if not self.budgets.acquire_lease(LEASE, self.holder, max(3 * self.interval, 30.0)):
                return None
            done = DemotionPass()
            acted = self.budgets.acted_states()
            statuses = {s.namespace: s for s in self.budgets.statuses()}
            for namespace in acted.keys() - statuses.keys():  # no longer listed: no budget and no use this period
                statuses[namespace] = self.budgets.status(namespace)
            for status in statuses.values():
                self._record_transition(status, acted.get(status.namespace, BudgetState.UNKNOWN), done)
                if status.state is BudgetState.OVER_BUDGET and status.evict_on_exhaustion:
                    self._evict(status.namespace, done)
            return done

    def _record_transition(self, status: BudgetStatus, previous: BudgetState, done: DemotionPass) -> None:
        if previous is status.state:
            return
        # Claimed before the Event is sent, so that two demoters (a lease that ran out under a long pass) never both
        # send it; given back when it cannot be sent, so that the next pass tries again.
        claimed = self.budgets.claim_transition(status.namespace, status.state)
        if claimed is None:
            return
        fields = {"namespace": status.namespace, "state": str(status.state), "previous_state": str(claimed)}
        event = transition_event(status, claimed)
        if event is not None:
            reason, message, warning = event
            try:
                recorded = self.kube.record_event(status.namespace, reason, message, warning)
            except KubeUnavailable as exc:
                self.budgets.release_transition(status.namespace, status.state, claimed)
                log.warning("%s; will try again", exc, extra=fields)
                return
            if recorded:
                metrics.EVENTS.labels(reason).inc()
                done.events.append((status.namespace, reason))
                fields["event"] = reason
        log.info("namespace %s: %s -> %s%s", status.namespace, claimed, status.state,
                 f" ({event[1]})" if event else "", extra=fields)

    def _evict(self, namespace: str, done: DemotionPass) -> None:
        try:
            names = eviction_candidates(self.kube.running_pods(namespace), self.in_budget_class)
        except KubeUnavailable as exc:
            log.warning("%s; will try again", exc)
            return
        for name in names:
            try:
                result = self.kube.evict(namespace, name)
            except KubeUnavailable as exc:
                log.warning("%s; will try again", exc)
                continue
            metrics.EVICTIONS.labels(result.value).inc()
            fields = {"namespace": namespace, "pod": name, "eviction": result.value}
            if result is EvictionResult.EVICTED:
                done.evicted.append(f"{namespace}/{name}")
                log.info("evicted pod %s/%s: its namespace is over its GPU budget", namespace, name, extra=fields)
            elif result is EvictionResult.REFUSED:
                done.refused.append(f"{namespace}/{name}")
                log.info("eviction of %s/%s refused by a PodDisruptionBudget; will try again", namespace, name, extra=fields)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # the loop must outlive a database or API outage
                log.exception("demotion pass failed; will try again")
            self._wake.wait(self.interval)
            self._wake.clear()
