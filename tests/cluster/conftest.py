"""The cluster tier: the project on a control plane with kube-scheduler and simulated GPU nodes
(tests/cluster/nodes.py).

Runs where KUBEBUILDER_ASSETS names a directory with etcd, kube-apiserver and kube-scheduler (and
kube-controller-manager for Jobs, ReplicaSets and PodDisruptionBudgets); elsewhere it is skipped with a line saying
how to enable it, except under CI=true, where a missing control plane fails.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.nodes import NodeSimulator
from tests.e2e.controlplane import ControlPlane, control_plane_for
from tests.e2e.system import GpuSharing

LEASE_SECONDS = 2  # shorter than a pass over hundreds of pods: the controller must renew it while it works
METER_INTERVAL_SECONDS = 1.0
WEBHOOK_REFRESH_SECONDS = 2  # as a cluster would poll (the default is 5): a crossing takes the webhook a while to learn


@pytest.fixture(scope="session")
def cluster_plane() -> Iterator[ControlPlane]:
    plane = control_plane_for("cluster tier", scheduler=True)
    yield plane
    plane.stop()


@pytest.fixture(scope="session")
def cluster(cluster_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuSharing]:
    """The project installed from the manifests, its webhook and a timekeeper on loopback."""
    with GpuSharing(cluster_plane, tmp_path_factory.mktemp("cluster"), webhook_threads=16,
                    timekeeper_env={"TIMEKEEPER_LEASE_SECONDS": str(LEASE_SECONDS),
                                    # Bills grow from the record every 2 s: budgets run out within a test.
                                    "TIMEKEEPER_BILLING_INTERVAL_SECONDS": "2",
                                    # The scale run's simulated meters report every 10 s: silent after two of those.
                                    "GPUSHARING_METER_INTERVAL_SECONDS": "10"},
                    webhook_env={"GPUSHARING_BUDGET_REFRESH_SECONDS": str(WEBHOOK_REFRESH_SECONDS)}) as system:
        yield system


@pytest.fixture(scope="session")
def nodes(cluster: GpuSharing, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeSimulator]:
    """The simulated kubelet of every simulated node (tests add their own pools); meters as each pod's annotation
    says."""
    simulator = NodeSimulator(cluster.plane, tmp_path_factory.mktemp("nodes"), timekeeper_url=cluster.timekeeper_url,
                              meter_interval=METER_INTERVAL_SECONDS).start()
    yield simulator
    simulator.stop()
