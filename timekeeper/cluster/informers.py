"""The controller's informer caches, one list-and-watch of each kind shared by every task, as client-go's shared
informers are. Every replica keeps them, leader or not, so that a new leader acts at once on a warm cache.

A governed pod (one the webhook recorded a share on) is kept as the two plain records its readers need: the bill's
(RecordedPod) and, for a pod with a deadline, safe admission's (CommittedPod).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from gpusharing.gpu.capacity import NodeGpus, node_gpus
from gpusharing.gpu.catalogue import GpuCatalogue
from gpusharing.gpu.dra import ClaimSpec, allocated_claim_spec
from gpusharing.gpu.request import GpuRequestSettings
from gpusharing.kube.watching import WatchedObjects
from timekeeper import metrics
from timekeeper.accounting.record import RecordedPod, recorded_pod
from timekeeper.budgets.commitments import CommittedPod, committed_pod
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.objects import CustomResource
from timekeeper.cluster.resources import CLUSTER_GPU_BUDGETS, GPU_BUDGETS


@dataclass(frozen=True)
class GovernedPod:
    record: RecordedPod
    commitment: CommittedPod | None  # None: no deadline, or ended


def governed_pod(obj: Mapping[str, Any], settings: GpuRequestSettings, catalogue: GpuCatalogue) -> GovernedPod | None:
    record = recorded_pod(obj, settings)
    if record is None:
        return None
    return GovernedPod(record, committed_pod(obj, catalogue))


def _custom_objects(kube: KubeApi, resource: CustomResource) -> Callable[..., Any]:
    return partial(kube.custom.list_cluster_custom_object, resource.group, resource.version, resource.plural)


class ClusterInformers:
    def __init__(self, kube: KubeApi, settings: GpuRequestSettings):
        self.pods: WatchedObjects[GovernedPod] = WatchedObjects(
            "governed GPU pods", kube.core.list_pod_for_all_namespaces,
            partial(governed_pod, settings=settings, catalogue=settings.catalogue), on_sync=metrics.record_pod_sync)
        self.claims: WatchedObjects[ClaimSpec] = WatchedObjects(
            "ResourceClaims", kube.resource.list_resource_claim_for_all_namespaces, allocated_claim_spec)
        self.budgets: dict[CustomResource, WatchedObjects[dict[str, Any]]] = {
            resource: WatchedObjects(resource.plural, _custom_objects(kube, resource), dict)
            for resource in (GPU_BUDGETS, CLUSTER_GPU_BUDGETS)
        }
        # A bound pod is billed on its node's GPU model; fair share divides the nodes' GPUs.
        self.nodes: WatchedObjects[NodeGpus] = WatchedObjects(
            "nodes", kube.core.list_node, partial(node_gpus, catalogue=settings.catalogue))

    @property
    def all(self) -> list[WatchedObjects[Any]]:
        return [self.pods, self.claims, self.nodes, *self.budgets.values()]

    def budget_resources(self) -> list[tuple[CustomResource, dict[str, Any]]]:
        """Every GPUBudget and ClusterGPUBudget cached."""
        return [
            (resource, obj)
            for resource, watched in self.budgets.items()
            for obj in list((watched.items or {}).values())
        ]

    def records(self) -> dict[tuple[str, str], RecordedPod] | None:
        """The governed pods' records by (namespace, name); None until listed."""
        items = self.pods.items
        return None if items is None else {key: pod.record for key, pod in list(items.items())}

    def cluster_gpus(self) -> float:
        """The cluster's GPUs, as the nodes cached offer them."""
        return sum(node.gpus for node in list((self.nodes.items or {}).values()))

    def start(self) -> None:
        for informer in self.all:
            informer.start()

    def list_now(self) -> None:
        """Lists every kind again, in this thread (tests of the tasks, on an API that serves no watch)."""
        for informer in self.all:
            informer.list_now()

    def stop(self) -> None:
        for informer in self.all:
            informer.stop()

    def measure(self) -> None:
        """The caches' sizes, as metrics."""
        for informer in self.all:
            metrics.CACHED_OBJECTS.labels(informer.kind).set(len(informer.items or {}))
