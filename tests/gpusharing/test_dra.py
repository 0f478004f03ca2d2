"""Pods that get GPUs through resource claims (resource.k8s.io/v1), billed by the devices they claim.

The claims are the NVIDIA DRA driver's demo specs (k8s-dra-driver-gpu demo/specs/quickstart/v1/*.yaml) and the
counting rules of KAI Scheduler (pkg/common/resources/dra.go countGPUDevicesFromClaim: ExactCount's count, 1 when
unset; a GPU DeviceClass by name).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from demo.apiserver import EXAMPLES, api_server_pod
from gpusharing.gpu.dra import ClaimSource, ClaimSpec, ClaimUnknown, claim_spec, no_claims
from gpusharing.gpu.request import GpuRequestSettings, InvalidGpuRequest, parse_gpu_request
from gpusharing.units.share import format_share
from tests.gpusharing.test_request import container, pod


def request(name: str, device_class: str = "gpu.nvidia.com", **exactly: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class, **exactly}}


def template(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}}


TEMPLATES = {
    # gpu-test1.yaml: one GPU
    "single-gpu": template(request("gpu")),
    # gpu-test-mps.yaml: one GPU shared by the pod's two containers under MPS
    "shared-gpu": {
        **template(request("mps-gpu")),
        "config": [{"requests": ["mps-gpu"], "opaque": {"driver": "gpu.nvidia.com"}}],
    },
    "two-gpus": template(request("gpus", count=2, allocationMode="ExactCount")),
    "all-gpus": template(request("gpus", allocationMode="All")),
    "mig-1g": template(
        request(
            "mig",
            "mig.nvidia.com",
            selectors=[{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}}],
        )
    ),
    "mig-any": template(request("mig", "mig.nvidia.com")),
    "mig-bad": template(
        request(
            "mig",
            "mig.nvidia.com",
            selectors=[{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '9g.10gb'"}}],
        )
    ),
    "nic": template(request("nic", "rdma.example.com")),
    "gpu-or-mig": template(
        {
            "name": "either",
            "firstAvailable": [
                {
                    "name": "mig",
                    "deviceClassName": "mig.nvidia.com",
                    "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"}}],
                },
                {"name": "gpu", "deviceClassName": "gpu.nvidia.com"},
            ],
        }
    ),
    "gpu-and-nic": template(request("gpu"), request("nic", "rdma.example.com")),
}


def lookup(source: ClaimSource, namespace: str, name: str) -> ClaimSpec:
    if namespace != "ml-team" or name not in TEMPLATES:
        raise ClaimUnknown(f"no {source} {name!r} in namespace {namespace!r}: create it before the pod")
    return claim_spec(TEMPLATES[name])


def claiming(*templates: str, containers: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    p = pod(*(containers or (container("ctr", resources={"claims": [{"name": "c0"}]}),)))
    p["spec"]["resourceClaims"] = [{"name": f"c{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]
    return p


CLAIMS = [
    ("gpu-test1: one GPU", ("single-gpu",), "1", 81920),
    ("gpu-test-mps: one GPU for two containers", ("shared-gpu",), "1", 81920),
    ("ExactCount 2", ("two-gpus",), "2", 2 * 81920),
    ("allocationMode All: a node's GPUs (GPUSHARING_DRA_DEVICES_PER_NODE)", ("all-gpus",), "8", 8 * 81920),
    ("a MIG device by its profile", ("mig-1g",), "0.1429", 10240),
    ("a MIG device of any profile: a whole GPU", ("mig-any",), "1", 81920),
    ("firstAvailable: the costlier alternative", ("gpu-or-mig",), "1", 81920),
    ("no GPU device class: no GPU", ("nic",), None, None),
    ("a GPU beside a NIC", ("gpu-and-nic",), "1", 81920),
    ("two claims add up", ("single-gpu", "two-gpus"), "3", 3 * 81920),
]


@pytest.mark.parametrize(("name", "templates", "share", "memory"), CLAIMS, ids=[row[0] for row in CLAIMS])
def test_a_pod_is_billed_by_the_gpus_its_claims_ask_for(
    name: str, templates: tuple[str, ...], share: str | None, memory: int | None
) -> None:
    gpu = parse_gpu_request(claiming(*templates), claims=lookup)
    if share is None:
        assert gpu is None
        return
    assert gpu is not None and str(gpu.dialect) == "dra"
    assert (format_share(gpu.share), gpu.memory_mib) == (share, memory)


def test_claims_add_to_a_container_dialect_and_last_the_pods_life() -> None:
    p = claiming("single-gpu", containers=(container("app", limits={"nvidia.com/gpu": "1"}),))
    p["spec"]["initContainers"] = [container("warmup", limits={"nvidia.com/gpu": "3"})]
    gpu = parse_gpu_request(p, claims=lookup)
    assert gpu is not None and str(gpu.dialect) == "whole-gpu"
    assert gpu.share == 4  # max(3 init, 1 regular) + 1 claimed for the whole life of the pod
    assert gpu.to_dict()["claims"] == [
        {
            "claim": "c0",
            "request": "gpu",
            "deviceClass": "gpu.nvidia.com",
            "devices": 1,
            "memoryMiB": 81920,
            "share": "1",
        }
    ]


def test_the_gpu_device_classes_are_a_setting() -> None:
    settings = GpuRequestSettings(dra_gpu_classes=frozenset({"rdma.example.com"}))
    gpu = parse_gpu_request(claiming("nic"), settings, lookup)
    assert gpu is not None and gpu.share == 1
    assert parse_gpu_request(claiming("single-gpu"), settings, lookup) is None


REFUSED = [
    (
        "a template that does not exist",
        claiming("missing"),
        'resource claim "c0": resourceClaimTemplateName="missing": no ResourceClaimTemplate \'missing\' in namespace '
        '\'ml-team\': create it before the pod',
    ),
    (
        "a MIG profile that is not one",
        claiming("mig-bad"),
        "resource claim \"c0\": request 'mig'=\"9g.10gb\": is not a MIG profile",
    ),
]


@pytest.mark.parametrize(("name", "p", "message"), REFUSED, ids=[row[0] for row in REFUSED])
def test_claims_that_cannot_be_read_are_refused(name: str, p: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidGpuRequest) as refused:
        parse_gpu_request(p, claims=lookup)
    assert str(refused.value).startswith(message)


def test_without_an_index_a_pod_with_claims_is_refused_saying_why() -> None:
    with pytest.raises(InvalidGpuRequest) as refused:
        parse_gpu_request(claiming("single-gpu"), claims=no_claims)
    assert "the webhook reads no resource claims: it has no access to the Kubernetes API" in str(refused.value)


def test_a_shared_resource_claim_is_read_too() -> None:
    p = pod(container("ctr"))
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "single-gpu"}]
    gpu = parse_gpu_request(p, claims=lookup)
    assert gpu is not None and gpu.share == 1


def test_claim_specs_keep_what_billing_needs() -> None:
    spec = claim_spec(TEMPLATES["gpu-or-mig"])
    (only,) = spec.requests
    assert [(a.device_class, a.count, a.mig_profile) for a in only.alternatives] == [
        ("mig.nvidia.com", 1, "3g.40gb"),
        ("gpu.nvidia.com", 1, None),
    ]
    assert claim_spec({"devices": "nonsense"}).requests == ()


def test_the_dra_example_is_billed_one_gpu() -> None:
    template = yaml.safe_load((EXAMPLES / "dra" / "gpu-claim-template.yaml").read_text())
    pod_manifest = yaml.safe_load((EXAMPLES / "dra" / "gpu-pod.yaml").read_text())

    def example_lookup(source: ClaimSource, namespace: str, name: str) -> ClaimSpec:
        assert (source, name) == (ClaimSource.TEMPLATE, template["metadata"]["name"])
        return claim_spec(template["spec"]["spec"])

    gpu = parse_gpu_request(api_server_pod(pod_manifest), claims=example_lookup)
    assert gpu is not None and (str(gpu.dialect), gpu.share, gpu.memory_mib) == ("dra", 1, 81920)
