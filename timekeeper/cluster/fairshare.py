"""The `fairshare` task of the controller's leader (with TIMEKEEPER_FAIRSHARE_ENABLED): each namespace's band ranked
from its decayed usage down the budget hierarchy (timekeeper.fairshare) and written for the listing and the budgets'
status; running pods rebalanced.

A pod's priority cannot change, so running pods keep the band they were admitted in; only when pods of a higher band
have waited unschedulable past the grace period are the fewest blocking pods evicted, through the one eviction path,
to be re-created in their namespace's band now (docs/fair-share.md, "Running pods").
"""

from __future__ import annotations

import datetime as dt
import json
import logging
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
from timekeeper.fairshare.bands import BandState, FairShareBands, band_reason, next_band, zero_use_change
from timekeeper.fairshare.decay import DecayedUsage
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
    waiting: list[str] = field(default_factory=list)  # namespace/pod: of a higher band, unschedulable past the grace
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


def held_gpus(pods: Sequence[RecordedPod], classes: Sequence[str], bands: Mapping[str, int]) -> dict[str, float]:
    """The GPUs each namespace's pods in budget hold or are being given, as the burst guard counts them: pods bound to
    a node, and pods waiting in their namespace's band (`bands`, by namespace) or above it. Pods waiting lower, beyond
    the fair share, are not counted (Kueue's entry penalty counts what is admitted, not what waits): a team's own
    queue never pushes its next pods below its band."""
    index = {name: i for i, name in enumerate(classes)}
    held: dict[str, float] = {}
    for pod in pods:
        if pod.finished_at is not None or pod.deleted_at is not None or pod.demoted:
            continue
        in_band = pod.band in index and index[pod.band or ""] <= bands.get(pod.namespace, len(classes))
        if pod.bound or pod.started_at is not None or in_band:
            held[pod.namespace] = held.get(pod.namespace, 0.0) + pod.admitted
    return held


@dataclass(frozen=True)
class Rebalance:
    """Who waits and whom to evict for them (plain data, `rebalance`)."""

    waiting: tuple[RecordedPod, ...]
    evict: tuple[RecordedPod, ...]


def rebalance(
    pods: Sequence[RecordedPod],
    bands: FairShareBands,
    current: Mapping[str, int],
    ratios: Mapping[str, float],
    now: dt.datetime,
    grace: dt.timedelta,
    min_run_time: dt.timedelta,
) -> Rebalance:
    """The fewest running pods to evict so that pods of a higher band, unschedulable for longer than `grace`, can
    preempt their way in: pods admitted in a band no lower than the waiting pods' (so those cannot preempt them)
    whose namespace's band is now lower than both that and the band of the lightest namespace that waits, heaviest
    namespace first, biggest pods first, each run for `min_run_time`, each with a controller to re-create it; as
    many GPUs as that namespace's waiting pods ask for."""
    index = {name: i for i, name in enumerate(bands.classes)}
    waiting = [p for p in pods if p.started_at is None and p.deleted_at is None and p.band in index
               and p.unschedulable_since is not None and now - p.unschedulable_since >= grace]
    if not waiting:
        return Rebalance((), ())
    highest = min(index[p.band] for p in waiting if p.band is not None)
    waiting = [p for p in waiting if index.get(p.band or "") == highest]
    # Room is made for the lightest namespace that waits, from namespaces heavier than it: never between equals.
    lightest = min(current.get(p.namespace, len(bands.classes)) for p in waiting)
    waiting = [p for p in waiting if current.get(p.namespace, len(bands.classes)) == lightest]
    needed = sum(p.admitted for p in waiting)
    candidates = [
        p for p in pods
        if p.band in index and index[p.band] <= highest and current.get(p.namespace, -1) > max(index[p.band], lightest)
        and p.owner is not None and p.running and p.started_at is not None and now - p.started_at >= min_run_time
        and p.finished_at is None and p.deleted_at is None
    ]
    candidates.sort(
        key=lambda p: (-current[p.namespace], -ratios.get(p.namespace, 0.0), p.namespace, -p.admitted, p.name)
    )
    chosen: list[RecordedPod] = []
    freed = 0.0
    for pod in candidates:
        if freed >= needed:
            break
        chosen.append(pod)
        freed += pod.admitted
    return Rebalance(tuple(waiting), tuple(chosen))


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
    ):
        self.settings = settings
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
        now = self.now()
        pods = [pod.record for pod in list(items.values())]
        done = self.rank(pods, now)
        self._rebalance(pods, done, now)
        self.last = done
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
        standings = rank_fair_tree(share_nodes(budgets, specs, usage))
        states = {}
        for name, standing in standings.items():
            record = records.get(name)
            previous = None if record is None or record.band is None or record.band_since is None \
                or record.band >= len(bands.classes) else BandState(record.band, record.band_since)
            states[name] = next_band(bands, previous, standing, now)
        held = held_gpus(pods, bands.classes, {name: state.band for name, state in states.items()})
        done = FairSharePass(cluster_gpus=self.informers.cluster_gpus(), at=now)
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

    # -- running pods ----------------------------------------------------------------------------------------------

    def _rebalance(self, pods: Sequence[RecordedPod], done: FairSharePass, now: dt.datetime) -> None:
        current = {name: s.state.band for name, s in done.standings.items()}
        ratios = {name: s.standing.ratio for name, s in done.standings.items()}
        plan = rebalance(
            pods, self.settings.bands, current, ratios, now, self.settings.grace, self.settings.min_run_time
        )
        done.waiting = [f"{p.namespace}/{p.name}" for p in plan.waiting]
        by_namespace: dict[str, list[RecordedPod]] = {}
        for pod in plan.evict:
            by_namespace.setdefault(pod.namespace, []).append(pod)
        for namespace, victims in by_namespace.items():
            # Its replacements must be admitted in its band now: every webhook holds a listing read after it changed.
            since = done.standings[namespace].state.since
            for_whom, why = self._why(namespace, plan.waiting, done, now)
            result = self.evictions.evict(
                f"fair share: {why}",
                [PodRef(p.namespace, p.name, p.uid) for p in victims],
                since.timestamp(),
                on_evicted=lambda ref, why=why, to=for_whom: self._tell(ref, to, why),  # type: ignore[misc]
            )
            if result.waiting:
                done.held_back.append(namespace)
            done.evicted += [str(pod) for pod in result.evicted]
            done.refused += [str(pod) for pod in result.refused]

    def _why(
        self, namespace: str, waiting: Sequence[RecordedPod], done: FairSharePass, now: dt.datetime
    ) -> tuple[str, str]:
        """The namespace the pods are evicted for, and why."""
        first = min(waiting, key=lambda p: (p.unschedulable_since or now, p.namespace, p.name))
        waited = format_duration(round((now - (first.unschedulable_since or now)).total_seconds()))
        classes = self.settings.bands.classes
        why = (f"pods of namespace {first.namespace} in band {first.band} waited unschedulable for {waited}; "
               f"{namespace} is now in band {classes[done.standings[namespace].state.band]} "
               f"({done.standings[namespace].reason}), and its controller re-creates the pod in that band")
        return first.namespace, why

    def _tell(self, pod: PodRef, for_whom: str, why: str) -> None:
        # The namespace the pod made room for, as a reference `gpusharing explain` reads (kube-scheduler's Preempted
        # Event names its preemptor so): its name is in the message already, nothing of it more.
        self.events.put(Event(FAIR_SHARE_EVENT, f"evicted for fair share: {why}",
                              about=ObjectRef("v1", "Pod", pod.name, pod.uid, pod.namespace),
                              related=ObjectRef("v1", "Namespace", for_whom, "")))
