"""A GPU pod's priority, written by the webhook as the API server's Priority plugin would write it for the class the
webhook gives (issue 23: then the plugin's second run changes nothing, and the API server calls /mutate once); a
class the PriorityClass watch does not know is left to the plugin, and counted."""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient
from prometheus_client import REGISTRY

from demo.apiserver import admission_review
from tests.webhook.conftest import api_server_callers, as_api_server
from tests.webhook.test_admission import admitted, gpu_pod, patch_of, review
from webhook.app import create_app
from webhook.caches.budgets import BudgetStateCache
from webhook.caches.priorities import ResolvedPriority, resolved_priority
from webhook.config import WebhookConfig

CLASSES = {  # manifests/base/priorityclasses.yaml, and an administrator's
    "gpusharing-in-budget": ResolvedPriority(1000, "PreemptLowerPriority"),
    "gpusharing-over-budget": ResolvedPriority(-1000, "Never"),
    "research-high": ResolvedPriority(5000, "PreemptLowerPriority"),
}


@pytest.fixture
def resolving(config: WebhookConfig, budgets: BudgetStateCache) -> FlaskClient:
    """The webhook with a PriorityClass index that knows the classes of CLASSES."""
    return as_api_server(create_app(config, budgets, callers=api_server_callers(), priorities=CLASSES.get))


def unresolved(priority_class: str) -> float:
    return (
        REGISTRY.get_sample_value("gpusharing_webhook_unresolved_priorities_total", {"priority_class": priority_class})
        or 0.0
    )


@pytest.mark.parametrize(
    ("obj", "resolved"),
    [
        ({"value": 1000, "preemptionPolicy": "PreemptLowerPriority"}, ResolvedPriority(1000, "PreemptLowerPriority")),
        ({"value": -1000, "preemptionPolicy": "Never"}, ResolvedPriority(-1000, "Never")),
        # the API server's default policy
        ({"value": 2000001000}, ResolvedPriority(2000001000, "PreemptLowerPriority")),
        ({"value": "1000"}, None),
        ({"value": True}, None),
        ({"value": 2**31}, None),
        ({"preemptionPolicy": "Never"}, None),
        ({"value": 1, "preemptionPolicy": "Sometimes"}, None),
    ],
)
def test_a_priority_class_is_read_as_the_priority_plugin_reads_it(
    obj: dict[str, Any], resolved: ResolvedPriority | None
) -> None:
    assert resolved_priority({"metadata": {"name": "c"}, **obj}) == resolved


def test_in_budget_the_pod_gets_the_class_its_priority_and_its_preemption_policy(resolving: FlaskClient) -> None:
    before = unresolved("gpusharing-in-budget")
    response, mutated = admitted(resolving, gpu_pod())  # the Priority plugin gave it 0 (no class) before the webhook
    assert (mutated["spec"]["priorityClassName"], mutated["spec"]["priority"], mutated["spec"]["preemptionPolicy"]) == (
        "gpusharing-in-budget", 1000, "PreemptLowerPriority")
    assert {"op": "add", "path": "/spec/priority", "value": 1000} in patch_of(response)
    assert unresolved("gpusharing-in-budget") == before
    again = review(resolving, admission_review(mutated))  # reinvoked (another webhook changed the pod): nothing to do
    assert again["allowed"] and "patch" not in again


def test_over_budget_an_administrators_class_is_replaced_with_the_over_budget_ones_figures(
    resolving: FlaskClient,
) -> None:
    pod = gpu_pod("greedy", priorityClassName="research-high", priority=5000, preemptionPolicy="PreemptLowerPriority")
    _, mutated = admitted(resolving, pod)
    assert (mutated["spec"]["priorityClassName"], mutated["spec"]["priority"], mutated["spec"]["preemptionPolicy"]) == (
        "gpusharing-over-budget", -1000, "Never")
    assert "patch" not in review(resolving, admission_review(mutated))


def test_a_class_the_watch_does_not_know_is_left_to_the_priority_plugin_and_counted(
    config: WebhookConfig, budgets: BudgetStateCache
) -> None:
    unknowing = as_api_server(create_app(config, budgets, callers=api_server_callers(), priorities=lambda name: None))
    before = unresolved("gpusharing-over-budget")
    _, mutated = admitted(unknowing, gpu_pod("greedy", preemptionPolicy="PreemptLowerPriority"))
    assert mutated["spec"]["priorityClassName"] == "gpusharing-over-budget"
    # a stale value would be refused
    assert "priority" not in mutated["spec"] and "preemptionPolicy" not in mutated["spec"]
    assert unresolved("gpusharing-over-budget") == before + 1


def test_a_class_that_stays_keeps_the_priority_the_plugin_resolved(resolving: FlaskClient) -> None:
    _, mutated = admitted(resolving, gpu_pod(priorityClassName="research-high", priority=5000))
    assert (mutated["spec"]["priorityClassName"], mutated["spec"]["priority"]) == ("research-high", 5000)
