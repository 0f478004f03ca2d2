"""The timekeeper against a real API server: TokenReview, SubjectAccessReview, Events and Eviction, with the RBAC of
manifests/ (the timekeeper runs with its own ServiceAccount's token, found through KUBECONFIG)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from demo.apiserver import EXAMPLES
from tests.e2e.system import GpuSharing, wait_for


def gpu_pod(gpusharing: GpuSharing, namespace: str, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    pod = yaml.safe_load((EXAMPLES / "kai-fraction.yaml").read_text())
    pod["metadata"]["name"] = name
    pod["metadata"]["labels"] = labels or {}
    return gpusharing.create(namespace, pod)


def test_a_pod_bound_token_reports_for_its_own_pod_only(gpusharing: GpuSharing) -> None:
    namespace, elsewhere = gpusharing.namespace("e2e-tokens"), gpusharing.namespace("e2e-tokens-other")
    mine, neighbour = gpu_pod(gpusharing, namespace, "mine"), gpu_pod(gpusharing, namespace, "neighbour")
    stranger = gpu_pod(gpusharing, elsewhere, "stranger")
    token = gpusharing.token(namespace, "default", pod=mine)

    accepted = gpusharing.report(mine, token, gpu_seconds=3)
    assert accepted.status_code == 200, accepted.text
    for other in (neighbour, stranger):
        refused = gpusharing.report(other, token, gpu_seconds=3)
        assert refused.status_code == 403, refused.text
        assert f"the token belongs to pod {mine['metadata']['uid']} in namespace {namespace}" in refused.json()["error"]
    # The API server's own audience is not the timekeeper's: such a token is not authenticated.
    unbound = gpusharing.token(namespace, "default", audience=None, pod=mine)
    assert gpusharing.report(mine, unbound, gpu_seconds=4).status_code == 401

    used = gpusharing.timekeeper_call("GET", f"/api/v1/budgets/{namespace}", gpusharing.budget_admin_token()).json()[
        "usedGpuMinutes"
    ]
    assert used == pytest.approx(3 / 60)  # the pod's own report, and nothing of the refused ones


def test_budget_changes_need_the_budget_admin_role_of_the_manifests(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-admin")
    body = {"gpuMinutes": 600}
    assert gpusharing.timekeeper_call("PUT", f"/api/v1/budgets/{namespace}", None, body).status_code == 401
    nobody = gpusharing.token(namespace, "default")
    refused = gpusharing.timekeeper_call("PUT", f"/api/v1/budgets/{namespace}", nobody, body)
    assert refused.status_code == 403
    assert f"system:serviceaccount:{namespace}:default may not change budgets" in refused.json()["error"]
    assert gpusharing.timekeeper_call("GET", f"/api/v1/budgets/{namespace}", nobody).status_code == 403  # nor read it
    assert gpusharing.set_budget(namespace, 600)["gpuMinutes"] == 600


def events(gpusharing: GpuSharing, namespace: str, reason: str) -> list[dict[str, Any]]:
    """The namespace's Events as `kubectl describe namespace` selects them."""
    uid = gpusharing.rest("GET", f"/api/v1/namespaces/{namespace}")["metadata"]["uid"]
    selector = (
        f"involvedObject.kind=Namespace,involvedObject.name={namespace},involvedObject.namespace=,"
        f"involvedObject.uid={uid}"
    )
    items = gpusharing.rest("GET", "/api/v1/events", query={"fieldSelector": selector})["items"]
    return [e for e in items if e["reason"] == reason]


def evictions_refused(gpusharing: GpuSharing) -> float:
    lines = [line for line in gpusharing.controller_metrics().splitlines()
             if line.startswith('gpusharing_timekeeper_evictions_total{result="refused"}')]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def test_exhaustion_is_an_event_on_the_namespace_and_evicts_within_disruption_budgets(gpusharing: GpuSharing) -> None:
    gpusharing.require_controllers()
    namespace = gpusharing.namespace("e2e-evict")
    gpusharing.set_budget(namespace, gpu_minutes=1, evict=True)
    pod = gpu_pod(gpusharing, namespace, "train", labels={"app": "train"})
    name = pod["metadata"]["name"]
    # No kubelet runs here: the pod is made Running and Ready the way a kubelet reports it.
    status = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    gpusharing.rest("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", status, patch="merge")
    pdb = {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "train"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}},
    }
    gpusharing.create(namespace, pdb)
    path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/train"
    wait_for(
        lambda: gpusharing.rest("GET", path).get("status", {}).get("currentHealthy") == 1,
        "the disruption controller to count the pod",
    )

    refused_before = evictions_refused(gpusharing)
    token = gpusharing.token(namespace, "default", pod=pod)
    assert gpusharing.report(pod, token, gpu_seconds=120).status_code == 200  # two GPU-minutes of one

    (exhausted,) = wait_for(lambda: events(gpusharing, namespace, "GPUBudgetExhausted"), "the GPUBudgetExhausted Event")
    assert exhausted["type"] == "Warning" and "its running GPU pods are being evicted" in exhausted["message"]
    wait_for(lambda: evictions_refused(gpusharing) >= refused_before + 2, "the eviction to be refused, and tried again")
    held = gpusharing.pod(namespace, name)
    assert held is not None and "deletionTimestamp" not in held["metadata"]

    gpusharing.rest("DELETE", path)
    # Evicted: deleted, and held by the billing finalizer until its bill is closed (here by hand: see test_guard.py).
    wait_for(
        lambda: (
            "deletionTimestamp"
            in (gpusharing.pod(namespace, name) or {"metadata": {"deletionTimestamp": "gone"}})["metadata"]
        ),
        "the pod to be evicted once no disruption budget holds it",
    )
    gpusharing.release(namespace, name)
    wait_for(lambda: gpusharing.pod(namespace, name) is None, "the evicted pod gone once its finalizer is removed")
    assert len(events(gpusharing, namespace, "GPUBudgetExhausted")) == 1  # one Event per crossing, not one per pass
