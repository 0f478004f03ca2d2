"""The one eviction path of the controller, for every reason (a budget crossing, an idle policy's demote or evict).

Before a pod is evicted:
1. every live webhook process holds a listing read after `acknowledged_after` (timekeeper.cluster.webhooks): the
   state the pod's replacement will be admitted under (the namespace over budget, the owner held for idleness) is
   in force wherever it can be admitted, so the replacement is never admitted as the pod was, to be evicted again;
2. the eviction is claimed in the database under the leader's term, a batch at a time (timekeeper.cluster.fencing):
   a deposed leader's claims are refused, a claim its holder left unfinished is taken over once stale, and no pod
   is evicted twice;
3. the Lease is checked before each request, which is bounded by what is left of it: a leader paused between its
   check and its request cannot act after its successor took over;
4. the Eviction API is asked, so PodDisruptionBudgets hold (a refusal gives the claim back: a later pass tries again);
5. what was done is counted, logged with its reason, and returned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from timekeeper import metrics
from timekeeper.cluster.fencing import EvictionFence
from timekeeper.cluster.kube import EvictionResult, KubeApi, KubeUnavailable
from timekeeper.cluster.leader import LeaderElection
from timekeeper.cluster.webhooks import WebhookListings

log = logging.getLogger(__name__)

CLAIM_BATCH = 50  # evictions claimed in one transaction


class LeaseLost(Exception):
    """The controller no longer leads: the task stops where it is."""


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class Evictions:
    """What one call did: pods evicted, refused by a PodDisruptionBudget, gone already; `waiting`, how many webhook
    processes it waited for (nothing was asked then)."""

    evicted: list[PodRef] = field(default_factory=list)
    refused: list[PodRef] = field(default_factory=list)
    gone: list[PodRef] = field(default_factory=list)
    waiting: int = 0


class EvictionPath:
    def __init__(self, kube: KubeApi, election: LeaderElection, fence: EvictionFence, webhooks: WebhookListings):
        self.kube = kube
        self.election = election
        self.fence = fence
        self.webhooks = webhooks

    def keep_lease(self) -> None:
        """Raises LeaseLost unless this process still leads (renewing the Lease when it is due)."""
        if not self.election.keep():
            raise LeaseLost(f"lost the lease as {self.election.identity}")

    def evict(self, reason: str, pods: Sequence[PodRef], acknowledged_after: float,
              on_evicted: Callable[[PodRef], None] | None = None) -> Evictions:
        """Evicts `pods` for `reason` (words for the log) once every live webhook holds a listing read after
        `acknowledged_after` (the database's time, in seconds); `on_evicted` is told of each pod evicted.
        LeaseLost when the Lease is lost on the way."""
        done = Evictions()
        behind = self.webhooks.behind(acknowledged_after)
        if behind:
            done.waiting = behind
            return done
        for start in range(0, len(pods), CLAIM_BATCH):
            batch = {pod.uid: pod for pod in pods[start:start + CLAIM_BATCH]}
            self.keep_lease()
            term = self.election.term
            claimed = self.fence.claim_many(term, [(pod.uid, pod.namespace, pod.name) for pod in batch.values()])
            if claimed is None:
                raise LeaseLost(f"a later leader than {self.election.identity} (term {term}) has recorded itself")
            evicted: set[str] = set()
            try:
                for uid in sorted(claimed, key=lambda uid: (batch[uid].namespace, batch[uid].name)):
                    if self._evict_claimed(reason, batch[uid], done):
                        evicted.add(uid)
                        if on_evicted is not None:
                            on_evicted(batch[uid])
            finally:  # what was not evicted (refused, failed, or the Lease lost) is given back
                self.fence.release(term, *(claimed - evicted))
        return done

    def _evict_claimed(self, reason: str, pod: PodRef, done: Evictions) -> bool:
        """Asks for one claimed pod's eviction; whether it is gone (evicted, or gone already)."""
        self.keep_lease()
        remaining = self.election.remaining_seconds()
        if remaining <= 0:  # ran out between the check and now (the process was paused): not asked for
            raise LeaseLost(f"the lease of {self.election.identity} ran out unrenewed")
        fields = {"namespace": pod.namespace, "pod": pod.name}
        try:
            result = self.kube.evict(pod.namespace, pod.name, pod.uid, timeout=remaining)
        except KubeUnavailable as exc:
            log.warning("%s; will try again", exc, extra=fields)
            return False
        metrics.EVICTIONS.labels(result.value).inc()
        fields["eviction"] = result.value
        if result is EvictionResult.EVICTED:
            done.evicted.append(pod)
            log.info("evicted pod %s: %s", pod, reason, extra=fields)
            return True
        if result is EvictionResult.REFUSED:
            done.refused.append(pod)
            log.info("eviction of %s refused by a PodDisruptionBudget; will try again (%s)", pod, reason, extra=fields)
            return False
        done.gone.append(pod)
        return True
