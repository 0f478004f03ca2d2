"""Owners held out of budget: when the timekeeper's idle policy evicted an idle pod, the listing names its owner, and
the webhook admits the owner's next pods out of budget (the over-budget priority class), saying why, until the
listing no longer holds it (one of its pods used its GPU again)."""

from __future__ import annotations

from typing import Any

from flask.testing import FlaskClient

from tests.webhook.conftest import FakeTimekeeper
from tests.webhook.test_admission import admitted, gpu_pod
from webhook.app import create_app
from webhook.caches.budgets import BudgetStateCache, states_from_listing
from webhook.config import WebhookConfig

HOLD = {
    "kind": "ReplicaSet",
    "name": "nb-7d9",
    "uid": "uid-nb-7d9",
    "pod": "nb-7d9-x2k",
    "heldAt": "2026-11-27T13:00:00Z",
}


def owned_by(uid: str, **spec: Any) -> dict[str, Any]:
    pod = gpu_pod(**spec)
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "nb-7d9", "uid": uid,
                                           "controller": True, "blockOwnerDeletion": True}]
    return pod


def client_with(timekeeper: FakeTimekeeper, holds: list[Any]) -> FlaskClient:
    timekeeper.items = [{"namespace": "ml-team", "state": "in-budget", "idleHolds": holds}]
    cache = BudgetStateCache(timekeeper.url)
    assert cache.refresh()
    return create_app(WebhookConfig(), cache).test_client()


def test_a_held_owners_next_pod_is_admitted_out_of_budget_and_told_why(timekeeper: FakeTimekeeper) -> None:
    client = client_with(timekeeper, [HOLD])
    response, mutated = admitted(client, owned_by("uid-nb-7d9"))
    assert mutated["spec"]["priorityClassName"] == "gpusharing-over-budget"
    annotations = mutated["metadata"]["annotations"]
    assert annotations["gpusharing.io/idle-hold"] == "ReplicaSet/nb-7d9"
    assert annotations["gpusharing.io/budget-state"] == "in-budget"  # the namespace's state is unchanged
    assert response["warnings"] == [
        "ReplicaSet nb-7d9 is held out of budget since 2026-11-27T13:00:00Z: its pod nb-7d9-x2k left its GPU idle and "
        "was "
        "evicted, and it is back in budget once one of its pods uses its GPU: the pod gets priority class "
        "'gpusharing-over-budget' and may be preempted by pods of namespaces within budget"
    ]


def test_other_owners_and_bare_pods_are_admitted_as_before(timekeeper: FakeTimekeeper) -> None:
    client = client_with(timekeeper, [HOLD])
    for pod in (owned_by("uid-of-another-replicaset"), gpu_pod()):
        response, mutated = admitted(client, pod)
        assert mutated["spec"]["priorityClassName"] == "gpusharing-in-budget"
        assert "gpusharing.io/idle-hold" not in mutated["metadata"]["annotations"] and "warnings" not in response


def test_a_released_hold_admits_in_budget_again(timekeeper: FakeTimekeeper) -> None:
    client = client_with(timekeeper, [])
    _, mutated = admitted(client, owned_by("uid-nb-7d9"))
    assert mutated["spec"]["priorityClassName"] == "gpusharing-in-budget"


def test_holds_the_webhook_cannot_read_are_left_out() -> None:
    listing = {"items": [{"namespace": "ml-team", "state": "in-budget",
                          "idleHolds": [{"uid": 7}, "x", {**HOLD, "heldAt": None}, HOLD]}]}
    assert list(states_from_listing(listing).of("ml-team").idle_holds) == ["uid-nb-7d9"]
    no_holds = {"items": [{"namespace": "ml-team", "state": "in-budget", "idleHolds": "everyone"}]}
    assert states_from_listing(no_holds).of("ml-team").idle_holds == {}
