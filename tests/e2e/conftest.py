"""The end-to-end tier: the project's manifests, webhook and timekeeper on a real Kubernetes control plane.

Runs where KUBEBUILDER_ASSETS names a directory with etcd, kube-apiserver and kube-controller-manager; elsewhere
it is skipped with a line saying how to enable it, except under CI=true, where a missing control plane fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.controlplane import ControlPlane, ControlPlaneUnavailable
from tests.e2e.system import GpuSharing

HOW_TO_ENABLE = (
    "the end-to-end tier needs a Kubernetes control plane: set KUBEBUILDER_ASSETS to a directory with etcd, "
    "kube-apiserver and kube-controller-manager (KUBEBUILDER_ASSETS=$(../shared/kube/unpack), or `setup-envtest use -p path`)"
)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    assets = os.environ.get("KUBEBUILDER_ASSETS", "").strip()
    if not assets:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but KUBEBUILDER_ASSETS is not set: {HOW_TO_ENABLE}", pytrace=False)
        pytest.skip(HOW_TO_ENABLE)
    try:
        plane = ControlPlane.start(Path(assets))
    except ControlPlaneUnavailable as exc:
        pytest.fail(f"the Kubernetes control plane could not be started: {exc}", pytrace=False)
    yield plane
    plane.stop()


@pytest.fixture(scope="session")
def gpusharing(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuSharing]:
    """The project installed from `kubectl kustomize manifests/`, its webhook and timekeeper running on loopback."""
    system = GpuSharing(control_plane, tmp_path_factory.mktemp("gpusharing"))
    try:
        system.start()
    except Exception:
        system.stop()
        raise
    yield system
    system.stop()
