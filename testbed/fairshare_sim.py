"""Fair share on a simulated cluster in simulated time: the controller's pass as the timekeeper makes it (decayed
usage, Fair Tree, next_band, the burst guard's count, the rebalance), the webhook's admission band, Jobs that keep a
backlog of one-GPU pods, and a scheduler that serves waiting pods by priority, first come first served within one,
preempting lower priorities as kube-scheduler does. What each namespace received, against its entitlement, is what
`bench/fairshare.py converge` prints and the fair-share tests hold to.
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

from gpusharing.fairshare import FairShareBands, admission_band
from gpusharing.kube.owners import Owner
from timekeeper.accounting.record import RecordedPod
from timekeeper.cluster.fairshare import held_gpus, rebalance
from timekeeper.config import DEFAULT_BAND_CLASSES
from timekeeper.fairshare.bands import BandState, next_band
from timekeeper.fairshare.decay import DecayedUsage
from timekeeper.fairshare.tree import NamespaceStanding, ShareNode, rank_fair_tree

START = dt.datetime(2027, 1, 4, tzinfo=dt.timezone.utc)
# The chart's values of the default classes: light, in budget, heavy.
PRIORITIES = dict(zip(DEFAULT_BAND_CLASSES, (1500, 1000, 500)))


@dataclass(frozen=True)
class Group:
    """A ClusterGPUBudget: a node of the tree with no pods of its own."""

    name: str
    weight: float
    parent: str | None = None


@dataclass(frozen=True)
class Team:
    """A namespace whose Jobs keep `backlog` one-GPU pods of `pod_seconds` each alive (running or waiting)."""

    name: str
    weight: float
    backlog: int
    pod_seconds: float
    parent: str | None = None


@dataclass(frozen=True)
class Settings:
    half_life: dt.timedelta
    interval: float  # seconds between two passes of the controller
    grace: dt.timedelta
    min_run_time: dt.timedelta
    bands: FairShareBands


@dataclass
class _Pod:
    uid: str
    namespace: str
    band: str
    created: float
    started: float | None = None


@dataclass
class Received:
    """What a run gave each namespace: GPU-seconds over the window."""

    gpu_seconds: dict[str, float]
    entitled: dict[str, float]  # each namespace's share of the cluster with every team present
    window: tuple[float, float]
    evictions: int
    preemptions: int

    def share(self, namespace: str) -> float:
        total = sum(self.gpu_seconds.values())
        return self.gpu_seconds.get(namespace, 0.0) / total if total else 0.0

    def off_by(self, namespace: str) -> float:
        """The received share's relative distance from the entitled one: +0.1 is 10 % more."""
        return self.share(namespace) / self.entitled[namespace] - 1.0


class Simulation:
    def __init__(self, gpus: int, groups: Sequence[Group], teams: Sequence[Team], settings: Settings, seed: int = 0,
                 fair_share: bool = True, replaced_after: float = 1.0):
        self.gpus = gpus
        self.fair_share = fair_share  # off: every pod in the one in-budget class, first come first served
        self.replaced_after = replaced_after  # a Job controller sees a pod end, and makes its replacement, this late
        self.due: list[tuple[float, str]] = []  # (when, namespace) of replacements to come
        self.random = random.Random(seed)  # pods run their time +-25 %, and Jobs make pods in no fixed order
        self.groups = list(groups)
        self.teams = {team.name: team for team in teams}
        self.settings = settings
        self.now = 0.0
        self.usage = {name: DecayedUsage.zero(START) for name in self.teams}
        self.states: dict[str, BandState] = {}
        self.standings: dict[str, NamespaceStanding] = {}
        self.held: dict[str, float] = {}
        self.admitted_since: dict[str, float] = {}  # the webhook's admissions since the last count
        self.pods: dict[str, _Pod] = {}
        self.waiting: list[tuple[int, float, int, str]] = []  # (-priority, created, seq, uid)
        self.ends: list[tuple[float, str]] = []  # (end, uid) of running pods
        self.by_priority: list[tuple[int, float, str]] = []  # (priority, -started, uid) of running pods: victims first
        self.alive: dict[str, int] = dict.fromkeys(self.teams, 0)
        self.running = 0
        self.uids = itertools.count()
        self.ran_since: dict[str, float] = dict.fromkeys(self.teams, 0.0)  # GPU-seconds since the last pass
        self.received: dict[str, float] = dict.fromkeys(self.teams, 0.0)
        self.window = (0.0, 0.0)
        self.evictions = 0
        self.preemptions = 0

    # -- the cluster ----------------------------------------------------------------------------------------------

    def _when(self, seconds: float) -> dt.datetime:
        return START + dt.timedelta(seconds=seconds)

    def _create(self, namespace: str) -> None:
        """A Job's new pod, admitted as the webhook admits it: its namespace's band, or one lower past its share."""
        standing = self.standings.get(namespace)
        state = self.states.get(namespace)
        band = 1 if state is None or not self.fair_share else state.band
        if standing is not None and self.fair_share:
            share_gpus = standing.share_of_cluster * self.gpus
            held = self.held.get(namespace, 0.0) + self.admitted_since.get(namespace, 0.0)
            admitted_in = admission_band(self.settings.bands, band, held, share_gpus, 1.0)
            if admitted_in == band:
                self.admitted_since[namespace] = self.admitted_since.get(namespace, 0.0) + 1.0
            band = admitted_in
        uid = f"pod-{next(self.uids)}"
        pod = _Pod(uid, namespace, self.settings.bands.classes[band], self.now)
        self.pods[uid] = pod
        self.alive[namespace] += 1
        heapq.heappush(self.waiting, (-PRIORITIES[pod.band], pod.created, int(uid[4:]), uid))

    def _top_up(self) -> None:
        """Each Job controller re-creates what finished or was evicted, up to its backlog."""
        wanted = [name for name, team in self.teams.items() for _ in range(team.backlog - self.alive[name])]
        self.random.shuffle(wanted)
        for name in wanted:
            self._create(name)

    def _stop(self, pod: _Pod, until: float) -> None:
        assert pod.started is not None
        self._ran(pod.namespace, max(pod.started, self._last_count), until)
        heapq.heappush(self.due, (until + self.replaced_after, pod.namespace))
        self.running -= 1
        del self.pods[pod.uid]

    def _ran(self, namespace: str, start: float, end: float) -> None:
        if end > start:
            self.ran_since[namespace] += end - start
            lo, hi = max(start, self.window[0]), min(end, self.window[1])
            if hi > lo:
                self.received[namespace] += hi - lo

    def _schedule(self) -> None:
        """Waiting pods by priority, first come first served within one; a pod that finds no free GPU preempts the
        lowest-priority running pod below its own, the most recently started first."""
        while self.waiting:
            _, _, _, uid = self.waiting[0]
            pod = self.pods.get(uid)
            if pod is None or pod.started is not None:
                heapq.heappop(self.waiting)
                continue
            if self.running >= self.gpus:
                victim = self._victim(PRIORITIES[pod.band])
                if victim is None:
                    return
                self._stop(victim, self.now)
                self.preemptions += 1
            heapq.heappop(self.waiting)
            pod.started = self.now
            self.running += 1
            seconds = self.teams[pod.namespace].pod_seconds * self.random.uniform(0.75, 1.25)
            heapq.heappush(self.ends, (self.now + seconds, uid))
            heapq.heappush(self.by_priority, (PRIORITIES[pod.band], -self.now, uid))

    def _victim(self, priority: int) -> _Pod | None:
        while self.by_priority:
            lowest, _, uid = self.by_priority[0]
            pod = self.pods.get(uid)
            if pod is None:
                heapq.heappop(self.by_priority)
                continue
            return pod if lowest < priority else None
        return None

    # -- the controller -------------------------------------------------------------------------------------------

    def _pass(self) -> None:
        now = self._when(self.now)
        for pod in self.pods.values():  # running pods count to now, as each billing pass moves them on
            if pod.started is not None:
                self._ran(pod.namespace, max(pod.started, self._last_count), self.now)
        half_life = self.settings.half_life
        for name, seconds in self.ran_since.items():
            self.usage[name] = self.usage[name].plus(seconds, self._when(self._last_count), now, half_life) \
                if seconds else self.usage[name].at(now, half_life)
            self.ran_since[name] = 0.0
        self._last_count = self.now
        self.standings = rank_fair_tree(self._nodes({name: usage.gpu_seconds for name, usage in self.usage.items()}))
        if not self.fair_share:
            return
        for name, standing in self.standings.items():
            self.states[name] = next_band(self.settings.bands, self.states.get(name), standing, now)
        records = [self._record(pod) for pod in self.pods.values()]
        current = {name: state.band for name, state in self.states.items()}
        self.held = held_gpus(records, self.settings.bands.classes, current)
        self.admitted_since = {}
        ratios = {name: standing.ratio for name, standing in self.standings.items()}
        plan = rebalance(records, self.settings.bands, current, ratios, now, self.settings.grace,
                         self.settings.min_run_time)
        for victim in plan.evict:
            pod = self.pods[victim.uid]
            self._stop(pod, self.now)
            self.evictions += 1

    def _nodes(self, usage: dict[str, float]) -> list[ShareNode]:
        """The tree: the groups, and each namespace with its decayed GPU-seconds."""
        nodes = [ShareNode(g.name, g.parent, g.weight, 0.0, False) for g in self.groups]
        return nodes + [ShareNode(t.name, t.parent, t.weight, usage.get(t.name, 0.0), True)
                        for t in self.teams.values()]

    def _record(self, pod: _Pod) -> RecordedPod:
        started = None if pod.started is None else self._when(pod.started)
        return RecordedPod(
            uid=pod.uid, namespace=pod.namespace, name=pod.uid, share=1.0, admitted=1.0, model=None, labels=(),
            started_at=started, finished_at=None, deleted_at=None, finalizer=None,
            owner=Owner("batch/v1", "Job", f"{pod.namespace}-job", f"{pod.namespace}-job"),
            running=started is not None, bound=started is not None, band=pod.band,
            unschedulable_since=None if started is not None else self._when(pod.created),
        )

    # -- a run ----------------------------------------------------------------------------------------------------

    _last_count = 0.0

    def run(self, seconds: float, window_from: float) -> Received:
        """Runs the cluster for `seconds`; GPU-seconds are counted from `window_from` to the end."""
        self.window = (window_from, seconds)
        next_pass = 0.0
        while self.now < seconds:
            if self.now >= next_pass:
                self._pass()
                next_pass += self.settings.interval
            self._top_up()
            self._schedule()
            upcoming = [next_pass, seconds]
            if self.due:
                upcoming.append(self.due[0][0])
            if self.ends:
                upcoming.append(self.ends[0][0])
            self.now = min(upcoming)
            while self.due and self.due[0][0] <= self.now:
                self.alive[heapq.heappop(self.due)[1]] -= 1
            while self.ends and self.ends[0][0] <= self.now:
                _, uid = heapq.heappop(self.ends)
                ended = self.pods.get(uid)
                if ended is not None and ended.started is not None:
                    self._stop(ended, self.now)
        for pod in self.pods.values():
            if pod.started is not None:
                self._ran(pod.namespace, max(pod.started, self._last_count), self.now)
        entitled = {name: standing.share_of_cluster for name, standing in rank_fair_tree(self._nodes({})).items()}
        return Received(dict(self.received), entitled, self.window, self.evictions, self.preemptions)
