"""The Helm chart on a real API server: every object it renders is accepted (server-side dry run), and its webhook
configurations and PriorityClasses, installed in place of the manifests' ones, admit every example pod.

The custom resources (cert-manager's, the ServiceMonitors) are left out: their definitions are not installed here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.system import GpuSharing
from tests.e2e.test_admission import EXAMPLE_PODS, assert_governed, example
from tests.helm import render
from tests.manifests.test_chart import COMBINATIONS, CUSTOM_RESOURCES

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "CustomResourceDefinition",
                  "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                  "ValidatingAdmissionPolicyBinding"}


@pytest.mark.parametrize(
    "combination",
    ["defaults", "cert-manager", "external database", "everything changed", "conventional values", "renamed"],
)
def test_every_object_the_chart_renders_is_accepted_by_the_api_server(gpusharing: GpuSharing, combination: str) -> None:
    namespace = gpusharing.namespace("e2e-chart")
    objects = [
        o
        for o in render(COMBINATIONS[combination], namespace=namespace)
        if not o["apiVersion"].startswith(CUSTOM_RESOURCES)
    ]
    assert objects
    for obj in objects:
        if obj["kind"] in CLUSTER_SCOPED:
            gpusharing.replace(obj, dry_run=True)
        else:
            gpusharing.create(namespace, obj, dry_run=True)


@pytest.fixture
def chart_installed(gpusharing: GpuSharing) -> Iterator[list[dict[str, Any]]]:
    """The chart's webhook configurations (pointed at the webhook on loopback) and PriorityClasses in place of the
    manifests' ones, which are put back afterwards."""
    chart = render()
    ours = [*gpusharing.webhook_configurations(objects=chart), *(o for o in chart if o["kind"] == "PriorityClass")]
    theirs = [*gpusharing.webhook_configurations(), *(o for o in gpusharing.manifests if o["kind"] == "PriorityClass")]
    for obj in ours:
        gpusharing.replace(obj)
    yield ours
    for obj in theirs:
        gpusharing.replace(obj)


def test_the_charts_webhook_configurations_and_priority_classes_admit_every_example_pod(
    gpusharing: GpuSharing, chart_installed: list[dict[str, Any]]
) -> None:
    for obj in chart_installed:  # installed: what the API server holds now carries the chart's labels
        assert gpusharing.stored(obj)["metadata"]["labels"]["helm.sh/chart"] == "kube-gpusharing-0.1.0"
    namespace = gpusharing.namespace("e2e-chart-examples")
    for name in EXAMPLE_PODS:
        assert_governed(gpusharing.create(namespace, example(name)))
