"""Fair share on a simulated cluster in simulated time: the controller's pass as the timekeeper makes it (decayed
usage, Fair Tree, the fair-share queue's release and the room it makes), Jobs that keep a backlog of one-GPU pods
(each made a second after the last ended, as the Job controller makes them), and a scheduler that places released pods
as they come. Without fair share, pods are placed first come, first served: the yardstick. What each namespace
received, against its entitlement, is what `bench/fairshare.py --converge` prints and the fair-share tests hold to.
"""

from __future__ import annotations

import collections
import datetime as dt
import heapq
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

from gpusharing.kube.owners import Owner
from timekeeper.accounting.record import RecordedPod
from timekeeper.cluster.fairshare import held_gpus, held_pods, queued_pods
from timekeeper.fairshare.decay import DecayedUsage
from timekeeper.fairshare.queue import FairShareOrder, make_room, mean_life, release
from timekeeper.fairshare.tree import ShareNode, rank_fair_tree

START = dt.datetime(2027, 1, 4, tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class Group:
    """A ClusterGPUBudget: a node of the tree with no pods of its own."""

    name: str
    weight: float
    parent: str | None = None


@dataclass(frozen=True)
class Team:
    """A namespace whose Jobs keep `backlog` one-GPU pods of `pod_seconds` each alive (running or waiting), from
    `joins_at` seconds on."""

    name: str
    weight: float
    backlog: int
    pod_seconds: float
    parent: str | None = None
    joins_at: float = 0.0


@dataclass(frozen=True)
class Settings:
    half_life: dt.timedelta
    interval: float  # seconds between two passes of the controller
    grace: dt.timedelta
    min_run_time: dt.timedelta


@dataclass
class _Pod:
    uid: str
    namespace: str
    created: float
    queued: bool
    started: float | None = None


@dataclass
class Received:
    """What a run gave each namespace: GPU-seconds over the window."""

    gpu_seconds: dict[str, float]
    entitled: dict[str, float]  # each namespace's share of the cluster with every team present
    window: tuple[float, float]
    evictions: int

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
        self.fair_share = fair_share  # off: every pod placed first come, first served
        self.replaced_after = replaced_after  # a Job controller sees a pod end, and makes its replacement, this late
        self.due: list[tuple[float, str]] = []  # (when, namespace) of replacements to come
        self.random = random.Random(seed)  # pods run their time +-25 %, and Jobs make pods in no fixed order
        self.groups = list(groups)
        self.teams = {team.name: team for team in teams}
        self.settings = settings
        self.now = 0.0
        self.usage = {name: DecayedUsage.zero(START) for name in self.teams}
        self.pods: dict[str, _Pod] = {}
        self.placing: collections.deque[str] = collections.deque()  # released (or never queued), first come first
        self.ends: list[tuple[float, str]] = []  # (end, uid) of running pods
        self.alive: dict[str, int] = dict.fromkeys(self.teams, 0)
        self.running = 0
        self.uids = itertools.count()
        self.ran_since: dict[str, float] = dict.fromkeys(self.teams, 0.0)  # GPU-seconds since the last pass
        self.received: dict[str, float] = dict.fromkeys(self.teams, 0.0)
        self.window = (0.0, 0.0)
        self.evictions = 0

    # -- the cluster ----------------------------------------------------------------------------------------------

    def _when(self, seconds: float) -> dt.datetime:
        return START + dt.timedelta(seconds=seconds)

    def _create(self, namespace: str) -> None:
        """A Job's new pod: queued behind the gate with fair share on, else straight to the scheduler."""
        uid = f"pod-{next(self.uids)}"
        self.pods[uid] = _Pod(uid, namespace, self.now, queued=self.fair_share)
        self.alive[namespace] += 1
        if not self.fair_share:
            self.placing.append(uid)

    def _top_up(self) -> None:
        """Each Job controller re-creates what finished or was evicted, up to its backlog, once its team joined."""
        wanted = [name for name, team in self.teams.items() if team.joins_at <= self.now
                  for _ in range(team.backlog - self.alive[name])]
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
        """Pods out of the queue, in the order they came out, onto free GPUs."""
        while self.placing and self.running < self.gpus:
            pod = self.pods.get(self.placing.popleft())
            if pod is None:
                continue
            pod.started = self.now
            self.running += 1
            seconds = self.teams[pod.namespace].pod_seconds * self.random.uniform(0.75, 1.25)
            heapq.heappush(self.ends, (self.now + seconds, pod.uid))

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
        if not self.fair_share:
            return
        nodes = self._nodes({name: usage.gpu_seconds for name, usage in self.usage.items()})
        records = [self._record(pod) for pod in self.pods.values()]
        held = held_gpus(records)
        order = FairShareOrder(nodes, held, dict.fromkeys(self.teams, mean_life(half_life)))
        queued = queued_pods(records, now)
        room = self.gpus - sum(held.values())
        released = release(order, queued, room, room)
        for out in released:
            self.pods[out.uid].queued = False
            self.placing.append(out.uid)
        taken = {out.uid for out in released}
        plan = make_room(order, [p for p in queued if p.uid not in taken],
                         held_pods([self._record(pod) for pod in self.pods.values()], now, self.settings.min_run_time),
                         room - len(released), self.gpus, now, self.settings.grace)
        for victim, _ in plan.evict:
            self._stop(self.pods[victim.uid], self.now)
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
            running=started is not None, gate=0 if pod.queued else None,
            created_at=self._when(pod.created),
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
        return Received(dict(self.received), entitled, self.window, self.evictions)
