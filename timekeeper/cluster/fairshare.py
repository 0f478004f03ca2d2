"""The `fairshare` task of the controller's leader (with TIMEKEEPER_FAIRSHARE_ENABLED): each namespace's band ranked
from its decayed usage down the budget hierarchy (timekeeper.fairshare) and written for the listing and the budgets'
status; and the `fairshare-queue` task, more often, which releases the fair-share queue's pods in that order
(timekeeper.fairshare.queue).

GPU pods wait behind the fair-share gate until a pass releases them into the room the cluster has; where none comes
free in time for a namespace below its fair share, the fewest running pods are evicted for it, through the one
eviction path, their replacements queued in their turn (docs/fair-share.md, "The queue"). With fair share off, the
`fairshare-queue` task only releases every queued pod (`release_everyone`).
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpusharing.names import is_group
from gpusharing.units.duration import format_duration
from timekeeper import metrics
from timekeeper.accounting.record import RecordedPod
from timekeeper.budgets.hierarchy import ancestry
from timekeeper.budgets.periods import iso_utc
from timekeeper.budgets.status import Budget
from timekeeper.cluster.events import Event, EventQueue
from timekeeper.cluster.evictions import EvictionPath, PodRef
from timekeeper.cluster.informers import ClusterInformers
from timekeeper.cluster.objects import ObjectRef
from timekeeper.cluster.resources import FairShareSpec, budget_name, fair_share_spec
from timekeeper.config import FairShareSettings
from timekeeper.database.accounting.fairshare import FairShareLedger, Ranked
from timekeeper.database.budgets.store import BudgetStore
from timekeeper.fairshare.bands import BandState, band_reason, next_band, zero_use_change
from timekeeper.fairshare.decay import DecayedUsage
from timekeeper.fairshare.queue import (
    FairShareOrder,
    HeldPod,
    QueuedPod,
    make_room,
    mean_life,
    placeable,
    release,
)
from timekeeper.fairshare.tree import LevelStanding, NamespaceStanding, ShareNode, rank_fair_tree

log = logging.getLogger(__name__)

FAIR_SHARE_EVENT = "GPUFairShare"
MIN_WEIGHT = 1e-6  # a budget of 0 GPU-minutes still has a node in the tree (weights are > 0)


@dataclass(frozen=True)
class Standing:
    """A namespace's place this pass: its standing in the tree, its band, and the GPUs it holds."""

    standing: NamespaceStanding
    state: BandState
    reason: str
    held_gpus: float


@dataclass
class FairSharePass:
    """What one run of the `fairshare` task did."""

    standings: dict[str, Standing] = field(default_factory=dict)
    levels: dict[str, LevelStanding] = field(default_factory=dict)  # every node's standing among its siblings
    usage: dict[str, float] = field(default_factory=dict)  # decayed GPU-seconds now, by budget name (groups summed)
    cluster_gpus: float = 0.0
    at: dt.datetime | None = None
    nodes: list[ShareNode] = field(default_factory=list)  # the tree ranked, with each namespace's decayed usage
    mean_lives: dict[str, float] = field(default_factory=dict)  # by namespace: its half-life over ln 2, seconds


@dataclass
class QueuePass:
    """What one run of the `fairshare-queue` task did."""

    cluster_gpus: float = 0.0
    queued: int = 0  # pods that waited behind the gate when the pass began
    released: list[str] = field(default_factory=list)  # namespace/pod: released from the queue
    waiting: list[str] = field(default_factory=list)  # namespace/pod: queued past the grace, room made for them
    evicted: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    held_back: list[str] = field(default_factory=list)  # namespaces whose evictions wait for the webhooks


def share_nodes(
    budgets: Mapping[str, Budget], specs: Mapping[str, FairShareSpec], usage: Mapping[str, float]
) -> list[ShareNode]:
    """The budget hierarchy as Fair Tree's nodes: a budget's weight is its spec.fairShare.weight, else its GPU-minutes
    (an unlimited budget: the largest finite weight, so that it is no lighter than any other)."""
    finite = [b.gpu_minutes for b in budgets.values() if b.gpu_minutes is not None]
    unlimited = max(finite, default=1.0) or 1.0
    nodes = []
    for name, budget in sorted(budgets.items()):
        spec = specs.get(name, FairShareSpec())
        weight = (
            spec.weight
            if spec.weight is not None
            else (unlimited if budget.gpu_minutes is None else budget.gpu_minutes)
        )
        group = is_group(name)
        nodes.append(
            ShareNode(name, budget.parent, max(weight, MIN_WEIGHT), 0.0 if group else usage.get(name, 0.0), not group)
        )
    return nodes


def path_json(standing: NamespaceStanding) -> str:
    """A namespace's standing at each level down its path, as `gpusharing explain` shows it (Slurm's `sshare -l`)."""
    return json.dumps([{"level": s.level, "node": s.node, "share": round(s.share, 6), "usage": round(s.usage, 6),
                        "ratio": round(s.ratio, 6), "rank": s.rank, "siblings": s.siblings} for s in standing.path])


def holds(pod: RecordedPod) -> bool:
    """Whether a pod holds its GPUs or is being given them: out of the queue (released, or never queued), not ended."""
    return pod.gate is None and pod.finished_at is None and pod.deleted_at is None


def held_gpus(pods: Sequence[RecordedPod]) -> dict[str, float]:
    """The GPUs each namespace's pods in budget hold or are being given, as the queue and the burst guard count them:
    what was released from the queue (Kueue's entry penalty counts what is admitted, not what waits)."""
    held: dict[str, float] = {}
    for pod in pods:
        if holds(pod) and not pod.demoted:
            held[pod.namespace] = held.get(pod.namespace, 0.0) + pod.admitted
    return held


def queued_pods(pods: Sequence[RecordedPod], now: dt.datetime) -> list[QueuedPod]:
    """The pods waiting behind the fair-share gate."""
    return [QueuedPod(p.namespace, p.name, p.uid, p.admitted, not p.demoted, p.created_at or now)
            for p in pods if p.gate is not None and p.finished_at is None and p.deleted_at is None]


def held_pods(pods: Sequence[RecordedPod], now: dt.datetime, min_run_time: dt.timedelta) -> list[HeldPod]:
    """The pods that hold GPUs; evictable once run for `min_run_time`, with a controller to re-create them."""
    return [HeldPod(p.namespace, p.name, p.uid, p.admitted, not p.demoted,
                    p.owner is not None and p.running and p.started_at is not None
                    and now - p.started_at >= min_run_time)
            for p in pods if holds(p)]


class FairShareTask:
    """The `fairshare` task of the controller's leader, on the shared caches."""

    def __init__(
        self,
        settings: FairShareSettings,
        ledger: FairShareLedger,
        budgets: BudgetStore,
        informers: ClusterInformers,
        evictions: EvictionPath,
        events: EventQueue,
        now: Callable[[], dt.datetime],
        ungate: Callable[[str, str, str, int], bool],
    ):
        """`ungate(namespace, name, uid, gate_index)` releases a pod from the queue (KubeApi.ungate_pod)."""
        self.settings = settings
        self.ungate = ungate
        self.ledger = ledger
        self.budgets = budgets
        self.informers = informers
        self.evictions = evictions
        self.events = events
        self.now = now
        self.last: FairSharePass | None = None

    def run(self) -> FairSharePass | None:
        """One pass; None until the pod cache has listed the cluster. LeaseLost when the Lease is lost on the way."""
        items = self.informers.pods.items
        if items is None:
            return None
        self.last = self.rank([pod.record for pod in list(items.values())], self.now())
        return self.last

    def run_queue(self) -> QueuePass | None:
        """One pass of the queue, on the tree the last ranking read and the pods and nodes cached now; None until
        both are listed and the tree ranked."""
        items, ranked = self.informers.pods.items, self.last
        if items is None or ranked is None or self.informers.nodes.items is None:
            return None
        done = QueuePass(cluster_gpus=self.informers.cluster_gpus())
        self._queue([pod.record for pod in list(items.values())], ranked, done, self.now())
        return done

    def rank(self, pods: Sequence[RecordedPod], now: dt.datetime) -> FairSharePass:
        """Every namespace's band from its decayed usage now, written with its reason; the metrics per band."""
        bands = self.settings.bands
        specs = {budget_name(obj): fair_share_spec(obj) for _, obj in self.informers.budget_resources()}
        budgets = self.budgets.budgets()
        records = self.ledger.records()
        usage = {
            name: record.usage.at(now, self._half_life(specs.get(name))).gpu_seconds for name, record in records.items()
        }
        nodes = share_nodes(budgets, specs, usage)
        standings = rank_fair_tree(nodes)
        states = {}
        for name, standing in standings.items():
            record = records.get(name)
            previous = None if record is None or record.band is None or record.band_since is None \
                or record.band >= len(bands.classes) else BandState(record.band, record.band_since)
            states[name] = next_band(bands, previous, standing, now)
        held = held_gpus(pods)
        done = FairSharePass(cluster_gpus=self.informers.cluster_gpus(), at=now, nodes=nodes,
                             mean_lives={name: mean_life(self._half_life(specs.get(name))) for name in standings})
        ranked = []
        for name, standing in sorted(standings.items()):
            state = states[name]
            half_life = self._half_life(specs.get(name))
            reason = band_reason(standing, bands.classes[state.band], half_life)
            usage_now = DecayedUsage(usage.get(name, 0.0), now)
            done.standings[name] = Standing(standing, state, reason, held.get(name, 0.0))
            spec = specs.get(name)
            ranked.append(Ranked(name, state.band, state.since, reason, standing.ratio, standing.rank,
                                 standing.share_of_cluster * done.cluster_gpus, held.get(name, 0.0),
                                 None if spec is None else spec.half_life_seconds, path_json(standing),
                                 zero_use_change(bands, state, standing, usage_now, half_life, now)))
            for level in standing.path:
                done.levels[level.node] = level
        self.ledger.rank(ranked, now)
        for name in budgets:
            done.usage[name] = done.usage.get(name, 0.0) + (0.0 if is_group(name) else usage.get(name, 0.0))
            for ancestor in [] if is_group(name) else ancestry(budgets, name):
                done.usage[ancestor] = done.usage.get(ancestor, 0.0) + usage.get(name, 0.0)
        self._measure(pods, done)
        return done

    def _half_life(self, spec: FairShareSpec | None) -> dt.timedelta:
        seconds = None if spec is None else spec.half_life_seconds
        return self.settings.half_life if seconds is None else dt.timedelta(seconds=seconds)

    def _measure(self, pods: Sequence[RecordedPod], done: FairSharePass) -> None:
        classes = self.settings.bands.classes
        namespaces = dict.fromkeys(classes, 0)
        for standing in done.standings.values():
            namespaces[classes[standing.state.band]] += 1
        running = dict.fromkeys(classes, 0)
        for pod in pods:
            if pod.band in running and pod.started_at is not None and pod.finished_at is None:
                running[pod.band] += 1
        for band in classes:
            metrics.FAIR_SHARE_NAMESPACES.labels(band).set(namespaces[band])
            metrics.FAIR_SHARE_PODS.labels(band).set(running[band])

    def statuses(self) -> dict[str, dict[str, Any]]:
        """The budgets' status.fairShare as the last pass ranked them: a namespace's band, ratio, rank, decayed usage
        (GPU-hours), as of when, and why; a group's ratio and rank among its siblings."""
        done = self.last
        if done is None or done.at is None:
            return {}
        classes = self.settings.bands.classes
        result: dict[str, dict[str, Any]] = {}
        for name, level in done.levels.items():
            standing = done.standings.get(name)
            result[name] = {
                "ratio": round(standing.standing.ratio if standing else level.ratio, 3),
                "rank": standing.standing.rank if standing else level.rank,
                "usage": round(done.usage.get(name, 0.0) / 3600, 3),
                "asOf": iso_utc(done.at),
                **(
                    {"band": classes[standing.state.band], "reason": standing.reason}
                    if standing
                    else {
                        "reason": f"{name} ranks {level.rank} of {level.siblings} among its siblings, "
                        f"at {level.ratio:.2f}x its share"
                    }
                ),
            }
        return result

    # -- the queue -------------------------------------------------------------------------------------------------

    def _queue(self, pods: Sequence[RecordedPod], ranked: FairSharePass, done: QueuePass, now: dt.datetime) -> None:
        """Releases what the room allows in fair-share order, then evicts for the pods that waited past the grace."""
        queued = queued_pods(pods, now)
        done.queued = len(queued)
        held_by = held_gpus(pods)
        in_budget = math.fsum(held_by.values())
        everyone = math.fsum(p.admitted for p in pods if holds(p))
        capacity = done.cluster_gpus
        order = FairShareOrder(ranked.nodes, held_by, ranked.mean_lives)
        if capacity <= 0 and queued:
            # No GPU the nodes advertise can be counted (a backend's resources this version cannot read): no pod is
            # held back from a GPU kube-scheduler may find free; the bands' priorities alone order them.
            log.warning("fair share: the nodes offer no GPU the controller can count; %d queued pods released",
                        len(queued))
            released = queued
        else:
            queued = placeable(queued, capacity)
            released = release(order, queued, capacity - in_budget, capacity - everyone)
        gates = {p.uid: p.gate for p in pods}
        for pod in released:
            gate = gates.get(pod.uid)
            if gate is not None and self.ungate(pod.namespace, pod.name, pod.uid, gate):
                done.released.append(f"{pod.namespace}/{pod.name}")
        metrics.FAIR_SHARE_RELEASED.inc(len(done.released))
        metrics.FAIR_SHARE_QUEUED.set(done.queued - len(done.released))
        taken = {pod.uid for pod in released}
        held = [*held_pods(pods, now, self.settings.min_run_time),
                *(HeldPod(p.namespace, p.name, p.uid, p.gpus, p.in_budget, False) for p in released)]
        room = capacity - in_budget - math.fsum(p.gpus for p in released if p.in_budget)
        plan = make_room(order, [p for p in queued if p.uid not in taken], held, room, capacity, now,
                         self.settings.grace)
        done.waiting = [f"{p.namespace}/{p.name}" for p in plan.waiting]
        by_namespace: dict[str, list[tuple[HeldPod, QueuedPod]]] = {}
        for victim, for_pod in plan.evict:
            by_namespace.setdefault(victim.namespace, []).append((victim, for_pod))
        for namespace, pairs in by_namespace.items():
            # Its replacements must be admitted as it stands now: every webhook holds a listing read after it changed.
            standing = ranked.standings.get(namespace)
            since = standing.state.since if standing is not None else now
            for_whom, why = self._why(namespace, pairs[0][1], ranked, now)
            result = self.evictions.evict(
                f"fair share: {why}",
                [PodRef(p.namespace, p.name, p.uid) for p, _ in pairs],
                since.timestamp(),
                on_evicted=lambda ref, why=why, to=for_whom: self._tell(ref, to, why),  # type: ignore[misc]
            )
            if result.waiting:
                done.held_back.append(namespace)
            done.evicted += [str(pod) for pod in result.evicted]
            done.refused += [str(pod) for pod in result.refused]

    def _why(self, namespace: str, waiting: QueuedPod, done: FairSharePass, now: dt.datetime) -> tuple[str, str]:
        """The namespace the pods are evicted for, and why."""
        waited = format_duration(round((now - waiting.queued_since).total_seconds()))
        standing = done.standings.get(namespace)
        why = (f"pods of namespace {waiting.namespace}, below its fair share, waited in the fair-share queue for "
               f"{waited}; {namespace} ranks below it"
               + (f" ({standing.reason})" if standing is not None else "")
               + ", and its controller re-creates the pod, which waits in the queue in its turn")
        return waiting.namespace, why

    def _tell(self, pod: PodRef, for_whom: str, why: str) -> None:
        # The namespace the pod made room for, as a reference `gpusharing explain` reads (kube-scheduler's Preempted
        # Event names its preemptor so): its name is in the message already, nothing of it more.
        self.events.put(Event(FAIR_SHARE_EVENT, f"evicted for fair share: {why}",
                              about=ObjectRef("v1", "Pod", pod.name, pod.uid, pod.namespace),
                              related=ObjectRef("v1", "Namespace", for_whom, "")))


def release_everyone(pods: Sequence[RecordedPod], ungate: Callable[[str, str, str, int], bool]) -> int:
    """With fair share off, every pod still queued is released (queued before fair share was turned off): how many."""
    return sum(1 for pod in pods if pod.gate is not None and pod.deleted_at is None
               and ungate(pod.namespace, pod.name, pod.uid, pod.gate))
