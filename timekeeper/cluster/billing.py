"""The `bills`, `ended` and `silent-meters` tasks of the controller's leader: governed pods billed from the API
server's record (docs/budgets.md, "Accounting").

Running pods' bills grow by their share for the time since their last observation; an ended pod's bill closes at its
recorded end, and only then does its billing finalizer come off, so that the API server lets it go once billed. A pod
the watch lost sight of without an end is closed as last observed. A running pod whose meter has not reported for two
meter intervals is still billed, and flagged once by a `MeterSilent` Event. A bound pod is billed on its node's GPU
model (timekeeper.accounting.placement); a GPU node whose model the catalogue does not know is flagged once by a
`GPUModelUnknown` Event.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpusharing.contract import fresh_for
from gpusharing.gpu.capacity import NodeGpus
from gpusharing.gpu.catalogue import PRODUCT_LABEL, describe
from gpusharing.gpu.dra import ClaimLookup, ClaimSpec
from gpusharing.gpu.request import GpuRequestSettings
from gpusharing.kube.watching import WatchedObjects
from timekeeper import metrics
from timekeeper.accounting.placement import Placement, placement
from timekeeper.accounting.record import RecordedPod, allocation_lookup
from timekeeper.cluster.events import Event, EventQueue
from timekeeper.cluster.informers import GovernedPod
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.objects import KubeUnavailable, ObjectRef
from timekeeper.database.accounting.charging import PodObservation, ReportLedger

log = logging.getLogger(__name__)

OBSERVATIONS_PER_TRANSACTION = 500
METER_SILENT = "MeterSilent"
GPU_MODEL_UNKNOWN = "GPUModelUnknown"


@dataclass
class BillingPass:
    observed: int = 0  # pods whose bill grew or closed
    closed: list[str] = field(default_factory=list)  # namespace/pod
    released: list[str] = field(default_factory=list)  # finalizers removed


class Biller:
    """Three tasks on the controller's scheduler: `bills` (every running pod's bill grows), `ended` (the bills of
    pods that ended close, their finalizers come off) and `silent-meters`, on the shared pod, claim and node caches."""

    def __init__(
        self, ledger: ReportLedger, kube: KubeApi, settings: GpuRequestSettings, pods: WatchedObjects[GovernedPod],
        claims: WatchedObjects[ClaimSpec], nodes: WatchedObjects[NodeGpus], events: EventQueue,
        meter_interval_seconds: float,
    ):
        self.ledger = ledger
        self.kube = kube
        self.settings = settings
        self.pods = pods
        self.claims = claims
        self.nodes = nodes
        self.events = events
        self.meter_interval = meter_interval_seconds
        self._closed: set[str] = set()  # uids whose bill this process closed and whose finalizer is gone
        self._departed: dict[str, RecordedPod] = {}  # seen deleted by the watch, not billed yet
        self._departures = threading.Lock()
        self._placed: dict[str, Placement] = {}  # uid -> its share and model on its node, read once it is bound
        self._unknown_flagged: set[tuple[str, str | None]] = set()  # (node uid, what it names): flagged once
        self._billing = threading.Lock()  # `bills` and `ended` observe one pod at a time
        pods.subscribe(on_delete=self._depart)

    def _depart(self, pod: GovernedPod) -> None:
        """A pod deleted without the finalizer (or after it came off): billed to its end as it last was, else to when
        its deletion was seen."""
        record = pod.record
        if record.finished_at is None:
            record = replace(record, finished_at=self.ledger.budgets.clock() if record.started_at else None)
        with self._departures:
            self._departed[record.uid] = record

    def bill_running(self, now: dt.datetime) -> BillingPass | None:
        """The `bills` task: every pod's bill grows to now (and ended ones close); None until the caches have listed."""
        return self._bill(now, grow=True)

    def close_ended(self, now: dt.datetime) -> BillingPass | None:
        """The `ended` task: only the pods that ended are billed to their end and let go."""
        return self._bill(now, grow=False)

    def _bill(self, now: dt.datetime, grow: bool) -> BillingPass | None:
        items = self.pods.items
        if items is None or self.claims.items is None or self.nodes.items is None:
            return None
        with self._billing:
            pods = {key: pod.record for key, pod in list(items.items())}
            return self._observe(pods, now, grow)

    def _observe(self, pods: Mapping[tuple[str, str], RecordedPod], now: dt.datetime, grow: bool) -> BillingPass:
        done = BillingPass()
        lookup = allocation_lookup(self.claims.items or {})
        observations: list[PodObservation] = []
        ended: dict[str, RecordedPod] = {}
        with self._departures:
            departed = dict(self._departed)
        for pod in [*pods.values(), *departed.values()]:
            if pod.uid in self._closed:
                continue
            placed = self._placement(pod, lookup)
            if placed is None:
                continue  # its claims' allocations are not known yet: observed at a later pass, for the whole time
            share = placed.share
            observation = pod.observation(share, now, self.meter_interval)
            if observation is None:
                if pod.deleted_at is not None or pod.finished_at is not None:
                    ended[pod.uid] = pod  # never started: nothing to bill, nothing to hold it for
                continue
            if observation.ended:
                if pod.uid not in departed:  # a departed pod has no finalizer left to release
                    ended[pod.uid] = pod
            elif not grow:
                continue
            observations.append(
                PodObservation(pod.uid, pod.namespace, pod.name, share, observation, pod.labels, placed.model.name,
                               pod.node))
        if grow:
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
        if grow:  # forget what the watch no longer holds: the sets stay the size of the cluster's pods
            watching = {pod.uid for pod in pods.values()}
            self._closed &= watching
            self._placed = {uid: placed for uid, placed in self._placed.items() if uid in watching}
            self._flag_unknown_models()
        done.closed = [f"{pod.namespace}/{pod.name}" for pod in ended.values()]
        self._release(ended, done)
        return done

    def placement(self, pod: RecordedPod) -> Placement | None:
        """The pod's share and model as it is billed now (safe admission's commitments are corrected by it)."""
        return self._placement(pod, allocation_lookup(self.claims.items or {}))

    def _placement(self, pod: RecordedPod, claims: ClaimLookup) -> Placement | None:
        """Read once the pod's node is known, then kept: a pod does not move, and is billed on one model for life."""
        placed = self._placed.get(pod.uid)
        if placed is not None:
            return placed
        node = (self.nodes.items or {}).get(("", pod.node)) if pod.node is not None else None
        placed = placement(pod, node, self.settings, claims)
        if placed is not None and placed.node is not None:
            self._placed[pod.uid] = placed
        return placed

    def _flag_unknown_models(self) -> None:
        """A `GPUModelUnknown` Event, once, on each GPU node the catalogue cannot name the GPUs of, and their count."""
        unknown = {name: node for (_, name), node in list((self.nodes.items or {}).items()) if node.unknown_model}
        metrics.GPU_NODES_UNKNOWN_MODEL.set(len(unknown))
        default = describe(self.settings.catalogue.default)
        for name, node in sorted(unknown.items()):
            if (node.uid, node.named) in self._unknown_flagged:
                continue
            self._unknown_flagged.add((node.uid, node.named))
            said = (f"names its GPUs {node.named!r}, a model the GPU model catalogue does not have" if node.named else
                    f"has no {PRODUCT_LABEL} label (nor HAMi's device register)")
            message = (f"node {name} {said}: pods bound to it are billed on the catalogue's default model, {default}; "
                       "add the model to the catalogue (GPUSHARING_GPU_MODELS_FILE) or label the node as GPU feature "
                       "discovery does")
            self.events.put(Event(GPU_MODEL_UNKNOWN, message, about=ObjectRef("v1", "Node", name, node.uid, None)))
            log.warning("%s", message, extra={"node": name, "event": GPU_MODEL_UNKNOWN})

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

    def flag_silent(self, now: dt.datetime) -> list[str] | None:
        """The `silent-meters` task: an Event, once, on each running pod whose meter has said nothing for two meter
        intervals; the pods flagged (namespace/pod), None until the pods are listed."""
        items = self.pods.items
        if items is None:
            return None
        quiet_since = now - dt.timedelta(seconds=fresh_for(self.meter_interval))
        running = {pod.record.uid: pod.record for pod in list(items.values())
                   if pod.record.started_at is not None and pod.record.started_at < quiet_since
                   and pod.record.finished_at is None and pod.record.deleted_at is None}
        flagged = []
        for uid in self.ledger.claim_silent(list(running), quiet_since, now):
            pod = running[uid]
            message = (
                f"the GPU meter of pod {pod.name} has not reported for {fresh_for(self.meter_interval):g}s: the pod is "
                "billed from its recorded start all the same; its GPU utilisation and memory are unknown"
            )
            self.events.put(Event(METER_SILENT, message, about=ObjectRef("v1", "Pod", pod.name, uid, pod.namespace)))
            flagged.append(f"{pod.namespace}/{pod.name}")
            log.warning("%s", message, extra={"namespace": pod.namespace, "pod": pod.name, "event": METER_SILENT})
        return flagged
