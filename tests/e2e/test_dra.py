"""Pods that get GPUs through Dynamic Resource Allocation, on a real kube-apiserver (resource.k8s.io/v1).

The webhook runs with its own ServiceAccount's token (the RBAC of manifests/) and reads ResourceClaimTemplates and
ResourceClaims from the index its watch keeps; no API call is made while a pod is admitted.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from demo.apiserver import EXAMPLES
from gpusharing.gpu.dra import ClaimSource, ClaimSpec, ClaimUnknown, claim_spec
from tests.e2e.system import ApiError, GpuSharing, wait_for
from tests.e2e.test_admission import assert_governed

RESOURCE_API = "resource.k8s.io/v1"
WEBHOOK_USER = "system:serviceaccount:gpusharing-system:gpusharing-webhook"


def claim_template(name: str, device_class: str = "gpu.nvidia.com", **exactly: Any) -> dict[str, Any]:
    """As the NVIDIA DRA driver's quickstart writes them (demo/specs/quickstart/v1/gpu-test1.yaml)."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class, **exactly}}]}
            }
        },
    }


def claiming_pod(name: str, template: str | None = None, claim: str | None = None) -> dict[str, Any]:
    source = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "ctr",
                    "image": "ubuntu:22.04",
                    "command": ["sleep", "infinity"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", **source}],
        },
    }


class ServerClaims:
    """The claim specs as the API server holds them: what the webhook's index should have learned."""

    def __init__(self, gpusharing: GpuSharing):
        self.gpusharing = gpusharing

    def __call__(self, source: ClaimSource, namespace: str, name: str) -> ClaimSpec:
        plural = "resourceclaimtemplates" if source is ClaimSource.TEMPLATE else "resourceclaims"
        try:
            obj = self.gpusharing.rest("GET", f"/apis/{RESOURCE_API}/namespaces/{namespace}/{plural}/{name}")
        except ApiError as exc:
            raise ClaimUnknown(exc.message) from None
        return claim_spec(obj["spec"]["spec"] if source is ClaimSource.TEMPLATE else obj["spec"])


def admitted_when_known(gpusharing: GpuSharing, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    """Creates `pod` once the webhook's watch has brought it the claim (a dry run until then)."""
    def known() -> bool:
        try:
            gpusharing.create(namespace, pod, dry_run=True)
        except ApiError as exc:
            if "create it before the pod" in exc.message or "not yet listed" in exc.message:
                return False
            raise
        return True

    wait_for(known, "the webhook's index to learn the claim")
    return gpusharing.create(namespace, pod)


def test_the_api_server_serves_resource_k8s_io_v1(gpusharing: GpuSharing) -> None:
    group = gpusharing.rest("GET", "/apis/resource.k8s.io")
    served = [v["version"] for v in group["versions"]]
    assert "v1" in served and group["preferredVersion"]["version"] == "v1", served


def test_the_dra_example_is_admitted_and_billed_one_gpu(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-dra-example")
    gpusharing.create(namespace, yaml.safe_load((EXAMPLES / "dra" / "gpu-claim-template.yaml").read_text()))
    pod = admitted_when_known(gpusharing, namespace, yaml.safe_load((EXAMPLES / "dra" / "gpu-pod.yaml").read_text()))
    assert pod["metadata"]["annotations"]["gpusharing.io/gpu-share"] == "1"
    assert_governed(pod, claims=ServerClaims(gpusharing))


def test_a_pod_claiming_gpus_through_a_template_is_admitted_and_billed_by_its_devices(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-dra")
    gpusharing.create(namespace, claim_template("single-gpu"))
    gpusharing.create(namespace, claim_template("two-gpus", count=2, allocationMode="ExactCount"))
    one = admitted_when_known(gpusharing, namespace, claiming_pod("one", "single-gpu"))
    two = admitted_when_known(gpusharing, namespace, claiming_pod("two", "two-gpus"))
    claims = ServerClaims(gpusharing)
    for pod, share, memory in ((one, "1", "81920"), (two, "2", "163840")):
        annotations = pod["metadata"]["annotations"]
        assert (
            annotations["gpusharing.io/dialect"],
            annotations["gpusharing.io/gpu-share"],
            annotations["gpusharing.io/gpu-memory-mib"],
        ) == ("dra", share, memory)
        assert_governed(pod, claims=claims)


def test_a_pod_claiming_a_mig_device_is_billed_by_its_profile_and_a_shared_claim_is_read(
    gpusharing: GpuSharing,
) -> None:
    namespace = gpusharing.namespace("e2e-dra-mig")
    mig = claim_template(
        "mig-1g",
        "mig.nvidia.com",
        selectors=[{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}}],
    )
    gpusharing.create(namespace, mig)
    sliced = admitted_when_known(gpusharing, namespace, claiming_pod("sliced", "mig-1g"))
    assert sliced["metadata"]["annotations"]["gpusharing.io/gpu-share"] == "0.1429"
    shared = {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": "shared-gpu"},
        "spec": copy.deepcopy(mig["spec"]["spec"]),
    }
    shared["spec"]["devices"]["requests"][0]["exactly"] = {"deviceClassName": "gpu.nvidia.com"}
    gpusharing.create(namespace, shared)
    user = admitted_when_known(gpusharing, namespace, claiming_pod("user", claim="shared-gpu"))
    assert user["metadata"]["annotations"]["gpusharing.io/gpu-share"] == "1"
    assert_governed(user, claims=ServerClaims(gpusharing))


def test_a_pod_whose_template_does_not_exist_is_refused_and_one_without_gpus_passes_untouched(
    gpusharing: GpuSharing,
) -> None:
    namespace = gpusharing.namespace("e2e-dra-missing")
    gpusharing.create(namespace, claim_template("nic", "rdma.example.com"))
    nic = admitted_when_known(gpusharing, namespace, claiming_pod("nic", "nic"))
    assert "gpusharing.io/gpu-share" not in (nic["metadata"].get("annotations") or {})
    with pytest.raises(ApiError) as refused:
        gpusharing.create(namespace, claiming_pod("orphan", "no-such-template"))
    assert refused.value.message.endswith(
        'admission webhook "mutate.gpusharing.io" denied the request: invalid GPU request: resource claim "gpu": '
        f"resourceClaimTemplateName=\"no-such-template\": no ResourceClaimTemplate 'no-such-template' in namespace "
        f"'{namespace}': create it before the pod"
    )


def test_the_watch_follows_a_template_deleted_and_made_again(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-dra-watch")
    gpusharing.create(namespace, claim_template("gpus", count=1, allocationMode="ExactCount"))
    assert (
        admitted_when_known(gpusharing, namespace, claiming_pod("first", "gpus"))["metadata"]["annotations"][
            "gpusharing.io/gpu-share"
        ]
        == "1"
    )
    gpusharing.rest("DELETE", f"/apis/{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates/gpus")
    gpusharing.create(namespace, claim_template("gpus", count=3, allocationMode="ExactCount"))

    def billed_three() -> bool:
        try:
            probe = gpusharing.create(namespace, claiming_pod("probe", "gpus"), dry_run=True)
        except ApiError as refused:  # the deletion heard, the new template not yet: refused until it is
            if refused.status == 422 and "no ResourceClaimTemplate 'gpus'" in refused.message:
                return False
            raise
        return bool(probe["metadata"]["annotations"]["gpusharing.io/gpu-share"] == "3")

    wait_for(billed_three, "the webhook to learn the new template")


@pytest.mark.parametrize(
    ("verb", "group", "resource", "allowed"),
    [
        ("list", "resource.k8s.io", "resourceclaimtemplates", True),
        ("watch", "resource.k8s.io", "resourceclaims", True),
        ("get", "resource.k8s.io", "resourceclaims", False),
        ("create", "resource.k8s.io", "resourceclaimtemplates", False),
        ("list", "", "pods", False),
        ("list", "", "secrets", False),
    ],
)
def test_the_webhooks_service_account_may_list_and_watch_claims_and_nothing_else(
    gpusharing: GpuSharing, verb: str, group: str, resource: str, allowed: bool
) -> None:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": WEBHOOK_USER,
            "groups": ["system:serviceaccounts", "system:serviceaccounts:gpusharing-system", "system:authenticated"],
            "resourceAttributes": {"verb": verb, "group": group, "resource": resource},
        },
    }
    answer = gpusharing.rest("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    assert answer["status"]["allowed"] is allowed
