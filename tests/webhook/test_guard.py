"""The billing finalizer and the meter out of the workload's reach, on CREATE, UPDATE and the pod's subresources,
through the webhook's answers to AdmissionReviews as the API server sends them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from flask.testing import FlaskClient

from demo.apiserver import admission_review, api_server_pod
from tests.webhook.test_admission import admitted, as_the_api_server_stores_it, gpu_pod, meter_of, patch_of, review
from webhook.app import create_app
from webhook.caches.budgets import BudgetStateCache
from webhook.config import WebhookConfig

FINALIZER = "gpusharing.io/billing"
CONTROLLER = {"username": "system:serviceaccount:gpusharing-system:gpusharing-controller",
              "groups": ["system:serviceaccounts", "system:serviceaccounts:gpusharing-system", "system:authenticated"]}
NAMESPACE_ADMIN = {"username": "system:serviceaccount:ml-team:admin",
                   "groups": ["system:serviceaccounts", "system:serviceaccounts:ml-team", "system:authenticated"]}
CLUSTER_ADMIN = {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]}


def stored_gpu_pod(client: FlaskClient, **spec: Any) -> dict[str, Any]:
    """A GPU pod as the API server stores it once the webhook has admitted it."""
    _, mutated = admitted(client, gpu_pod(**spec))
    stored = as_the_api_server_stores_it(mutated)
    stored["metadata"].update(name="infer", uid="5f0c3a52-4d8e-4f3b-9a57-2f4f7f0f6a11")
    return stored


def update(client: FlaskClient, old: dict[str, Any], new: dict[str, Any], user: dict[str, Any] = NAMESPACE_ADMIN,
           sub_resource: str = "") -> dict[str, Any]:
    """The validating webhook's answer to an UPDATE of `old` into `new` by `user`."""
    return review(client, admission_review(new, "UPDATE", old=old, sub_resource=sub_resource, user=user), "/validate")


def refused(response: dict[str, Any], *phrases: str) -> bool:
    assert response["allowed"] is False and response["status"]["code"] == 403, response
    message = response["status"]["message"]
    assert all(phrase in message for phrase in phrases), message
    return True


def without_finalizer(pod: dict[str, Any]) -> dict[str, Any]:
    changed = copy.deepcopy(pod)
    changed["metadata"]["finalizers"].remove(FINALIZER)
    return changed


# --- the billing finalizer ---------------------------------------------------------------------------------------


def test_a_gpu_pod_is_admitted_with_the_billing_finalizer_once(client: FlaskClient) -> None:
    response, mutated = admitted(client, gpu_pod())
    assert mutated["metadata"]["finalizers"] == [FINALIZER]
    assert {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]} in patch_of(response)
    again = review(client, admission_review(mutated))  # reinvoked: nothing more to add
    assert again["allowed"] and "patch" not in again
    assert review(client, admission_review(mutated), "/validate")["allowed"]


def test_the_finalizer_joins_the_pods_own_finalizers(client: FlaskClient) -> None:
    pod = gpu_pod()
    pod["metadata"]["finalizers"] = ["example.com/archive"]
    _, mutated = admitted(client, pod)
    assert mutated["metadata"]["finalizers"] == ["example.com/archive", FINALIZER]


def test_validation_refuses_a_gpu_pod_a_later_webhook_took_the_finalizer_from(client: FlaskClient) -> None:
    _, mutated = admitted(client, gpu_pod())
    response = review(client, admission_review(without_finalizer(mutated)), "/validate")
    assert refused(response, f"a GPU pod must carry the finalizer {FINALIZER}")


def test_with_the_setting_off_no_finalizer_is_added_or_required(budgets: BudgetStateCache) -> None:
    client = create_app(WebhookConfig.from_env({"GPUSHARING_BILLING_FINALIZER": "false"}), budgets).test_client()
    _, mutated = admitted(client, gpu_pod())
    assert "finalizers" not in mutated["metadata"]
    assert review(client, admission_review(mutated), "/validate")["allowed"]
    # Pods admitted while it was on may then lose it to anyone: the setting off is how an admin winds billing down.
    stored = copy.deepcopy(mutated)
    stored["metadata"]["finalizers"] = [FINALIZER]
    assert update(client, stored, without_finalizer(stored))["allowed"]


def test_only_the_controller_or_a_cluster_admin_removes_the_finalizer(client: FlaskClient) -> None:
    stored = stored_gpu_pod(client)
    released = without_finalizer(stored)
    assert refused(
        update(client, stored, released, NAMESPACE_ADMIN),
        f"the finalizer {FINALIZER} keeps this GPU pod until the timekeeper has closed its bill",
        "only the timekeeper's controller (system:serviceaccount:gpusharing-system:gpusharing-controller) removes it",
        "or a cluster admin (group system:masters)",
        "'system:serviceaccount:ml-team:admin' may not",
    )
    assert refused(update(client, stored, released, {"username": ""}), "'an anonymous user' may not")
    assert update(client, stored, released, CONTROLLER)["allowed"]
    assert update(client, stored, released, CLUSTER_ADMIN)["allowed"]
    # Other finalizers, and everything else a namespace admin may change, stay theirs.
    relabelled = copy.deepcopy(stored)
    relabelled["metadata"]["labels"] = {"team": "vision"}
    relabelled["metadata"]["finalizers"].append("example.com/archive")
    assert update(client, stored, relabelled, NAMESPACE_ADMIN)["allowed"]
    assert update(client, relabelled, stored, NAMESPACE_ADMIN)["allowed"]


def test_a_finalizer_written_by_hand_on_a_pod_the_webhook_does_not_govern_is_its_users(client: FlaskClient) -> None:
    web = api_server_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "finalizers": [FINALIZER]},
                          "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}})
    assert review(client, admission_review(web), "/validate")["allowed"]
    assert update(client, web, without_finalizer(web), NAMESPACE_ADMIN)["allowed"]


def test_the_accounts_that_may_remove_the_finalizer_are_a_setting(budgets: BudgetStateCache) -> None:
    accounts = "system:serviceaccount:billing:closer,ops-robot"
    client = create_app(WebhookConfig.from_env({"GPUSHARING_BILLING_ACCOUNTS": accounts}), budgets).test_client()
    stored = stored_gpu_pod(client)
    assert update(client, stored, without_finalizer(stored), {"username": "ops-robot"})["allowed"]
    assert refused(update(client, stored, without_finalizer(stored), CONTROLLER),
                   "only the timekeeper's controller (ops-robot, system:serviceaccount:billing:closer) removes it")


# --- tokens for the timekeeper -----------------------------------------------------------------------------------


def timekeeper_token_volume(name: str, audience: str = "gpusharing-timekeeper") -> dict[str, Any]:
    return {"name": name, "projected": {"sources": [
        {"configMap": {"name": "kube-root-ca.crt"}},
        {"serviceAccountToken": {"audience": audience, "expirationSeconds": 86400, "path": "token"}},
    ]}}


def test_a_pod_may_not_project_its_own_token_for_the_timekeeper(client: FlaskClient) -> None:
    rogue = timekeeper_token_volume("report-as-me")
    pod = gpu_pod(volumes=[rogue])
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "report-as-me", "mountPath": "/var/run/secrets/tk"}]
    why = (
        "volume 'report-as-me' projects a ServiceAccount token for audience 'gpusharing-timekeeper', the timekeeper's: "
        "only the GPU metering sidecar the webhook injects may hold one"
    )
    assert refused(review(client, admission_review(pod)), why)
    _, mutated = admitted(client, gpu_pod())  # a later webhook adds it
    mutated["spec"]["volumes"].append(rogue)
    assert refused(review(client, admission_review(mutated), "/validate"), why)
    # Tokens for other audiences (a vault, a registry) are the pod's own business.
    _, other = admitted(client, gpu_pod(volumes=[timekeeper_token_volume("vault", audience="vault.example.com")]))
    assert review(client, admission_review(other), "/validate")["allowed"]


# --- the meter on UPDATE -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda m: m.update(image="evil.example/meter:1"), id="image"),
        pytest.param(lambda m: m.update(args=["sleep"]), id="args"),
        pytest.param(lambda m: m["env"][3].update(value="0.01"), id="env"),
        pytest.param(lambda m: m["resources"]["limits"].update(cpu="1m"), id="resources"),
        pytest.param(lambda m: m["volumeMounts"].pop(0), id="volumeMounts"),
    ],
)
def test_the_meter_cannot_be_changed_by_an_update(client: FlaskClient, change: Any) -> None:
    stored = stored_gpu_pod(client)
    changed = copy.deepcopy(stored)
    change(meter_of(changed))
    for user in (NAMESPACE_ADMIN, CLUSTER_ADMIN):
        assert refused(
            update(client, stored, changed, user),
            "the GPU metering sidecar 'gpusharing-meter' is injected by the GPU-sharing webhook and cannot be changed "
            "or removed",
        )


def test_the_meter_and_its_volumes_cannot_be_removed_and_the_workload_may_change(client: FlaskClient) -> None:
    stored = stored_gpu_pod(client)
    no_meter = copy.deepcopy(stored)
    no_meter["spec"]["initContainers"] = []
    assert refused(update(client, stored, no_meter), "cannot be changed or removed")
    no_state = copy.deepcopy(stored)
    no_state["spec"]["volumes"] = [v for v in no_state["spec"]["volumes"] if v["name"] != "gpusharing-meter-state"]
    assert refused(
        update(client, stored, no_state),
        "the volumes of the GPU metering sidecar are injected by the GPU-sharing webhook",
    )
    new_image = copy.deepcopy(stored)
    new_image["spec"]["containers"][0]["image"] = "nvidia/cuda:12.6.0"
    assert update(client, stored, new_image)["allowed"]


# --- the pod's subresources --------------------------------------------------------------------------------------


def with_ephemeral(pod: dict[str, Any], name: str, **fields: Any) -> dict[str, Any]:
    debugged = copy.deepcopy(pod)
    container = {"name": name, "image": "busybox:1.36", "terminationMessagePath": "/dev/termination-log",
                 "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent", **fields}
    debugged["spec"].setdefault("ephemeralContainers", []).append(container)
    return debugged


def test_an_ephemeral_container_may_debug_the_workload_but_not_reach_the_meter(client: FlaskClient) -> None:
    stored = stored_gpu_pod(client)
    at_meter = with_ephemeral(stored, "debugger", targetContainerName="gpusharing-meter")
    assert refused(update(client, stored, at_meter, sub_resource="ephemeralcontainers"),
                   "ephemeral container 'debugger' targets the GPU metering sidecar 'gpusharing-meter'")
    mounting = with_ephemeral(stored, "thief", volumeMounts=[{"name": "gpusharing-meter-token", "mountPath": "/t"}])
    assert refused(update(client, stored, mounting, sub_resource="ephemeralcontainers"),
                   "ephemeral container 'thief' mounts 'gpusharing-meter-token', a volume of the GPU metering sidecar")
    at_workload = with_ephemeral(stored, "debugger", targetContainerName="infer")
    assert update(client, stored, at_workload, sub_resource="ephemeralcontainers")["allowed"]
    # One added before (or by a cluster admin while the webhook was away) does not block the next.
    assert update(client, at_meter, with_ephemeral(at_meter, "second", targetContainerName="infer"),
                  sub_resource="ephemeralcontainers")["allowed"]


def test_a_resize_may_change_the_workloads_resources_but_not_the_meters(client: FlaskClient) -> None:
    stored = stored_gpu_pod(client)
    starved = copy.deepcopy(stored)
    meter_of(starved)["resources"]["limits"]["cpu"] = "1m"
    assert refused(update(client, stored, starved, sub_resource="resize"), "cannot be changed or removed")
    grown = copy.deepcopy(stored)
    grown["spec"]["containers"][0]["resources"].setdefault("limits", {})["cpu"] = "4"
    assert update(client, stored, grown, sub_resource="resize")["allowed"]


def test_other_subresources_and_pods_in_exempt_namespaces_are_not_the_guards(client: FlaskClient) -> None:
    stored = stored_gpu_pod(client)
    released = without_finalizer(stored)
    assert review(client, admission_review(released, "UPDATE", old=stored, sub_resource="status"), "/validate")[
        "allowed"
    ]
    exempt = copy.deepcopy(stored)
    exempt["metadata"]["namespace"] = "kube-system"
    assert update(client, exempt, without_finalizer(exempt))["allowed"]


# --- who is asking -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user_info", "message"),
    [
        ("admin", "request.userInfo must be an object"),
        ({"username": 7}, "request.userInfo.username must be a string"),
        ({"username": "ana", "groups": "system:masters"}, "request.userInfo.groups must be a list of strings"),
    ],
)
def test_a_review_with_a_malformed_user_is_not_an_admission_review(
    client: FlaskClient, user_info: Any, message: str
) -> None:
    body = admission_review(gpu_pod())
    body["request"]["userInfo"] = user_info
    answer = client.post("/validate", json=body)
    assert answer.status_code == 400
    assert answer.get_json() == {"error": f"not an AdmissionReview: {message}"}
