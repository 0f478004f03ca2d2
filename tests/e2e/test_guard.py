"""What a namespace's admin cannot do to a GPU pod's bill, on a real API server: the official client's patches as
`kubectl patch` and `kubectl debug` send them, as a ServiceAccount with the built-in `admin` role in its namespace
alone; and the billing finalizer removed by the controller's own ServiceAccount (the RBAC of manifests/)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from demo.apiserver import EXAMPLES
from tests.e2e.system import SYSTEM_NAMESPACE, GpuSharing, wait_for

FINALIZER = "gpusharing.io/billing"
METER = "gpusharing-meter"


@dataclass
class Tenant:
    namespace: str
    admin: client.CoreV1Api  # the namespace's admin, through the official client

    def create_gpu_pod(self, name: str) -> dict[str, Any]:
        pod = yaml.safe_load((EXAMPLES / "kai-fraction.yaml").read_text())
        pod["metadata"]["name"] = name
        created = self.admin.create_namespaced_pod(self.namespace, pod)
        return dict(self.admin.api_client.sanitize_for_serialization(created))


@pytest.fixture
def tenant(gpusharing: GpuSharing) -> Iterator[Tenant]:
    gpusharing.require_controllers()  # the built-in admin role is aggregated by a controller
    namespace = gpusharing.namespace("e2e-guard")
    yield Tenant(namespace, gpusharing.namespace_admin(namespace))
    for pod in gpusharing.pods(namespace):  # so that the namespace can be deleted: no timekeeper closes these bills
        gpusharing.release(namespace, pod["metadata"]["name"])


def grant_debugging(gpusharing: GpuSharing, tenant: Tenant) -> None:
    """What clusters that allow `kubectl debug` and in-place resizes grant their tenants besides the built-in admin
    role, which has neither."""
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{tenant.namespace}"
    gpusharing.rest(
        "POST",
        f"{rbac}/roles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "debugger"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods/ephemeralcontainers", "pods/resize"],
                    "verbs": ["patch", "update"],
                }
            ],
        },
    )
    gpusharing.rest("POST", f"{rbac}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "debugger"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "debugger"},
        "subjects": [{"kind": "ServiceAccount", "name": "tenant-admin", "namespace": tenant.namespace}],
    })
    review = {"spec": {"resourceAttributes": {"namespace": tenant.namespace, "verb": "patch", "resource": "pods",
                                              "subresource": "resize"}}}
    authorization = client.AuthorizationV1Api(tenant.admin.api_client)
    wait_for(
        lambda: authorization.create_self_subject_access_review(review).status.allowed, "the debugger role to apply"
    )


def refusal(call: Any) -> str:
    """The API server's message when it refuses `call`; the test fails if it lets it through."""
    with pytest.raises(ApiException) as refused:
        call()
    return str(json.loads(refused.value.body)["message"])


def test_a_namespace_admin_cannot_change_the_meters_image(tenant: Tenant) -> None:
    pod = tenant.create_gpu_pod("train")
    assert [c["name"] for c in pod["spec"]["initContainers"]] == [METER]
    # kubectl patch pod train -p '{"spec": {"initContainers": [{"name": "gpusharing-meter", "image": ...}]}}'
    swap = {"spec": {"initContainers": [{"name": METER, "image": "evil.example/not-a-meter:1"}]}}
    message = refusal(lambda: tenant.admin.patch_namespaced_pod("train", tenant.namespace, swap))
    assert 'admission webhook "validate.gpusharing.io" denied the request: the GPU metering sidecar ' \
           "'gpusharing-meter' is injected by the GPU-sharing webhook and cannot be changed or removed" in message
    # The workload's own image is the admin's to change.
    bump = {
        "spec": {
            "containers": [
                {"name": pod["spec"]["containers"][0]["name"], "image": "nvidia/cuda:12.6.0-base-ubuntu22.04"}
            ]
        }
    }
    assert (
        tenant.admin.patch_namespaced_pod("train", tenant.namespace, bump)
        .spec.containers[0]
        .image.startswith("nvidia/cuda:12.6.0")
    )


def test_a_pod_cannot_mount_its_own_token_for_the_timekeeper(tenant: Tenant) -> None:
    pod = yaml.safe_load((EXAMPLES / "kai-fraction.yaml").read_text())
    pod["spec"]["volumes"] = [{"name": "report-as-me", "projected": {"sources": [
        {"serviceAccountToken": {"audience": "gpusharing-timekeeper", "expirationSeconds": 3600, "path": "token"}}]}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "report-as-me", "mountPath": "/var/run/secrets/timekeeper"}
    ]
    message = refusal(lambda: tenant.admin.create_namespaced_pod(tenant.namespace, pod))
    assert (
        "volume 'report-as-me' projects a ServiceAccount token for audience 'gpusharing-timekeeper', the timekeeper's"
        in message
    )


def test_the_billing_finalizer_holds_a_deleted_pod_until_the_timekeeper_removes_it(
    gpusharing: GpuSharing, tenant: Tenant
) -> None:
    pod = tenant.create_gpu_pod("train")
    assert pod["metadata"]["finalizers"] == [FINALIZER]
    tenant.admin.delete_namespaced_pod("train", tenant.namespace)
    held = gpusharing.pod(tenant.namespace, "train")
    assert held is not None and "deletionTimestamp" in held["metadata"]  # Terminating, its bill still open

    # kubectl patch pod train --type=json -p '[{"op": "remove", "path": "/metadata/finalizers/0"}]'
    remove = [{"op": "remove", "path": "/metadata/finalizers/0"}]
    message = refusal(lambda: tenant.admin.patch_namespaced_pod("train", tenant.namespace, remove))
    assert (
        f"the finalizer {FINALIZER} keeps this GPU pod until the timekeeper has closed its bill: only the timekeeper's "
        f"controller (system:serviceaccount:{SYSTEM_NAMESPACE}:gpusharing-controller) removes it" in message
    )
    assert f"'system:serviceaccount:{tenant.namespace}:tenant-admin' may not" in message
    # Nor through the pod's status, whose finalizers the API server lets change: the webhook leaves pods/status to
    # the kubelets and controllers that write it, and no built-in role gives a tenant that.
    message = refusal(lambda: tenant.admin.patch_namespaced_pod_status("train", tenant.namespace, remove))
    assert 'cannot patch resource "pods/status"' in message

    # The controller's account may remove it; the running controller itself does once the bill is closed (a pod that
    # never started: at its next pass), and may already have done so.
    controller = gpusharing.core_api_as(SYSTEM_NAMESPACE, "gpusharing-controller")
    try:
        controller.patch_namespaced_pod("train", tenant.namespace, remove)
    except ApiException as gone:
        assert gone.status == 404, gone
    wait_for(lambda: gpusharing.pod(tenant.namespace, "train") is None, "the pod gone once its bill is closed")


def test_an_ephemeral_container_may_debug_the_workload_but_not_the_meter(
    gpusharing: GpuSharing, tenant: Tenant
) -> None:
    grant_debugging(gpusharing, tenant)
    pod = tenant.create_gpu_pod("train")
    workload = pod["spec"]["containers"][0]["name"]

    def debug(name: str, target: str) -> Any:  # kubectl debug train -it --image=busybox --target=TARGET
        container = {"name": name, "image": "busybox:1.36", "targetContainerName": target, "stdin": True, "tty": True}
        return tenant.admin.patch_namespaced_pod_ephemeralcontainers(
            "train", tenant.namespace, {"spec": {"ephemeralContainers": [container]}})

    message = refusal(lambda: debug("debugger", METER))
    assert "ephemeral container 'debugger' targets the GPU metering sidecar 'gpusharing-meter'" in message
    debugged = debug("debugger", workload)
    assert [c.target_container_name for c in debugged.spec.ephemeral_containers] == [workload]


def test_a_resize_cannot_starve_the_meter(gpusharing: GpuSharing, tenant: Tenant) -> None:
    grant_debugging(gpusharing, tenant)
    pod = tenant.create_gpu_pod("train")
    cpu = pod["spec"]["initContainers"][0]["resources"]["limits"]["cpu"]
    starve = {
        "spec": {"initContainers": [{"name": METER, "resources": {"limits": {"cpu": "1m"}, "requests": {"cpu": "1m"}}}]}
    }
    message = refusal(lambda: tenant.admin.patch_namespaced_pod_resize("train", tenant.namespace, starve))
    assert "'gpusharing-meter' is injected by the GPU-sharing webhook and cannot be changed or removed" in message
    assert (
        tenant.admin.read_namespaced_pod("train", tenant.namespace).spec.init_containers[0].resources.limits["cpu"]
        == cpu
    )


def test_a_namespace_admin_can_neither_write_a_pods_end_nor_grant_itself_the_right_to(tenant: Tenant) -> None:
    """A pod's bill closes at the finishedAt its kubelet writes, and time billed past it is taken back
    (docs/budgets.md, "Never past the record"): a tenant who could write its pod's status could take back time it
    used. It can do neither that nor give itself the permission, on the API server."""
    tenant.create_gpu_pod("train")
    ended = {"status": {"phase": "Succeeded", "containerStatuses": [{
        "name": "main", "image": "cuda", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "startedAt": "2020-01-01T00:00:00Z",
                                 "finishedAt": "2020-01-01T00:00:01Z"}}}]}}
    message = refusal(lambda: tenant.admin.patch_namespaced_pod_status("train", tenant.namespace, ended))
    assert "pods/status" in message, message
    role = client.V1Role(metadata=client.V1ObjectMeta(name="status-writer"), rules=[client.V1PolicyRule(
        api_groups=[""], resources=["pods/status"], verbs=["patch", "update"])])
    rbac = client.RbacAuthorizationV1Api(tenant.admin.api_client)
    message = refusal(lambda: rbac.create_namespaced_role(tenant.namespace, role))
    assert "attempting to grant RBAC permissions not currently held" in message, message
