"""The fair-share queue (Kueue's admission gate over Slurm's Fair Tree): GPU pods wait behind a scheduling gate, and
each pass releases them into the room the cluster has, the namespace that ranks lightest first, where a namespace's
usage counts what it holds as if it kept it for the half-life's mean life (the entry penalty). Under a backlog every
team then holds its weight's share; a namespace that used less lately holds more until its usage catches up. Where
no room comes free in time, the fewest running pods are evicted for a waiting namespace below its fair share.
docs/fair-share.md ("The queue") tells why, and what convergence to expect.
"""

from __future__ import annotations

import datetime as dt
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpusharing.fairshare import GPU_SLACK
from timekeeper.fairshare.tree import ShareNode


@dataclass(frozen=True)
class QueuedPod:
    """A GPU pod waiting behind the fair-share gate."""

    namespace: str
    name: str
    uid: str
    gpus: float  # the share it was admitted with
    in_budget: bool  # out of budget: released only into room nobody in budget waits for
    queued_since: dt.datetime  # its creation: the queue is first come, first served within a namespace


@dataclass(frozen=True)
class HeldPod:
    """A GPU pod released from the queue (or never queued) that has not ended: it holds its GPUs, or is about to."""

    namespace: str
    name: str
    uid: str
    gpus: float
    in_budget: bool
    evictable: bool  # running past the minimum run time, with a controller to re-create it


def mean_life(half_life: dt.timedelta) -> float:
    """Seconds a GPU held now counts for in decayed usage, were it held for ever: the half-life over ln 2."""
    return half_life.total_seconds() / math.log(2)


class FairShareOrder:
    """The namespaces' order as the queue reads it: Fair Tree's, over each namespace's decayed usage plus the GPUs it
    holds times its mean life, updated as pods are released or evicted. Among siblings Fair Tree ranks by usage over
    weight (their usage normalised by what they used together orders them alike), ties by name; so the lightest
    namespace with pods waiting is found by walking down from the root, lightest branch with pods waiting first, and
    a release or an eviction changes only its namespace's ancestors: each costs the tree's depth, not its size."""

    def __init__(self, nodes: Sequence[ShareNode], held: Mapping[str, float], mean_lives: Mapping[str, float]):
        self.nodes = {node.name: node for node in nodes}
        self.mean_lives = mean_lives
        self.paths = {name: self._path(name) for name in self.nodes}  # root first, the node itself last
        self.usage = {name: 0.0 for name in self.nodes}  # the subtree's decayed usage, what it holds counted in
        for name, node in self.nodes.items():
            if node.is_namespace:
                self._add(name, node.usage + held.get(name, 0.0) * mean_lives.get(name, 0.0))

    def _path(self, name: str) -> tuple[str, ...]:
        path = [name]
        parent = self.nodes[name].parent
        while parent is not None and parent in self.nodes and len(path) <= len(self.nodes):
            path.append(parent)
            parent = self.nodes[parent].parent
        return tuple(reversed(path))

    def _add(self, namespace: str, seconds: float) -> None:
        for name in self.paths[namespace]:
            self.usage[name] = max(0.0, self.usage[name] + seconds)

    def sibling_key(self, name: str) -> tuple[float, str]:
        """A node's place among its siblings: lighter first."""
        return self.usage[name] / self.nodes[name].weight, name

    def key(self, namespace: str) -> tuple[tuple[float, str], ...]:
        """The namespace's place: lighter keys first, as Fair Tree's depth-first order; a namespace without a budget
        after every one with."""
        path = self.paths.get(namespace)
        return ((math.inf, namespace),) if path is None else tuple(self.sibling_key(name) for name in path)

    def move(self, namespace: str, gpus: float) -> None:
        """The namespace takes `gpus` more (gives them up when negative)."""
        if namespace in self.paths:
            self._add(namespace, gpus * self.mean_lives.get(namespace, 0.0))

    def saved(self, *namespaces: str) -> dict[str, float]:
        """The figures a move of `namespaces` changes, to put back exactly (`restore`)."""
        return {name: self.usage[name] for namespace in namespaces for name in self.paths.get(namespace, ())}

    def restore(self, saved: Mapping[str, float]) -> None:
        self.usage.update(saved)

    def ahead_after(self, taker: str, gpus: float, giver: str, given: float) -> bool:
        """Whether `taker` still ranks ahead of `giver` once it took `gpus` and `giver` gave up `given`."""
        saved = self.saved(taker, giver)
        self.move(taker, gpus)
        self.move(giver, -given)
        ahead = self.key(taker) < self.key(giver)
        self.restore(saved)
        return ahead

    def fair_share_gpus(self, namespaces: Iterable[str], capacity: float) -> dict[str, float]:
        """Each of `namespaces`' share of `capacity` (the product of its weight's share among its siblings with one of
        `namespaces` below them, down its path): what the queue converges to under a backlog."""
        wanted = {name for namespace in namespaces for name in self.paths.get(namespace, ())}
        weights: dict[str | None, float] = {}
        for name in wanted:
            parent = self.nodes[name].parent
            weights[parent] = weights.get(parent, 0.0) + self.nodes[name].weight
        shares = {}
        for namespace in namespaces:
            if namespace in self.paths and self.nodes[namespace].is_namespace:
                share = capacity
                for name in self.paths[namespace]:
                    share *= self.nodes[name].weight / weights[self.nodes[name].parent]
                shares[namespace] = share
        return shares


class Lightest:
    """The namespaces with pods waiting, lightest first in `order`: a heap of each group's children with one of them
    below, whose entries a move makes stale (skipped) and renews (`moved`): each pick and each move costs the tree's
    depth times a heap's, however many namespaces wait."""

    def __init__(self, order: FairShareOrder, namespaces: Iterable[str]):
        self.order = order
        self.waiting: dict[str, int] = {}  # node -> namespaces with pods waiting below it (itself included)
        self.outside: list[str] = []  # namespaces with no budget: after every one with one
        for namespace in namespaces:
            if namespace not in order.paths:
                self.outside.append(namespace)
            for name in order.paths.get(namespace, ()):
                self.waiting[name] = self.waiting.get(name, 0) + 1
        self.outside.sort()
        self.heaps: dict[str | None, list[tuple[float, str]]] = {}
        for name in self.waiting:
            self._push(name)

    def _push(self, name: str) -> None:
        heapq.heappush(self.heaps.setdefault(self.order.nodes[name].parent, []), self.order.sibling_key(name))

    def first(self) -> str | None:
        """The lightest namespace with pods waiting; None when none waits."""
        level: str | None = None
        while True:
            heap = self.heaps.get(level, [])
            while heap and (not self.waiting.get(heap[0][1]) or heap[0] != self.order.sibling_key(heap[0][1])):
                heapq.heappop(heap)  # no longer waiting, or moved since (a fresher entry is in the heap)
            if not heap:
                return self.outside[0] if level is None and self.outside else None
            level = heap[0][1]
            if self.order.nodes[level].is_namespace:
                return level

    def moved(self, namespace: str) -> None:
        """`namespace`'s figures changed (order.move): its waiting branches are placed again."""
        for name in self.order.paths.get(namespace, ()):
            if self.waiting.get(name):
                self._push(name)

    def done(self, namespace: str) -> None:
        """`namespace` waits no more (its queue is empty, or left for this pass)."""
        if namespace not in self.order.paths:
            self.outside.remove(namespace)
            return
        for name in self.order.paths[namespace]:
            self.waiting[name] -= 1


def _queues(queued: Iterable[QueuedPod]) -> dict[str, list[QueuedPod]]:
    queues: dict[str, list[QueuedPod]] = {}
    for pod in sorted(queued, key=lambda p: (p.queued_since, p.name)):
        queues.setdefault(pod.namespace, []).append(pod)
    return queues


def fits(gpus: float, room: float) -> bool:
    return gpus <= room * (1 + GPU_SLACK) + GPU_SLACK


def placeable(queued: Sequence[QueuedPod], capacity: float) -> list[QueuedPod]:
    """The queued pods that could run were the whole `capacity` free: the others wait without holding the queue, or
    a pod asking for more GPUs than the cluster has would keep every other pod waiting behind it for ever."""
    return [pod for pod in queued if fits(pod.gpus, capacity)]


def release(order: FairShareOrder, queued: Sequence[QueuedPod], room_in_budget: float, room: float) -> list[QueuedPod]:
    """The queued pods to release now, in order: pods in budget into `room_in_budget` (the capacity no pod in budget
    holds: kube-scheduler preempts pods out of budget for them), the lightest namespace's oldest pod first, until the
    lightest one's next pod does not fit (it keeps the room: a big pod is not passed for ever by small ones); then,
    when none in budget waits, pods out of budget, oldest first, into `room` (the capacity nobody holds)."""
    released: list[QueuedPod] = []
    queues = _queues(p for p in queued if p.in_budget)
    lightest = Lightest(order, queues)
    while (namespace := lightest.first()) is not None:
        pod = queues[namespace][0]
        if not fits(pod.gpus, room_in_budget):
            return released
        released.append(pod)
        room_in_budget -= pod.gpus
        room -= pod.gpus
        order.move(namespace, pod.gpus)
        lightest.moved(namespace)
        queues[namespace].pop(0)
        if not queues[namespace]:
            lightest.done(namespace)
    for pod in sorted((p for p in queued if not p.in_budget), key=lambda p: (p.queued_since, p.name)):
        if not fits(pod.gpus, room):
            break
        released.append(pod)
        room -= pod.gpus
    return released


@dataclass(frozen=True)
class MadeRoom:
    """Whom the queue waits to release, and whom to evict for them."""

    waiting: tuple[QueuedPod, ...]  # in budget, queued past the grace period, with room made for them
    evict: tuple[tuple[HeldPod, QueuedPod], ...]  # each pod to evict, and the waiting pod it makes room for


def make_room(
    order: FairShareOrder,
    queued: Sequence[QueuedPod],
    held: Sequence[HeldPod],
    room: float,
    capacity: float,
    now: dt.datetime,
    grace: dt.timedelta,
) -> MadeRoom:
    """The fewest running pods to evict so that pods in budget queued past `grace` are released: for the lightest
    namespace that waits, while it is below its fair share of `capacity` (among the namespaces that want GPUs) with
    its next pod, the pods of the heaviest namespaces first, biggest first, each only while the waiting namespace
    still ranks ahead of the pod's once it took its pod and the other gave up its own (Kueue's fair-sharing
    preemption): equals never evict each other, nor a namespace over its share its way further up. `room`: the
    capacity no pod in budget holds."""
    queues = _queues(p for p in queued if p.in_budget and now - p.queued_since >= grace)
    if not queues:
        return MadeRoom((), ())
    holding: dict[str, float] = {}
    for running in held:
        if running.in_budget:
            holding[running.namespace] = holding.get(running.namespace, 0.0) + running.gpus
    shares = order.fair_share_gpus({*holding, *(p.namespace for p in queued if p.in_budget)}, capacity)
    victims: dict[str, list[HeldPod]] = {}
    for running in sorted(held, key=lambda p: (-p.gpus, p.name)):
        if running.in_budget and running.evictable:
            victims.setdefault(running.namespace, []).append(running)
    givers = sorted(victims, key=order.key, reverse=True)  # heaviest first, as the pass began
    lightest = Lightest(order, queues)
    waiting: list[QueuedPod] = []
    evict: list[tuple[HeldPod, QueuedPod]] = []
    while (namespace := lightest.first()) is not None:
        pod = queues[namespace].pop(0)
        if not fits(pod.gpus, room):
            if not fits(holding.get(namespace, 0.0) + pod.gpus, shares.get(namespace, 0.0)):
                lightest.done(namespace)  # at its share: its later pods wait for room to come free
                continue
            chosen = _victims(order, namespace, pod.gpus, pod.gpus - room, givers, victims)
            if chosen is None:
                lightest.done(namespace)
                continue
            evict += [(victim, pod) for victim in chosen]
            for victim in chosen:
                victims[victim.namespace].remove(victim)
                holding[victim.namespace] -= victim.gpus
                room += victim.gpus
                lightest.moved(victim.namespace)
            waiting.append(pod)
        room -= pod.gpus
        holding[namespace] = holding.get(namespace, 0.0) + pod.gpus
        order.move(namespace, pod.gpus)
        lightest.moved(namespace)
        if not queues[namespace]:
            lightest.done(namespace)
    return MadeRoom(tuple(waiting), tuple(evict))


def _victims(
    order: FairShareOrder, taker: str, gpus: float, needed: float, givers: Sequence[str],
    victims: Mapping[str, list[HeldPod]],
) -> list[HeldPod] | None:
    """Running pods that free `needed` GPUs for `taker`'s pod of `gpus`, from `givers` heaviest first, up to the first
    one `taker` would not rank ahead of; or None. The order is left as if they were evicted."""
    saved = order.saved(taker)
    chosen: list[HeldPod] = []
    freed = 0.0
    for giver in givers:
        if fits(needed, freed):
            break
        if giver == taker or not victims[giver]:
            continue
        if not order.ahead_after(taker, gpus, giver, victims[giver][0].gpus):
            break  # nor of the lighter givers after it
        saved = {**order.saved(giver), **saved}  # the first figure of each is the one to put back
        for pod in victims[giver]:
            if fits(needed, freed) or not order.ahead_after(taker, gpus, giver, pod.gpus):
                break
            chosen.append(pod)
            freed += pod.gpus
            order.move(giver, -pod.gpus)
    if fits(needed, freed):
        return chosen
    order.restore(saved)
    return None
