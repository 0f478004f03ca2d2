"""Bills governed GPU pods from the API server's record, on the controller's passes (one timekeeper process at a
time: the Lease's holder).

The leader follows the cluster's governed pods and ResourceClaims by watches. Every TIMEKEEPER_BILLING_INTERVAL_SECONDS
each running pod's bill grows by its share for the time since its last observation, and on every pass each pod that
ended (its containers terminated, or deleted) has its bill closed at its end and then its billing finalizer removed,
so the API server lets it go only once it is billed. A pod the watch lost sight of without an end (deleted without the
finalizer while no timekeeper watched) is closed as last observed; its meter's reports may still fill the gap. Running
pods whose meter has not reported for two meter intervals are still billed, and flagged: an Event on the pod, once.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial

from gpusharing.gpu.dra import ClaimSpec, allocated_claim_spec
from gpusharing.gpu.request import GpuRequestSettings
from gpusharing.kube.watching import WatchedObjects
from timekeeper import metrics
from timekeeper.accounting.record import RecordedPod, allocation_lookup, claimed_share, recorded_pod
from timekeeper.accounting.reports import PodObservation, ReportLedger
from timekeeper.cluster.kube import KubeApi, KubeUnavailable, ObjectRef

log = logging.getLogger(__name__)

OBSERVATIONS_PER_TRANSACTION = 500
METER_SILENT = "MeterSilent"


@dataclass
class BillingPass:
    observed: int = 0  # pods whose bill grew or closed
    closed: list[str] = field(default_factory=list)  # namespace/pod
    released: list[str] = field(default_factory=list)  # finalizers removed
    silent: list[str] = field(default_factory=list)  # meters newly flagged silent


class Biller:
    def __init__(
        self, ledger: ReportLedger, kube: KubeApi, settings: GpuRequestSettings, interval_seconds: float,
        meter_interval_seconds: float, monotonic: Callable[[], float] = time.monotonic,
    ):
        self.ledger = ledger
        self.kube = kube
        self.settings = settings
        self.interval = interval_seconds
        self.meter_interval = meter_interval_seconds
        self._monotonic = monotonic
        self._last_full: float | None = None
        self._closed: set[str] = set()  # uids whose bill this process closed and whose finalizer is gone
        self._departed: dict[str, RecordedPod] = {}  # seen deleted by the watch, not billed yet
        self._departures = threading.Lock()
        self.pods = WatchedObjects("governed GPU pods", kube.core.list_pod_for_all_namespaces,
                                   partial(recorded_pod, settings=settings), on_sync=metrics.record_pod_sync,
                                   on_delete=self._depart)
        self.claims: WatchedObjects[ClaimSpec] = WatchedObjects(
            "ResourceClaims", kube.resource.list_resource_claim_for_all_namespaces, allocated_claim_spec)
        self._started = False

    def start(self) -> None:
        if not self._started:
            self.pods.start()
            self.claims.start()
            self._started = True

    def stop(self) -> None:
        if self._started:
            self.pods.stop()
            self.claims.stop()
            self._started = False

    def _depart(self, pod: RecordedPod) -> None:
        """A pod deleted without the finalizer (or after it came off): billed to its end as it last was, else to when
        its deletion was seen."""
        if pod.finished_at is None:
            pod = replace(pod, finished_at=self.ledger.budgets.clock() if pod.started_at else None)
        with self._departures:
            self._departed[pod.uid] = pod

    def bill(self, now: dt.datetime) -> BillingPass | None:
        """One pass: every pod's bill when the interval has passed (else only the pods that ended), None until the
        watches have listed the cluster."""
        pods = self.pods.items
        if pods is None or self.claims.items is None:
            return None
        due = self._last_full is None or self._monotonic() - self._last_full >= self.interval
        if due:
            self._last_full = self._monotonic()
        done = BillingPass()
        lookup = allocation_lookup(self.claims.items)
        observations: list[PodObservation] = []
        ended: dict[str, RecordedPod] = {}
        with self._departures:
            departed = dict(self._departed)
        for pod in [*pods.values(), *departed.values()]:
            if pod.uid in self._closed:
                continue
            priced = (pod.share, pod.model) if pod.claimed is None else claimed_share(pod, self.settings, lookup)
            if priced is None or priced[0] is None:
                continue  # its claims' allocations are not known yet: observed at a later pass, for the whole time
            share, model = priced
            observation = pod.observation(share, now, self.meter_interval)
            if observation is None:
                if pod.deleted_at is not None or pod.finished_at is not None:
                    ended[pod.uid] = pod  # never started: nothing to bill, nothing to hold it for
                continue
            if observation.ended:
                if pod.uid not in departed:  # a departed pod has no finalizer left to release
                    ended[pod.uid] = pod
            elif not due:
                continue
            observations.append(PodObservation(pod.uid, pod.namespace, pod.name, share, observation, pod.labels, model))
        if due:
            watched = {pod.uid for pod in pods.values()} | departed.keys()
            observations += [PodObservation(uid, namespace, name, 0.0, None)
                             for uid, namespace, name in self.ledger.open_observed() if uid not in watched]
        for start in range(0, len(observations), OBSERVATIONS_PER_TRANSACTION):
            chunk = observations[start:start + OBSERVATIONS_PER_TRANSACTION]
            self.ledger.observe(chunk)
            done.observed += len(chunk)
        with self._departures:
            for uid in departed:
                self._departed.pop(uid, None)
        if due:  # forget what the watch no longer holds: the set stays the size of the cluster's ended pods
            self._closed &= {pod.uid for pod in pods.values()}
        done.closed = [f"{pod.namespace}/{pod.name}" for pod in ended.values()]
        self._release(ended, done)
        if due:
            self._flag_silent(pods, now, done)
        return done

    def _release(self, ended: Mapping[str, RecordedPod], done: BillingPass) -> None:
        """Finalizers come off only after the transaction that closed the bills committed."""
        for uid, pod in ended.items():
            if pod.finalizer is None:
                self._closed.add(uid)
                continue
            try:
                released = self.kube.release_pod(pod.namespace, pod.name, uid, pod.finalizer)
            except KubeUnavailable as exc:
                log.warning("%s; will try again", exc, extra={"namespace": pod.namespace, "pod": pod.name})
                continue
            if released:
                self._closed.add(uid)
                done.released.append(f"{pod.namespace}/{pod.name}")

    def _flag_silent(self, pods: Mapping[tuple[str, str], RecordedPod], now: dt.datetime, done: BillingPass) -> None:
        """An Event, once, on each running pod whose meter has said nothing for two meter intervals."""
        quiet_since = now - dt.timedelta(seconds=2 * self.meter_interval)
        running = {pod.uid: pod for pod in pods.values()
                   if pod.started_at is not None and pod.started_at < quiet_since and pod.finished_at is None
                   and pod.deleted_at is None}
        for uid in self.ledger.claim_silent(list(running), quiet_since, now):
            pod = running[uid]
            message = (f"the GPU meter of pod {pod.name} has not reported for {2 * self.meter_interval:g}s: the pod is "
                       "billed from its recorded start all the same; its GPU utilisation and memory are unknown")
            try:
                self.kube.record_object_event(ObjectRef("v1", "Pod", pod.name, uid, pod.namespace), METER_SILENT, message, True)
            except KubeUnavailable as exc:
                log.warning("%s", exc)
            metrics.EVENTS.labels(METER_SILENT).inc()
            done.silent.append(f"{pod.namespace}/{pod.name}")
            log.warning("%s", message, extra={"namespace": pod.namespace, "pod": pod.name, "event": METER_SILENT})
