"""The end-to-end tier: the project's manifests, webhook and timekeeper on a real Kubernetes control plane.

Runs where KUBEBUILDER_ASSETS names a directory with etcd, kube-apiserver and kube-controller-manager; elsewhere
it is skipped with a line saying how to enable it, except under CI=true, where a missing control plane fails.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.controlplane import ControlPlane, control_plane_for
from tests.e2e.system import GpuSharing


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = control_plane_for("end-to-end tier")
    yield plane
    plane.stop()


@pytest.fixture(scope="session")
def gpusharing(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuSharing]:
    """The project installed from `kubectl kustomize manifests/`, its webhook and timekeeper running on loopback."""
    with GpuSharing(control_plane, tmp_path_factory.mktemp("gpusharing")) as system:
        yield system
