"""The webhook's answers to AdmissionReviews as the API server sends them."""

from __future__ import annotations

import base64
import copy
import json
import logging
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
from flask.testing import FlaskClient
from werkzeug.test import EnvironBuilder
from werkzeug.wrappers import Response

from demo.apiserver import admission_review, api_server_pod, example_manifests, example_pod
from gpusharing.gpu.dra import ClaimSource, ClaimSpec, claim_spec
from gpusharing.settings.env import ConfigError
from tests.webhook.conftest import FakeTimekeeper, api_server_callers, as_api_server
from webhook.admission.meter import SERVICE_ACCOUNT_TOKEN_DIR
from webhook.app import create_app
from webhook.caches.budgets import BudgetStateCache
from webhook.config import MeterSpec, WebhookConfig

KUBERNETES_VERSION = "1.37.0"


def review(client: FlaskClient, body: Any, endpoint: str = "/mutate") -> dict[str, Any]:
    answer = client.post(endpoint, json=body)
    assert answer.status_code == 200, answer.get_data(as_text=True)
    return answer.get_json()["response"]


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


def admitted(client: FlaskClient, pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The response and the pod as the API server stores it after the patch."""
    response = review(client, admission_review(pod))
    assert response["allowed"], response
    return response, jsonpatch.apply_patch(pod, patch_of(response))


def gpu_pod(namespace: str = "ml-team", **spec: Any) -> dict[str, Any]:
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "infer", "annotations": {"team.example.com/owner": "ana"}},
        "spec": {
            "containers": [
                {
                    "name": "infer",
                    "image": "nvidia/cuda:12.4.0",
                    "resources": {
                        "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}
                    },
                }
            ],
            **spec,
        },
    }
    return api_server_pod(manifest, namespace)


def meter_of(pod: dict[str, Any]) -> dict[str, Any]:
    return next(
        c for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"] if c["name"] == "gpusharing-meter"
    )


@pytest.mark.parametrize("name", sorted(example_manifests()))
def test_every_example_is_admitted_mutated_into_a_valid_pod_and_mutating_again_changes_nothing(
    client: FlaskClient, name: str
) -> None:
    pod = example_pod(name)
    response, mutated = admitted(client, pod)
    kubernetes_validate.validate(mutated, KUBERNETES_VERSION, strict=True)
    annotations = mutated["metadata"]["annotations"]
    assert annotations["gpusharing.io/budget-state"] == "in-budget"
    assert float(annotations["gpusharing.io/gpu-share"]) > 0
    assert mutated["spec"]["priorityClassName"] == "gpusharing-in-budget"
    assert "priority" not in mutated["spec"] and "preemptionPolicy" not in mutated["spec"]
    meter = mutated["spec"]["initContainers"][0]
    assert meter["name"] == "gpusharing-meter" and meter["restartPolicy"] == "Always"
    assert all(op["op"] in ("add", "remove") for op in patch_of(response))

    again = review(client, admission_review(mutated))
    assert again["allowed"] and "patch" not in again
    assert review(client, admission_review(mutated), "/validate")["allowed"]


def test_record_annotations_are_added_without_touching_the_users(client: FlaskClient) -> None:
    response, mutated = admitted(client, gpu_pod())
    assert mutated["metadata"]["annotations"] == {
        "team.example.com/owner": "ana",
        "gpusharing.io/gpu-share": "0.3",
        "gpusharing.io/dialect": "hami",
        "gpusharing.io/gpu-memory-mib": "3000",
        "gpusharing.io/gpu-model": "NVIDIA A100-SXM4-80GB",  # the catalogue's default: the pod names no model
        "gpusharing.io/budget-state": "in-budget",
    }
    # Keys are escaped per RFC 6901.
    assert {"op": "add", "path": "/metadata/annotations/gpusharing.io~1gpu-share", "value": "0.3"} in patch_of(response)


def test_meter_is_small_unprivileged_and_alone_in_holding_its_token(client: FlaskClient) -> None:
    _, mutated = admitted(client, gpu_pod())
    meter = meter_of(mutated)
    assert meter["securityContext"]["runAsNonRoot"] and meter["securityContext"]["readOnlyRootFilesystem"]
    assert meter["securityContext"]["allowPrivilegeEscalation"] is False
    assert set(meter["resources"]) == {"requests", "limits"}
    env = {e["name"]: e for e in meter["env"]}
    assert env["GPUSHARING_POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env["GPUSHARING_GPU_SHARE"]["value"] == "0.3"
    volumes = {v["name"]: v for v in mutated["spec"]["volumes"]}
    token = volumes["gpusharing-meter-token"]["projected"]["sources"][0]["serviceAccountToken"]
    assert token["audience"] == "gpusharing-timekeeper"
    assert "volumeMounts" not in mutated["spec"]["containers"][0]


def test_meter_goes_first_among_existing_init_containers_and_volumes_are_appended(client: FlaskClient) -> None:
    pod = gpu_pod(
        initContainers=[{"name": "fetch", "image": "busybox:1.36"}],
        volumes=[{"name": "data", "emptyDir": {}}],
    )
    _, mutated = admitted(client, pod)
    assert [c["name"] for c in mutated["spec"]["initContainers"]] == ["gpusharing-meter", "fetch"]
    assert [v["name"] for v in mutated["spec"]["volumes"]] == [
        "data",
        "gpusharing-meter-token",
        "gpusharing-meter-state",
        "gpusharing-meter-no-api-token",
    ]


def test_sidecar_mode_container_for_older_clusters(budgets: BudgetStateCache) -> None:
    client = create_app(WebhookConfig(meter=MeterSpec(mode="container")), budgets).test_client()
    _, mutated = admitted(client, gpu_pod())
    assert [c["name"] for c in mutated["spec"]["containers"]] == ["infer", "gpusharing-meter"]
    assert "restartPolicy" not in mutated["spec"]["containers"][1]
    assert "initContainers" not in mutated["spec"]
    kubernetes_validate.validate(mutated, KUBERNETES_VERSION, strict=True)


def test_in_budget_keeps_a_priority_class_the_administrator_allows(client: FlaskClient) -> None:
    response, mutated = admitted(client, gpu_pod(priorityClassName="research-high"))
    assert mutated["spec"]["priorityClassName"] == "research-high"
    assert mutated["spec"]["priority"] == 0  # the class did not change: nothing to recompute
    assert "warnings" not in response


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
def test_a_priority_class_of_the_pods_own_is_refused(client: FlaskClient, endpoint: str) -> None:
    response = review(client, admission_review(gpu_pod(priorityClassName="system-cluster-critical")), endpoint)
    assert not response["allowed"] and response["status"]["code"] == 403
    assert response["status"]["message"] == (
        "GPU pods get their priority class from the GPU-sharing webhook ('gpusharing-in-budget' in budget), not "
        "'system-cluster-critical': remove spec.priorityClassName, or ask an administrator to allow the class "
        "(GPUSHARING_ALLOWED_PRIORITY_CLASSES)")


def test_in_budget_the_webhook_decides_between_its_own_classes(client: FlaskClient) -> None:
    _, mutated = admitted(client, gpu_pod(priorityClassName="gpusharing-over-budget", priority=-1000))
    assert mutated["spec"]["priorityClassName"] == "gpusharing-in-budget"
    assert "priority" not in mutated["spec"]  # the Priority plugin computes it again from the new class


def test_over_budget_demotes_with_a_warning(client: FlaskClient) -> None:
    response, mutated = admitted(client, gpu_pod("greedy", priorityClassName="research-high"))
    assert mutated["spec"]["priorityClassName"] == "gpusharing-over-budget"
    assert "priority" not in mutated["spec"] and "preemptionPolicy" not in mutated["spec"]
    assert mutated["metadata"]["annotations"]["gpusharing.io/budget-state"] == "over-budget"
    assert response["warnings"] == [
        "namespace 'greedy' is over its GPU budget: the pod gets priority class 'gpusharing-over-budget' and may be "
        "preempted by pods of namespaces within budget (its priority class 'research-high' was replaced)"
    ]
    assert "patch" not in review(client, admission_review(mutated))


def warning_entry(budget: str, percent: float) -> dict[str, Any]:
    return {
        "budget": budget,
        "percentUsed": percent,
        "gpuMinutes": 6000,
        "period": "monthly",
        "periodStart": "2026-11-01T00:00:00Z",
    }


def test_a_namespace_above_a_threshold_is_in_budget_and_every_gpu_pod_is_warned(
    config: WebhookConfig, timekeeper: FakeTimekeeper
) -> None:
    timekeeper.items = [
        {"namespace": "ml-team", "state": "warning", "warnings": [warning_entry("ml-team", 86.4)]},
        {"namespace": "cv-team", "state": "warning", "warnings": [warning_entry("team.vision", 97), {"budget": "x"}]},
        {"namespace": "team.vision", "state": "warning", "warnings": [warning_entry("team.vision", 97)]},
    ]
    budgets = BudgetStateCache(timekeeper.url)
    assert budgets.refresh()
    client = as_api_server(create_app(config, budgets, callers=api_server_callers()))
    response, mutated = admitted(client, gpu_pod("ml-team", priorityClassName="research-high"))
    assert mutated["spec"]["priorityClassName"] == "research-high"  # in budget: the user's class stays
    assert mutated["metadata"]["annotations"]["gpusharing.io/budget-state"] == "warning"
    assert response["warnings"] == ["namespace ml-team has used 86 % of its 6000 GPU-minutes for November"]
    response, _ = admitted(client, gpu_pod("cv-team"))
    # An ancestor's warning reaches its namespaces; an entry the webhook cannot read is left out.
    assert response["warnings"] == [
        "namespace cv-team is part of team.vision, which has used 97 % of its 6000 GPU-minutes for November"
    ]
    assert "patch" not in review(client, admission_review(mutated))  # the warning changes nothing on reinvocation
    # Without client authentication anyone who reaches the webhook is answered: without any budget's figures.
    anyone = create_app(config, budgets).test_client()
    response, mutated = admitted(anyone, gpu_pod("ml-team"))
    assert "warnings" not in response and mutated["metadata"]["annotations"]["gpusharing.io/budget-state"] == "warning"


@pytest.mark.parametrize(
    ("authorization", "status", "message"),
    [
        (None, 401, "the GPU-sharing webhook answers only the API server: present the API server's bearer token"),
        (
            "Bearer forged",
            401,
            "the bearer token was not authenticated by the Kubernetes API (TokenReview, audience gpusharing-webhook)",
        ),
        (
            "Bearer a-tenants-token",
            403,
            "system:serviceaccount:ml-team:default may not send admission reviews: only the API "
            "server may (GPUSHARING_CLIENT_TOKEN_USERS)",
        ),
    ],
)
def test_with_client_authentication_only_the_api_server_is_answered(
    config: WebhookConfig, budgets: BudgetStateCache, authorization: str | None, status: int, message: str
) -> None:
    client = create_app(config, budgets, callers=api_server_callers()).test_client()
    headers = {"Authorization": authorization} if authorization else {}
    for endpoint in ("/mutate", "/validate"):
        answer = client.post(endpoint, json=admission_review(gpu_pod()), headers=headers)
        assert (answer.status_code, answer.get_json()) == (status, {"error": message})
    assert client.get("/readyz").status_code == 200  # probes need no credentials

def test_namespace_never_heard_of_is_unknown_and_in_budget(client: FlaskClient) -> None:
    _, mutated = admitted(client, gpu_pod("new-team"))
    assert mutated["metadata"]["annotations"]["gpusharing.io/budget-state"] == "unknown"
    assert mutated["spec"]["priorityClassName"] == "gpusharing-in-budget"


def test_dry_run_gets_the_same_answer(client: FlaskClient) -> None:
    pod = gpu_pod()
    real, dry = review(client, admission_review(pod)), review(client, admission_review(pod, dry_run=True))
    assert patch_of(real) == patch_of(dry)


def test_v1beta1_is_answered_in_kind(client: FlaskClient) -> None:
    body = admission_review(gpu_pod(), version="v1beta1")
    answer = client.post("/mutate", json=body).get_json()
    assert answer["apiVersion"] == "admission.k8s.io/v1beta1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == body["request"]["uid"]


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
def test_invalid_gpu_request_is_denied_with_the_reason(client: FlaskClient, endpoint: str) -> None:
    pod = gpu_pod()
    for kind in ("limits", "requests"):
        pod["spec"]["containers"][0]["resources"][kind]["nvidia.com/gpumem-percentage"] = "150"
    response = review(client, admission_review(pod), endpoint)
    assert response["allowed"] is False
    assert response["status"] == {
        "code": 422,
        "message": "invalid GPU request: container \"infer\": nvidia.com/gpumem-percentage=\"150\": "
        "must be a whole percentage of each device's memory, 0 to 100",
    }


def test_how_the_backend_reads_a_pod_comes_back_as_warnings(client: FlaskClient) -> None:
    pod = gpu_pod()
    for kind in ("limits", "requests"):
        pod["spec"]["containers"][0]["resources"][kind]["nvidia.com/gpucores"] = "150"
    response, mutated = admitted(client, pod)
    assert response["warnings"] == [
        'container "infer": nvidia.com/gpucores=150 is more than 100: HAMi grants 100 (the whole device\'s compute)'
    ]
    assert mutated["metadata"]["annotations"]["gpusharing.io/gpu-share"] == "1"
    assert "warnings" not in review(client, admission_review(mutated), "/validate")


def test_pods_without_gpu_exempt_namespaces_and_mirror_pods_pass_untouched(client: FlaskClient) -> None:
    plain = api_server_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web"},
            "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]},
        }
    )
    invalid = gpu_pod("kube-system")
    invalid["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] = "150"
    mirror = gpu_pod()
    mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"] = "abc"
    own = gpu_pod("gpusharing-system")
    for pod in (plain, invalid, mirror, own):
        for endpoint in ("/mutate", "/validate"):
            body = admission_review(pod)
            assert review(client, body, endpoint) == {"uid": body["request"]["uid"], "allowed": True}


def test_exempt_namespaces_are_configurable() -> None:
    config = WebhookConfig.from_env({"GPUSHARING_EXEMPT_NAMESPACES": "infra", "GPUSHARING_WEBHOOK_NAMESPACE": "gov"})
    assert config.exempt_namespaces == {"infra", "gov"}


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
def test_a_container_may_not_take_the_meters_name(client: FlaskClient, endpoint: str) -> None:
    pod = gpu_pod()
    pod["spec"]["containers"].append(
        {"name": "gpusharing-meter", "image": "evil:1", "terminationMessagePath": "/dev/termination-log"}
    )
    response = review(client, admission_review(pod), endpoint)
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert "'gpusharing-meter' is reserved for the GPU metering sidecar" in response["status"]["message"]


def test_a_tampered_meter_is_refused_even_after_defaulting(client: FlaskClient) -> None:
    _, mutated = admitted(client, gpu_pod())
    # The API server defaults what the webhook injected: still recognised as the webhook's own.
    meter = meter_of(mutated)
    meter.update(
        terminationMessagePath="/dev/termination-log", terminationMessagePolicy="File", imagePullPolicy="IfNotPresent"
    )
    for env in meter["env"]:
        if "valueFrom" in env:
            env["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
    assert review(client, admission_review(mutated), "/validate")["allowed"]
    meter["env"][3]["value"] = "0.01"  # bill less
    response = review(client, admission_review(mutated), "/validate")
    assert response["allowed"] is False


def as_the_api_server_stores_it(pod: dict[str, Any]) -> dict[str, Any]:
    """What kube-apiserver's own admission plugins and defaulting add after the webhook patched the pod.

    The ServiceAccount plugin mounts the workload's token into every container that has nothing at its path (the
    meter has), and defaulting fills in per-container fields; tests/e2e sees the same on a real API server.
    """
    stored = copy.deepcopy(pod)
    spec = stored["spec"]
    spec["volumes"].append(
        {
            "name": "kube-api-access-x7k2p",
            "projected": {
                "defaultMode": 420,
                "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}],
            },
        }
    )
    for container in spec.get("initContainers", []) + spec["containers"]:
        mounts = container.setdefault("volumeMounts", [])
        if not any(m["mountPath"] == SERVICE_ACCOUNT_TOKEN_DIR for m in mounts):
            mounts.append({"name": "kube-api-access-x7k2p", "mountPath": SERVICE_ACCOUNT_TOKEN_DIR, "readOnly": True})
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("imagePullPolicy", "IfNotPresent")
        container.setdefault("resizePolicy", [{"resourceName": "cpu", "restartPolicy": "NotRequired"}])
        for env in container.get("env", []):
            if "valueFrom" in env:
                env["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
    return stored


def test_the_meter_gets_no_api_token_and_is_recognised_after_the_api_servers_own_plugins(client: FlaskClient) -> None:
    _, mutated = admitted(client, gpu_pod())
    meter = meter_of(mutated)
    blocking = [m for m in meter["volumeMounts"] if m["mountPath"] == SERVICE_ACCOUNT_TOKEN_DIR]
    assert blocking == [
        {"name": "gpusharing-meter-no-api-token", "mountPath": SERVICE_ACCOUNT_TOKEN_DIR, "readOnly": True}
    ]
    assert {"name": "gpusharing-meter-no-api-token", "emptyDir": {"sizeLimit": "1Ki"}} in mutated["spec"]["volumes"]

    stored = as_the_api_server_stores_it(mutated)
    assert review(client, admission_review(stored), "/validate")["allowed"]
    reinvoked = review(client, admission_review(stored))
    assert reinvoked["allowed"] and "patch" not in reinvoked
    # A token mount added to the meter anyway (a plugin that ignores existing mounts) is not the meter's business.
    meter_of(stored)["volumeMounts"].append(
        {"name": "kube-api-access-x7k2p", "mountPath": "/elsewhere", "readOnly": True}
    )
    assert review(client, admission_review(stored), "/validate")["allowed"]


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda m: m.update(envFrom=[{"secretRef": {"name": "proxy"}}]), id="envFrom"),
        pytest.param(lambda m: m.update(command=["sh", "-c", "sleep infinity"]), id="command"),
        pytest.param(lambda m: m["resources"]["limits"].update(cpu="4"), id="resources"),
        pytest.param(lambda m: m["securityContext"].update(runAsUser=0), id="securityContext"),
        pytest.param(lambda m: m.pop("restartPolicy"), id="restartPolicy"),
        pytest.param(lambda m: m["volumeMounts"].pop(0), id="own mount removed"),
        pytest.param(lambda m: m["volumeMounts"][1].update(mountPath="/tmp"), id="own mount moved"),
    ],
)
def test_what_governs_the_meter_cannot_be_changed(client: FlaskClient, tamper: Any) -> None:
    _, mutated = admitted(client, gpu_pod())
    stored = as_the_api_server_stores_it(mutated)
    tamper(meter_of(stored))
    for endpoint in ("/mutate", "/validate"):
        response = review(client, admission_review(stored), endpoint)
        assert response["allowed"] is False, endpoint
        assert "'gpusharing-meter' is reserved for the GPU metering sidecar" in response["status"]["message"]


def test_only_the_meter_may_mount_its_token(client: FlaskClient) -> None:
    _, mutated = admitted(client, gpu_pod())
    mutated["spec"]["containers"][0]["volumeMounts"] = [{"name": "gpusharing-meter-token", "mountPath": "/steal"}]
    response = review(client, admission_review(mutated), "/validate")
    assert response["allowed"] is False
    assert "only the sidecar may mount" in response["status"]["message"]


def test_hand_written_record_annotations_are_refused_at_validation(client: FlaskClient) -> None:
    _, mutated = admitted(client, gpu_pod())
    mutated["metadata"]["annotations"]["gpusharing.io/gpu-share"] = "0.01"
    response = review(client, admission_review(mutated), "/validate")
    assert response["allowed"] is False
    assert "gpusharing.io/gpu-share='0.01' (the pod asks for '0.3')" in response["status"]["message"]


def test_update_may_not_change_the_record_but_may_change_other_annotations(client: FlaskClient) -> None:
    _, stored = admitted(client, gpu_pod())
    relabelled = copy.deepcopy(stored)
    relabelled["metadata"]["annotations"]["scheduler.example.com/node"] = "gpu-3"
    response = review(client, admission_review(relabelled, "UPDATE", old=stored))
    assert response["allowed"] and "patch" not in response

    for change in (
        {"gpusharing.io/budget-state": "in-budget", "gpusharing.io/gpu-share": "0.01"},
        {"gpusharing.io/extra": "x"},
    ):
        tampered = copy.deepcopy(stored)
        tampered["metadata"]["annotations"].update(change)
        for endpoint in ("/mutate", "/validate"):
            response = review(client, admission_review(tampered, "UPDATE", old=stored), endpoint)
            assert response["allowed"] is False and response["status"]["code"] == 403
            first = next(iter(sorted(k for k in change if stored["metadata"]["annotations"].get(k) != change[k])))
            assert f"cannot be changed: annotation {first}" in response["status"]["message"]
    labelled = copy.deepcopy(stored)
    labelled["metadata"]["labels"] = {"gpusharing.io/gpu-share": "0.01"}
    response = review(client, admission_review(labelled, "UPDATE", old=stored), "/validate")
    assert (
        not response["allowed"] and "cannot be changed: label gpusharing.io/gpu-share" in response["status"]["message"]
    )


def non_gpu_pod(**metadata: Any) -> dict[str, Any]:
    return api_server_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", **metadata},
            "spec": {"activeDeadlineSeconds": 315_360_000, "containers": [{"name": "web", "image": "nginx:1.27"}]},
        }
    )


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
def test_a_pod_that_asks_for_no_gpu_may_carry_nothing_of_the_record(client: FlaskClient, endpoint: str) -> None:
    """Such a pod would count as a GPU pod's commitment in the timekeeper, against its namespace and its siblings."""
    assert review(client, admission_review(non_gpu_pod(annotations={"team": "web"})), endpoint)["allowed"]
    forged = non_gpu_pod(annotations={"gpusharing.io/gpu-share": "1000", "gpusharing.io/admission-id": "a" * 16},
                         labels={"gpusharing.io/gpu-model": "H100"})
    response = review(client, admission_review(forged), endpoint)
    assert not response["allowed"] and response["status"]["code"] == 403
    assert response["status"]["message"] == (
        "annotations and labels under gpusharing.io/ are the GPU-sharing webhook's record and this pod asks for no "
        "GPU: "
        "remove annotation gpusharing.io/admission-id, annotation gpusharing.io/gpu-share, label "
        "gpusharing.io/gpu-model"
    )


def test_on_a_gpu_pod_only_the_webhooks_own_record_stands(client: FlaskClient) -> None:
    pod = gpu_pod()
    pod["metadata"]["annotations"].update({"gpusharing.io/gpu-share": "0.01", "gpusharing.io/admission-id": "a" * 16,
                                           "gpusharing.io/anything": "x"})
    pod["metadata"]["labels"] = {"gpusharing.io/gpu-model": "H100", "app": "infer"}
    _, mutated = admitted(client, pod)
    record = {k: v for k, v in mutated["metadata"]["annotations"].items() if k.startswith("gpusharing.io/")}
    assert record == {
        "gpusharing.io/gpu-share": "0.3",
        "gpusharing.io/dialect": "hami",
        "gpusharing.io/gpu-memory-mib": "3000",
        "gpusharing.io/gpu-model": "NVIDIA A100-SXM4-80GB",
        "gpusharing.io/budget-state": "in-budget",
    }
    assert mutated["metadata"]["labels"] == {"app": "infer"}
    assert review(client, admission_review(mutated), "/validate")["allowed"]
    # What another webhook adds under the prefix after ours is refused at validation.
    mutated["metadata"]["labels"]["gpusharing.io/budget-state"] = "in-budget"
    response = review(client, admission_review(mutated), "/validate")
    assert (
        not response["allowed"]
        and "may not be set by hand: label gpusharing.io/budget-state" in response["status"]["message"]
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "not an AdmissionReview: the body is not JSON: Expecting value"),
        (b"[" * 100_000 + b"]" * 100_000, "not an AdmissionReview: the body is nested more than 100 levels deep"),
        (b'{"kind": "AdmissionReview", "kind": "AdmissionReview"}', "the key 'kind' appears twice in one object"),
        (b"[]", "expected a JSON AdmissionReview object"),
        (b'{"kind": "Pod", "apiVersion": "v1"}', "expected kind AdmissionReview"),
        (b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}', "the AdmissionReview has no request"),
        (
            b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"operation": "CREATE"}}',
            "request.uid must be a non-empty string",
        ),
        (
            b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": "1", "operation": '
            b'"EXPLODE"}}',
            "request.operation must be",
        ),
        (
            b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": "1", "operation": '
            b'"CREATE", "object": 5}}',
            "request.object must be an object",
        ),
    ],
)
def test_a_body_that_is_not_an_admission_review_gets_400_with_a_message(
    client: FlaskClient, body: bytes, message: str
) -> None:
    for endpoint in ("/mutate", "/validate"):
        answer = client.post(endpoint, data=body, content_type="application/json")
        assert answer.status_code == 400
        assert message in answer.get_json()["error"]


def test_wrong_method_and_path_are_json_errors(client: FlaskClient) -> None:
    assert client.get("/mutate").status_code == 405
    assert client.get("/nowhere").get_json()["error"]


def test_malformed_pod_shapes_never_give_a_500(client: FlaskClient) -> None:
    for obj in (
        {"spec": "x"},
        {"metadata": [], "spec": {"containers": "x"}},
        {"spec": {"containers": [{"resources": {"limits": []}}]}},
    ):
        body = admission_review(None)
        body["request"]["object"] = obj
        for endpoint in ("/mutate", "/validate"):
            assert client.post(endpoint, json=body).status_code == 200


def test_a_body_that_is_not_a_review_is_logged_with_its_endpoint(
    client: FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="webhook.api.reviews"):
        assert client.post("/validate", json={"kind": "Pod"}).status_code == 400
    [logged] = caplog.records
    assert (logged.endpoint, logged.decision) == ("validate", "bad-review")  # type: ignore[attr-defined]


def test_a_denied_pod_whose_metadata_is_not_an_object_is_denied_not_a_500(
    client: FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    body = admission_review(api_server_pod({"metadata": {}, "spec": {"containers": [
        {"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "x"}}}]}}))
    caplog.set_level("INFO", "webhook.api.reviews")
    for metadata in ("a string", ["a", "list"], {"name": ["not", "a", "string"]}, {"name": "x" * 100_000}):
        body["request"]["object"]["metadata"] = metadata
        for endpoint in ("/mutate", "/validate"):
            response = review(client, body, endpoint)
            assert response["allowed"] is False and 'nvidia.com/gpu="x"' in response["status"]["message"]
    denials = [r.getMessage() for r in caplog.records if r.getMessage().startswith("denied CREATE")]
    assert len(denials) == 8 and max(len(line) for line in denials) < 300  # the 100,000-character name is cut short


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("metadata", None, "metadata must be an object"),
        ("metadata", [], "metadata must be an object"),
        ("spec.initContainers", None, "spec.initContainers must be a list"),
        ("spec.volumes", {}, "spec.volumes must be a list"),
    ],
)
def test_a_gpu_pod_the_patch_could_not_apply_to_is_denied_not_patched(
    client: FlaskClient, field: str, value: Any, problem: str
) -> None:
    body = admission_review(gpu_pod())
    parent, _, key = field.rpartition(".")
    (body["request"]["object"][parent] if parent else body["request"]["object"])[key] = value
    for endpoint in ("/mutate", "/validate"):
        response = review(client, body, endpoint)
        assert response["allowed"] is False and "patch" not in response
        assert response["status"] == {"code": 400, "message": f"not a pod the GPU-sharing webhook can patch: {problem}"}


def test_a_body_larger_than_the_webhook_reads_is_413(client: FlaskClient) -> None:
    body = json.dumps(admission_review(gpu_pod())).encode()
    padded = body[:-1] + b', "padding": "' + b"x" * (3 * 1024 * 1024) + b'"}'
    answer = client.post("/mutate", data=padded, content_type="application/json")
    assert answer.status_code == 413
    assert (
        answer.get_json()["error"]
        == "not an AdmissionReview: the body is larger than the 3145728 bytes the webhook reads"
    )
    assert client.post("/mutate", data=body, content_type="application/json").status_code == 200


@pytest.mark.parametrize("tenant", [False, True])
def test_a_review_is_answered_alike_ahead_of_flask_and_through_it(client: FlaskClient, tenant: bool) -> None:
    """ReviewRoutes answers reviews of a stated length; Flask those without one (a chunked body): the same answers,
    and a caller who is not the API server refused alike."""
    if tenant:
        client.environ_base["HTTP_AUTHORIZATION"] = "Bearer a-tenants-token"
    bodies = {
        json.dumps(admission_review(gpu_pod())).encode(): 200,
        json.dumps(admission_review(example_pod("hami-fraction.yaml"))).encode(): 200,
        b"{": 400,
        b'{"kind": "Pod"}': 400,
    }
    for endpoint in ("/mutate", "/validate"):
        for body, status in bodies.items():
            ahead = client.post(endpoint, data=body, content_type="application/json")
            environ = EnvironBuilder(path=endpoint, method="POST", data=body, content_type="application/json",
                                     environ_base=client.environ_base).get_environ()
            del environ["CONTENT_LENGTH"]
            environ["wsgi.input_terminated"] = True  # as gunicorn hands a chunked body on
            through = Response.from_app(client.application, environ)
            assert ahead.status_code == (403 if tenant else status)
            assert (through.status, through.content_type, through.get_data()) == (
                ahead.status, ahead.content_type, ahead.get_data()
            )


def test_a_bug_is_a_json_500_ahead_of_flask_as_through_it(
    client: FlaskClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(body: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr("webhook.api.reviews.parse_review", broken)
    body = json.dumps(admission_review(gpu_pod())).encode()
    ahead = client.post("/mutate", data=body, content_type="application/json")
    environ = EnvironBuilder(path="/mutate", method="POST", data=body, content_type="application/json",
                             environ_base=client.environ_base).get_environ()
    del environ["CONTENT_LENGTH"]
    environ["wsgi.input_terminated"] = True
    through = Response.from_app(client.application, environ)
    assert ahead.status_code == through.status_code == 500
    assert ahead.get_data() == through.get_data() and "internal error" in ahead.get_json()["error"]
    assert [r.getMessage() for r in caplog.records if r.exc_info] == ["Exception on /mutate [POST]"] * 2


def test_a_large_pod_is_read_like_any_other(client: FlaskClient) -> None:
    pod = gpu_pod()
    pod["metadata"]["annotations"]["example.com/blob"] = "x" * (1400 * 1024)  # a pod's size limit once stored
    _, mutated = admitted(client, pod)
    assert mutated["metadata"]["annotations"]["gpusharing.io/gpu-share"] == "0.3"
    assert review(client, admission_review(mutated), "/validate")["allowed"] is True


@pytest.mark.parametrize(
    ("where", "key", "value", "message"),
    [
        # KAI reads gpu-memory as digits only: an exponent is refused before it is read
        (
            "annotation",
            "gpu-memory",
            "1e999999",
            'annotation gpu-memory="1e999999": must be a whole number of MiB above 0, in digits only',
        ),
        (
            "annotation",
            "gpu-memory",
            "9" * 5000,
            'annotation gpu-memory="' + "9" * 64 + "… (5000 characters)\": has too many digits",
        ),
        ("annotation", "gpu-fraction", "1e-999999999", 'annotation gpu-fraction="1e-999999999": has too many digits'),
        ("limits", "nvidia.com/gpu", "2k", 'container "main": nvidia.com/gpu="2k": asks for 2000 GPUs, more than 1000'),
        (
            "limits",
            "nvidia.com/gpu",
            "1e28",
            'container "main": nvidia.com/gpu="1e28": asks for 10000000000000000000000000000 GPUs',
        ),
        (
            "limits",
            "aliyun.com/gpu-mem",
            "9" * 5000,
            'container "main": aliyun.com/gpu-mem="' + "9" * 64 + "… (5000 characters)\": has too many",
        ),
    ],
)
def test_hostile_gpu_requests_are_refused_at_once_naming_the_rule(
    client: FlaskClient, where: str, key: str, value: str, message: str
) -> None:
    resources = {"limits": {key: value}} if where == "limits" else {}
    annotations = {key: value} if where == "annotation" else {}
    pod = api_server_pod({"metadata": {"name": "p", "annotations": annotations},
                          "spec": {"containers": [{"name": "main", "image": "cuda", "resources": resources}]}})
    for endpoint in ("/mutate", "/validate"):
        response = review(client, admission_review(pod), endpoint)
        assert response["allowed"] is False and response["status"]["code"] == 422
        assert message in response["status"]["message"]


def test_a_forged_gpu_memory_record_is_read_within_bounds(client: FlaskClient) -> None:
    pod = gpu_pod()
    pod["metadata"]["annotations"].update(
        {"gpusharing.io/gpu-share": "0.3", "gpusharing.io/gpu-memory-mib": "9" * 5000}
    )
    response = review(client, admission_review(pod))
    assert response["allowed"] is True  # the record is rewritten; the forged one does not trip the webhook


def test_health_and_metrics(client: FlaskClient) -> None:
    assert client.get("/livez").status_code == 200 and client.get("/readyz").status_code == 200
    review(client, admission_review(example_pod("kai-fraction.yaml")))
    text = client.get("/metrics").get_data(as_text=True)
    assert (
        'gpusharing_webhook_admissions_total{decision="allowed",dialect="kai",endpoint="mutate",operation="CREATE"}'
        in text
    )
    assert "gpusharing_webhook_admission_duration_seconds_bucket" in text


def test_reinvocation_after_another_webhook_changed_the_gpu_request_replaces_the_meter(client: FlaskClient) -> None:
    _, mutated = admitted(client, gpu_pod())
    # A later webhook raises the pod's GPU cores; the API server reinvokes ours (reinvocationPolicy: IfNeeded).
    for kind in ("limits", "requests"):
        mutated["spec"]["containers"][0]["resources"][kind]["nvidia.com/gpucores"] = "60"
    assert review(client, admission_review(mutated), "/validate")["allowed"] is False  # stale until re-mutated

    response, remutated = admitted(client, mutated)
    assert remutated["metadata"]["annotations"]["gpusharing.io/gpu-share"] == "0.6"
    assert {e["name"]: e.get("value") for e in meter_of(remutated)["env"]}["GPUSHARING_GPU_SHARE"] == "0.6"
    assert [c["name"] for c in remutated["spec"]["initContainers"]] == ["gpusharing-meter"]
    assert review(client, admission_review(remutated), "/validate")["allowed"]
    assert "patch" not in review(client, admission_review(remutated))


def test_a_forged_record_does_not_let_a_foreign_meter_in(client: FlaskClient) -> None:
    pod = gpu_pod()
    pod["metadata"]["annotations"].update({"gpusharing.io/gpu-share": "0.01", "gpusharing.io/gpu-memory-mib": "1"})
    pod["spec"]["initContainers"] = [{"name": "gpusharing-meter", "image": "evil:1", "restartPolicy": "Always"}]
    response = review(client, admission_review(pod))
    assert response["allowed"] is False and "reserved for the GPU metering sidecar" in response["status"]["message"]


def test_a_timekeeper_url_without_a_scheme_is_refused_as_the_meter_would() -> None:
    with pytest.raises(ConfigError, match="^GPUSHARING_TIMEKEEPER_URL='timekeeper:8080' must be an http"):
        WebhookConfig.from_env({"GPUSHARING_TIMEKEEPER_URL": "timekeeper:8080"})
def test_a_pod_claiming_a_gpu_is_read_from_the_claims_of_the_reviews_namespace(
    config: WebhookConfig, budgets: BudgetStateCache
) -> None:
    asked: list[tuple[str, str, str]] = []

    def claims(source: ClaimSource, namespace: str, name: str) -> ClaimSpec:
        asked.append((str(source), namespace, name))
        return claim_spec(
            {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}
        )

    client = create_app(config, budgets, claims).test_client()
    pod = api_server_pod({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dra"}, "spec": {
        "containers": [{"name": "ctr", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "two-gpus"}],
    }})
    del pod["metadata"]["namespace"]  # the object of a CREATE may come without it: the review names the namespace
    body = admission_review(pod)
    body["request"]["namespace"] = "ml-team"
    response = review(client, body)
    assert response["allowed"] and asked == [("ResourceClaimTemplate", "ml-team", "two-gpus")]
    mutated = jsonpatch.apply_patch(pod, patch_of(response))
    annotations = mutated["metadata"]["annotations"]
    assert (
        annotations["gpusharing.io/dialect"],
        annotations["gpusharing.io/gpu-share"],
        annotations["gpusharing.io/gpu-memory-mib"],
    ) == ("dra", "2", "163840")
