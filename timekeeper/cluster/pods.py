"""The cluster's committed GPU pods, followed by a watch (the informer pattern of gpusharing.kube.watching), for safe admission."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpusharing.gpu.catalogue import GpuCatalogue
from gpusharing.kube.watching import WatchedObjects
from timekeeper.budgets.commitments import CommittedPod, NamespaceCommitments, commitments_by_namespace, committed_pod
from timekeeper.cluster.kube import KubeApi

# A watch that failed is relisted within seconds (gpusharing.kube.watching's backoff); failed for longer than this,
# what it holds is stale: strict safe admission refuses rather than count on it. Reservations outlive it, so the
# pods admitted meanwhile are still counted by theirs.
STALE_AFTER_SECONDS = 10.0


class PodCommitments:
    """The cluster's committed GPU pods, followed by a watch; what they commit is known once it has listed them, and
    while it has not failed for longer than STALE_AFTER_SECONDS."""

    def __init__(self, watched: WatchedObjects[CommittedPod], clock: Callable[[], dt.datetime], remember_seconds: float = 30.0,
                 monotonic: Callable[[], float] = time.monotonic):
        self.watched = watched
        self.clock = clock
        self.remember_seconds = remember_seconds  # a reservation's lifetime: how long its pod's id must be known
        self.monotonic = monotonic
        self._seen: dict[str, float] = {}  # admission id -> when the watch last brought a pod carrying it

    def saw(self, pod: CommittedPod | None) -> CommittedPod | None:
        """Notes the admission id of a pod the watch brings (so its reservation stops counting, even once it ends)."""
        if pod is not None and pod.admission_id:
            self._seen[pod.admission_id] = self.monotonic()
        return pod

    def counted_ids(self) -> frozenset[str]:
        """The admission ids of the pods the watch brought within a reservation's lifetime."""
        forgotten = self.monotonic() - self.remember_seconds
        for admission_id, at in list(self._seen.items()):
            if at < forgotten:
                self._seen.pop(admission_id, None)
        return frozenset(self._seen)

    def settled_ids(self) -> frozenset[str]:
        """The admission ids this watch brought so long ago that every other timekeeper's has them too, unless
        its watch is stale (and it counts nothing): their reservations may go."""
        settled = self.monotonic() - STALE_AFTER_SECONDS
        return frozenset(admission_id for admission_id, at in list(self._seen.items()) if at <= settled)

    def problem(self) -> str | None:
        """Why what the pods commit is not known now, in words for an admission's refusal; None when it is."""
        if self.watched.items is None:
            return "the timekeeper has not yet listed the cluster's pods"
        broken = self.watched.broken_since
        if broken is not None and self.monotonic() - broken > STALE_AFTER_SECONDS:
            return f"the timekeeper's watch of the cluster's pods has failed for {self.monotonic() - broken:.0f} s"
        return None

    def by_namespace(self) -> dict[str, NamespaceCommitments] | None:
        """What each namespace's pods commit; None while it is not known (problem())."""
        items = self.watched.items
        if items is None or self.problem() is not None:
            return None
        return commitments_by_namespace(list(items.values()), self.clock())

    def admitted_as(self, admission_id: str) -> str | None:
        """The pod (namespace/name) the watch holds with this admission id, if any."""
        for (namespace, name), pod in list((self.watched.items or {}).items()):
            if pod.admission_id == admission_id:
                return f"{namespace}/{name}"
        return None

    def stop(self) -> None:
        self.watched.stop()


def watched_pods(
    kube: KubeApi, catalogue: GpuCatalogue, clock: Callable[[], dt.datetime], remember_seconds: float,
    on_sync: Callable[[bool], None] | None = None,
) -> PodCommitments:
    """The cluster's committed GPU pods, followed from now on."""
    def extract(obj: Mapping[str, Any]) -> CommittedPod | None:
        return commitments.saw(committed_pod(obj, catalogue))

    watched = WatchedObjects("GPU pods", kube.core.list_pod_for_all_namespaces, extract, on_sync=on_sync)
    commitments = PodCommitments(watched, clock, remember_seconds)
    watched.start()
    return commitments
