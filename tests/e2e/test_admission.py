"""Admission on a real kube-apiserver: its own plugins run around the project's webhooks, as in a cluster."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from demo.apiserver import EXAMPLES
from demo.processes import free_port
from gpusharing.gpu.dra import ClaimLookup, no_claims
from gpusharing.gpu.request import format_share, parse_gpu_request
from tests.e2e.mutator import ADDED_LABEL, LABEL, Mutator
from tests.e2e.system import ApiError, GpuSharing, wait_for
from tests.gpusharing.test_request import INVALID
from webhook.admission.meter import SERVICE_ACCOUNT_TOKEN_DIR
from webhook.config import WebhookConfig

METER = "gpusharing-meter"
IN_BUDGET, OVER_BUDGET = "gpusharing-in-budget", "gpusharing-over-budget"
EXAMPLE_PODS = sorted(p.name for p in EXAMPLES.glob("*.yaml") if yaml.safe_load(p.read_text())["kind"] == "Pod")
EXAMPLE_JOBS = sorted(p.name for p in EXAMPLES.glob("*.yaml") if yaml.safe_load(p.read_text())["kind"] == "Job")


def example(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((EXAMPLES / name).read_text()))


def meter_of(pod: dict[str, Any]) -> dict[str, Any]:
    (meter,) = [c for c in pod["spec"].get("initContainers", []) if c["name"] == METER]
    return meter


def assert_governed(
    pod: dict[str, Any], priority_class: str = IN_BUDGET, state: str = "unlimited", claims: ClaimLookup = no_claims
) -> None:
    """The pod as the API server stored it carries the webhook's record (as `parse_gpu_request` reads it, with the
    claims `claims` finds), the meter and a resolved priority. The timekeeper runs without a default budget, so a
    namespace it does not list is unlimited."""
    gpu = parse_gpu_request(pod, WebhookConfig().gpu_request, claims)
    assert gpu is not None
    annotations = pod["metadata"]["annotations"]
    assert annotations["gpusharing.io/gpu-share"] == format_share(gpu.share)
    assert annotations["gpusharing.io/dialect"] == str(gpu.dialect)
    assert annotations["gpusharing.io/gpu-memory-mib"] == str(gpu.memory_mib)
    assert annotations["gpusharing.io/gpu-model"] == gpu.model  # what the timekeeper bills it as without NVML
    assert annotations["gpusharing.io/budget-state"] == state
    spec = pod["spec"]
    assert spec["priorityClassName"] == priority_class
    # the class's, as the Priority plugin checks
    assert spec["priority"] == {IN_BUDGET: 1000, OVER_BUDGET: -1000}[priority_class]
    meter = meter_of(pod)
    assert meter["restartPolicy"] == "Always" and spec["initContainers"][0]["name"] == METER
    env = {e["name"]: e.get("value") for e in meter["env"]}
    assert env["GPUSHARING_GPU_SHARE"] == annotations["gpusharing.io/gpu-share"]
    # The ServiceAccount plugin mounted the workload's token into the workload, not into the meter.
    token_mounts = {
        c["name"]: [m["name"] for m in c.get("volumeMounts", []) if m["mountPath"] == SERVICE_ACCOUNT_TOKEN_DIR]
        for c in spec.get("initContainers", []) + spec["containers"]
    }
    assert token_mounts.pop(METER) == ["gpusharing-meter-no-api-token"]
    assert all(len(mounts) == 1 and mounts[0].startswith("kube-api-access-") for mounts in token_mounts.values()), (
        token_mounts
    )


@pytest.mark.parametrize("name", EXAMPLE_PODS)
def test_every_example_pod_is_admitted_with_the_default_service_account_token(
    gpusharing: GpuSharing, name: str
) -> None:
    namespace = gpusharing.namespace("e2e-examples")
    pod = gpusharing.create(namespace, example(name))
    assert pod["spec"]["serviceAccountName"] == "default" and pod["spec"].get("automountServiceAccountToken") is None
    assert_governed(pod)


def test_pods_of_a_job_and_of_a_deployment_are_admitted_as_their_controllers_create_them(
    gpusharing: GpuSharing,
) -> None:
    gpusharing.require_controllers()
    namespace = gpusharing.namespace("e2e-controllers")
    for name in EXAMPLE_JOBS:
        job = example(name)
        gpusharing.create(namespace, job)
        (pod,) = wait_for(
            lambda: gpusharing.pods(namespace, f"job-name={job['metadata']['name']}"), f"the pod of Job {name}"
        )
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
        assert_governed(pod)
    template = example("kai-fraction.yaml")
    template["metadata"] = {"labels": {"app": "infer"}, "annotations": template["metadata"]["annotations"]}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "infer"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "infer"}}, "template": template},
    }
    gpusharing.create(namespace, deployment)
    pods = wait_for(
        lambda: (p := gpusharing.pods(namespace, "app=infer")) and len(p) == 2 and p, "the Deployment's two pods"
    )
    for pod in pods:
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
        assert_governed(pod)


def as_manifest(pod: dict[str, Any], name: str) -> dict[str, Any]:
    """A pod of the unit tests without what the API server fills in, to be created for real."""
    manifest = copy.deepcopy(pod)
    manifest.pop("status", None)
    manifest["metadata"] = {"name": name, "annotations": manifest["metadata"].get("annotations") or {}}
    for field in ("priority", "preemptionPolicy"):
        manifest["spec"].pop(field, None)
    return manifest


def limits_of(pod: dict[str, Any]) -> list[dict[str, str]]:
    """The limits of the pod's own containers (the injected meter aside)."""
    containers = pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
    return [c.get("resources", {}).get("limits", {}) for c in containers if c["name"] != METER]


def where_and_rule(message: str) -> tuple[str, ...]:
    """A refusal without the value, which the API server sends in canonical form ("1.5" arrives as "1500m")."""
    if '="' not in message:
        return (message,)
    where, rest = message.split('="', 1)
    return where, rest.split('": ', 1)[1]


def test_invalid_gpu_requests_are_refused_with_the_webhooks_message(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-invalid")
    by_webhook = 0
    for index, (pod, messages) in enumerate(INVALID):
        manifest = as_manifest(pod, f"invalid-{index}")
        try:
            created = gpusharing.create(namespace, manifest)
        except ApiError as refused:
            message, status = refused.message, refused.status
        else:
            # The API server decodes quantities before any webhook sees them, and may read an absurd one as another
            # value (41 digits of gpumem arrive as "10"): then the webhook judges, and bills, what it was sent.
            written, stored = (limits_of(pod) for pod in (manifest, created))
            assert written != stored, f"INVALID[{index}] was admitted as written: {manifest}"
            assert_governed(created)
            continue
        if 'admission webhook "mutate.gpusharing.io" denied the request: invalid GPU request: ' in message:
            by_webhook += 1
            assert all(all(part in message for part in where_and_rule(m)) for m in messages), message
        else:  # not a quantity at all: the API server cannot decode the pod, and no webhook sees it
            assert status == 400 and "quantities must match the regular expression" in message, message
    assert by_webhook >= len(INVALID) - 5


def test_a_container_under_the_meters_name_is_refused(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-impostor")
    pod = example("kai-fraction.yaml")
    pod["spec"]["containers"].append({"name": METER, "image": "evil.example/meter:1", "args": ["meter"]})
    with pytest.raises(ApiError) as refused:
        gpusharing.create(namespace, pod)
    assert "the container name 'gpusharing-meter' is reserved for the GPU metering sidecar" in refused.value.message
    no_gpu = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sneaky"},
              "spec": {"containers": [{"name": METER, "image": "evil.example/meter:1"}]}}
    with pytest.raises(ApiError) as refused:
        gpusharing.create(namespace, no_gpu)
    assert "this pod asks for no GPU" in refused.value.message


def test_the_record_cannot_be_changed_once_admitted(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-record")
    pod = gpusharing.create(namespace, example("kai-fraction.yaml"))
    path = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}"
    with pytest.raises(ApiError) as refused:
        gpusharing.rest(
            "PATCH", path, {"metadata": {"annotations": {"gpusharing.io/gpu-share": "0.01"}}}, patch="merge"
        )
    assert 'admission webhook "validate.gpusharing.io" denied the request' in refused.value.message
    assert "gpusharing.io/gpu-share" in refused.value.message
    relabelled = gpusharing.rest("PATCH", path, {"metadata": {"labels": {"team": "vision"}}}, patch="merge")
    assert relabelled["metadata"]["labels"]["team"] == "vision"


def admissions_answered(gpusharing: GpuSharing, endpoint: str = "") -> float:
    """Reviews the webhook has answered (on `endpoint` alone, `mutate` or `validate`, if given), by its metrics."""
    metrics = requests.get(f"{gpusharing.webhook_url}/metrics", verify=gpusharing.webhook.verify, timeout=10).text
    wanted = f'endpoint="{endpoint}"' if endpoint else ""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("gpusharing_webhook_admissions_total{") and wanted in line)


def test_a_pod_without_a_gpu_request_never_reaches_the_webhook(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-no-gpu")
    before = admissions_answered(gpusharing)
    web = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {
            "containers": [
                {"name": "web", "image": "nginx:1.27", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}
            ]
        },
    }
    created = gpusharing.create(namespace, web)
    assert "annotations" not in created["metadata"] and "priorityClassName" not in created["spec"]
    assert admissions_answered(gpusharing) == before
    gpusharing.create(namespace, example("kai-fraction.yaml"))
    assert admissions_answered(gpusharing) >= before + 2  # /mutate and /validate: the counter does count


def test_a_namespace_over_budget_gets_the_over_budget_class_and_a_top_up_brings_it_back(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-budget")
    gpusharing.set_budget(namespace, gpu_minutes=1)
    probe = example("kai-fraction.yaml")
    wait_for(lambda: gpusharing.webhook_state(namespace, probe) == "in-budget", "the webhook to learn the new budget")
    first = gpusharing.create(namespace, probe)
    assert_governed(first, IN_BUDGET, "in-budget")

    token = gpusharing.token(namespace, "default", pod=first)
    assert gpusharing.report(first, token, gpu_seconds=90).status_code == 200  # 1.5 GPU-minutes: over budget
    wait_for(
        lambda: gpusharing.webhook_state(namespace, probe) == "over-budget",
        "the webhook to learn the namespace is over budget",
    )
    second = example("kai-fraction.yaml")
    second["metadata"]["name"] = "gpu-pod-2"
    demoted = gpusharing.create(namespace, second)
    assert_governed(demoted, OVER_BUDGET, "over-budget")

    gpusharing.top_up(namespace, 5)
    wait_for(lambda: gpusharing.webhook_state(namespace, probe) == "in-budget", "the webhook to learn of the top-up")
    third = example("kai-fraction.yaml")
    third["metadata"]["name"] = "gpu-pod-3"
    assert_governed(gpusharing.create(namespace, third), IN_BUDGET, "in-budget")


@pytest.fixture
def webhook_down(gpusharing: GpuSharing) -> Iterator[None]:
    """The project's webhook configurations pointed at a port where nothing answers, as when every replica is down."""
    dead = f"https://127.0.0.1:{free_port()}"
    paths = {
        c["kind"]: f"/apis/admissionregistration.k8s.io/v1/{c['kind'].lower()}s/{c['metadata']['name']}"
        for c in gpusharing.webhook_configurations()
    }

    def point_at(url: str | None) -> None:
        for configuration in gpusharing.webhook_configurations(url):
            webhooks = [{"name": w["name"], "clientConfig": w["clientConfig"]} for w in configuration["webhooks"]]
            gpusharing.rest("PATCH", paths[configuration["kind"]], {"webhooks": webhooks}, patch="strategic")

    point_at(dead)
    yield
    point_at(None)


def test_with_the_webhook_down_gpu_pods_are_refused_and_other_pods_admitted(
    gpusharing: GpuSharing, webhook_down: None
) -> None:
    namespace = gpusharing.namespace("e2e-down")
    web = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]},
    }
    assert gpusharing.create(namespace, web)["metadata"]["name"] == "web"
    with pytest.raises(ApiError) as refused:
        gpusharing.create(namespace, example("kai-fraction.yaml"))
    assert 'failed calling webhook "mutate.gpusharing.io"' in refused.value.message


@pytest.fixture
def other_team(gpusharing: GpuSharing, tmp_path: Path) -> Iterator[Mutator]:
    mutator = Mutator(tmp_path)
    configuration = mutator.configuration()
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    gpusharing.rest("POST", path, configuration)
    yield mutator
    gpusharing.rest("DELETE", f"{path}/{configuration['metadata']['name']}")
    mutator.stop()


def test_a_later_webhook_that_adds_a_label_leaves_the_pod_admitted_and_its_record_right(
    gpusharing: GpuSharing, other_team: Mutator
) -> None:
    namespace = gpusharing.namespace("e2e-reinvoke")
    pod = example("kai-fraction.yaml")
    pod["metadata"]["labels"] = {LABEL: "label"}
    created = gpusharing.create(namespace, pod)
    assert created["metadata"]["labels"][ADDED_LABEL] == "yes" and other_team.calls >= 1
    assert_governed(created)


def test_a_later_webhook_that_changes_the_gpu_request_gets_the_pod_billed_for_the_new_one(
    gpusharing: GpuSharing, other_team: Mutator
) -> None:
    namespace = gpusharing.namespace("e2e-reinvoke-gpu")
    pod = example("kai-fraction.yaml")
    assert pod["metadata"]["annotations"]["gpu-fraction"] == "0.5"
    pod["metadata"]["labels"] = {LABEL: "gpu"}
    created = gpusharing.create(namespace, pod)
    assert created["metadata"]["annotations"]["gpu-fraction"] == "0.25"
    assert created["metadata"]["annotations"]["gpusharing.io/gpu-share"] == "0.25"
    assert_governed(created)  # one meter, billing 0.25


def test_how_the_backend_reads_a_pod_reaches_the_user_as_warnings(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-warnings")
    pod = example("hami-fraction.yaml")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] = 150
    response = gpusharing.session.post(
        f"{gpusharing.plane.url}/api/v1/namespaces/{namespace}/pods",
        json=pod,
        headers={"Accept": "application/json"},
        timeout=60,
    )
    assert response.status_code == 201, response.text
    # The API server sends each admission warning as a Warning header, as kubectl prints them (RFC 7234: 299 - "...").
    assert (
        '299 - "container \\"infer\\": nvidia.com/gpucores=150 is more than 100: HAMi grants 100'
        in response.headers["Warning"]
    )
    assert response.json()["metadata"]["annotations"]["gpusharing.io/gpu-share"] == "1"
