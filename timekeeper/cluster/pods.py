"""The cluster's committed GPU pods, followed by a watch (the informer pattern of gpusharing.kube.watching), for safe admission."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from functools import partial

from gpusharing.gpu.catalogue import GpuCatalogue
from gpusharing.kube.watching import WatchedObjects
from timekeeper.budgets.commitments import CommittedPod, NamespaceCommitments, commitments_by_namespace, committed_pod
from timekeeper.cluster.kube import KubeApi


class PodCommitments:
    """The cluster's committed GPU pods, followed by a watch; `by_namespace` is None until it has listed them."""

    def __init__(self, watched: WatchedObjects[CommittedPod], clock: Callable[[], dt.datetime]):
        self.watched = watched
        self.clock = clock

    def by_namespace(self) -> dict[str, NamespaceCommitments] | None:
        items = self.watched.items
        if items is None:
            return None
        return commitments_by_namespace(list(items.values()), self.clock())

    def stop(self) -> None:
        self.watched.stop()


def watched_pods(
    kube: KubeApi, catalogue: GpuCatalogue, clock: Callable[[], dt.datetime], on_sync: Callable[[bool], None] | None = None
) -> PodCommitments:
    """The cluster's committed GPU pods, followed from now on."""
    watched = WatchedObjects("GPU pods", kube.core.list_pod_for_all_namespaces, partial(committed_pod, catalogue=catalogue),
                             on_sync=on_sync)
    watched.start()
    return PodCommitments(watched, clock)
