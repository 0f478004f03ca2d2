"""One `/mutate` call per GPU pod (issue 23): the webhook's patch is a fixed point of the API server's own plugins.

The API server calls a webhook whose policy is `reinvocationPolicy: IfNeeded` again when, after its answer, the
in-tree plugins run a second time and change the pod. The webhook writes the pod's priority and preemption policy as
the Priority plugin would for the class it gives (from its PriorityClass watch), and its meter keeps the ServiceAccount
plugin out, so that second run changes nothing; the API server's defaults are applied to the webhook's answer before
it compares, so they need not be written. Counted by the webhook's own metrics, one pod at a time.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from demo.apiserver import EXAMPLES
from tests.e2e.system import ALLOWED_PRIORITY_CLASS, GpuSharing, wait_for
from tests.e2e.test_admission import EXAMPLE_PODS, IN_BUDGET, OVER_BUDGET, admissions_answered, assert_governed, example
from tests.e2e.test_dra import ServerClaims, admitted_when_known
from webhook.caches.priorities import PriorityClassIndex, ResolvedPriority

POLICIES = {IN_BUDGET: "PreemptLowerPriority", OVER_BUDGET: "Never"}  # manifests/base/priorityclasses.yaml


def created_counting_reviews(
    gpusharing: GpuSharing, namespace: str, pod: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, float]]:
    """`pod` as the API server stored it, and the reviews the webhook answered meanwhile, by endpoint."""
    before = {endpoint: admissions_answered(gpusharing, endpoint) for endpoint in ("mutate", "validate")}
    created = gpusharing.create(namespace, pod)
    return created, {endpoint: admissions_answered(gpusharing, endpoint) - count for endpoint, count in before.items()}


def assert_resolved(pod: dict[str, Any], priority_class: str) -> None:
    assert pod["spec"]["priorityClassName"] == priority_class
    assert pod["spec"]["preemptionPolicy"] == POLICIES[priority_class]


@pytest.mark.parametrize("name", EXAMPLE_PODS)
def test_a_gpu_pod_of_every_example_costs_one_mutate_call(gpusharing: GpuSharing, name: str) -> None:
    namespace = gpusharing.namespace("e2e-one-call")
    pod, reviews = created_counting_reviews(gpusharing, namespace, example(name))
    assert reviews == {"mutate": 1, "validate": 1}
    assert_governed(pod)  # the meter injected, the priority the class's
    assert_resolved(pod, IN_BUDGET)


def test_a_pod_claiming_its_gpu_through_a_resource_claim_template_costs_one_mutate_call(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-one-call-dra")
    gpusharing.create(namespace, yaml.safe_load((EXAMPLES / "dra" / "gpu-claim-template.yaml").read_text()))
    pod = yaml.safe_load((EXAMPLES / "dra" / "gpu-pod.yaml").read_text())
    admitted_when_known(gpusharing, namespace, {**pod, "metadata": {**pod["metadata"], "name": "probe"}})
    created, reviews = created_counting_reviews(gpusharing, namespace, pod)
    assert reviews == {"mutate": 1, "validate": 1}
    assert_governed(created, claims=ServerClaims(gpusharing))
    assert_resolved(created, IN_BUDGET)


def test_over_budget_a_demoted_pod_costs_one_mutate_call_whatever_class_it_came_with(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-one-call-over")
    gpusharing.replace(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": ALLOWED_PRIORITY_CLASS},
            "value": 5000,
        }
    )
    gpusharing.set_budget(namespace, gpu_minutes=1)
    probe = example("kai-fraction.yaml")
    wait_for(lambda: gpusharing.webhook_state(namespace, probe) == "in-budget", "the webhook to learn the new budget")
    first = gpusharing.create(namespace, probe)
    token = gpusharing.token(namespace, "default", pod=first)
    assert gpusharing.report(first, token, gpu_seconds=90).status_code == 200  # 1.5 GPU-minutes: over budget
    wait_for(
        lambda: gpusharing.webhook_state(namespace, probe) == "over-budget",
        "the webhook to learn the namespace is over budget",
    )

    for index, name in enumerate(("vcuda-fraction.yaml", "hami-fraction.yaml", "kai-memory.yaml")):
        pod = example(name)
        pod["metadata"]["name"] = f"demoted-{index}"
        if index == 1:  # an administrator's class, replaced by the over-budget one
            pod["spec"]["priorityClassName"] = ALLOWED_PRIORITY_CLASS
        demoted, reviews = created_counting_reviews(gpusharing, namespace, pod)
        assert reviews == {"mutate": 1, "validate": 1}, name
        assert_governed(demoted, OVER_BUDGET, "over-budget")
        assert_resolved(demoted, OVER_BUDGET)


def test_the_webhooks_priority_class_index_follows_the_classes_with_its_own_service_account(
    gpusharing: GpuSharing,
) -> None:
    """What the webhook's index holds: each class as the Priority plugin reads it, from the first list and then the
    watch, under the manifests' RBAC (the webhook's own kubeconfig)."""
    index = PriorityClassIndex(gpusharing.plane.api_client(gpusharing.directory / "webhook.kubeconfig"))
    index.start()
    try:
        assert wait_for(lambda: index.lookup(OVER_BUDGET), "the first list") == ResolvedPriority(-1000, "Never")
        assert index.lookup(IN_BUDGET) == ResolvedPriority(1000, "PreemptLowerPriority")
        assert index.lookup("e2e-later") is None
        later = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "e2e-later"},
            "value": 7,
        }
        gpusharing.replace(later)
        assert wait_for(lambda: index.lookup("e2e-later"), "the watch to bring the new class") == ResolvedPriority(
            7, "PreemptLowerPriority"
        )
        gpusharing.rest("DELETE", "/apis/scheduling.k8s.io/v1/priorityclasses/e2e-later")
        wait_for(lambda: index.lookup("e2e-later") is None, "the watch to drop the deleted class")
    finally:
        index.stop()
