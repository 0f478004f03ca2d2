"""Where the timekeeper finds the Kubernetes API: its own setting, then KUBECONFIG as kubectl reads it, then in-cluster."""

from __future__ import annotations

import pytest

from timekeeper.config import TimekeeperConfig


@pytest.mark.parametrize(
    ("environ", "kubeconfig"),
    [
        ({"TIMEKEEPER_KUBECONFIG": "/etc/tk.kubeconfig", "KUBECONFIG": "/home/ana/.kube/config"}, "/etc/tk.kubeconfig"),
        ({"KUBECONFIG": "/home/ana/.kube/config:/home/ana/.kube/lab"}, "/home/ana/.kube/config:/home/ana/.kube/lab"),
        ({"TIMEKEEPER_KUBECONFIG": " ", "KUBECONFIG": "/home/ana/.kube/config"}, "/home/ana/.kube/config"),
        ({}, None),  # inside a pod: the in-cluster ServiceAccount
    ],
)
def test_the_kubeconfig_follows_the_kubernetes_clients_convention(environ: dict[str, str], kubeconfig: str | None) -> None:
    assert TimekeeperConfig.from_env({"TIMEKEEPER_AUTH": "none", **environ}).kubeconfig == kubeconfig
