"""A node's GPUs (gpusharing/gpu/capacity.py): how many, in whole GPUs whatever its backend advertises (what fair share
divides and the queue releases pods into, what the capacity ledger records), their model, from what the Node says
(what its pods are billed on), and whether it is Ready, since when, and when it was created."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from gpusharing.gpu.capacity import node_gpus
from gpusharing.gpu.catalogue import shipped_catalogue

CATALOGUE = shipped_catalogue()
UTC = dt.timezone.utc


def node(allocatable: dict[str, Any], product: str | None = None, cordoned: bool = False,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1", "uid": "node-uid", "annotations": annotations or {},
                         "labels": {"nvidia.com/gpu.product": product} if product else {}},
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", **allocatable}}}


@pytest.mark.parametrize(
    ("allocatable", "gpus"),
    [
        ({"nvidia.com/gpu": "8"}, 8.0),  # the NVIDIA device plugin, KAI
        ({"tencent.com/vcuda-core": "400", "tencent.com/vcuda-memory": "320"}, 4.0),  # gpu-manager
        ({"aliyun.com/gpu-count": "2", "aliyun.com/gpu-mem": "160"}, 2.0),  # ACK's gpushare
        ({}, 0.0),  # a node without GPUs
        ({"nvidia.com/gpu": "many"}, 0.0),  # what cannot be read counts nothing
    ],
)
def test_each_backend_s_devices_count_as_whole_gpus(allocatable: dict[str, Any], gpus: float) -> None:
    assert node_gpus(node(allocatable), CATALOGUE).gpus == gpus


def test_a_mig_slice_counts_as_its_share_of_the_node_s_model_as_a_pod_s_slice_is_billed() -> None:
    # An H200's 3g.71gb is half the GPU; on the default A100 80 GB, 7/8 (docs/dialects.md)
    h200 = node({"nvidia.com/mig-3g.71gb": "2", "nvidia.com/mig-1g.18gb": "1"}, product="NVIDIA-H200")
    assert node_gpus(h200, CATALOGUE).gpus == pytest.approx(2 * 0.5 + 1 / 7, abs=0.02)
    assert node_gpus(node({"nvidia.com/mig-3g.40gb": "2"}), CATALOGUE).gpus == 1.0
    assert node_gpus(node({"nvidia.com/mig-bad": "2", "nvidia.com/gpu": "1"}), CATALOGUE).gpus == 1.0


def test_a_cordoned_node_offers_nothing_to_new_pods_but_still_has_its_gpus() -> None:
    cordoned = node_gpus(node({"nvidia.com/gpu": "8"}, "NVIDIA-H100-80GB-HBM3", cordoned=True), CATALOGUE)
    assert (cordoned.gpus, cordoned.installed) == (0.0, 8.0)
    assert (cordoned.has_gpus, cordoned.known, cordoned.model.name) == (True, True, "NVIDIA H100 80GB HBM3")


def test_the_model_is_the_product_label_gpu_feature_discovery_writes_with_its_suffixes() -> None:
    for label in ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3-SHARED", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"):
        read = node_gpus(node({"nvidia.com/gpu": "8"}, label), CATALOGUE)
        assert (read.model.name, read.known, read.named, read.uid) == ("NVIDIA H100 80GB HBM3", True, label, "node-uid")


# HAMi's device plugin registers each device on the node, as HAMi's protocol documents (docs/developers/protocol.md).
V100_REGISTER = ("GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,10,32768,100,NVIDIA-Tesla V100-SXM2-32GB,0,true:"
                 "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,10,32768,100,NVIDIA-Tesla V100-SXM2-32GB,0,true:")
L4_REGISTER_JSON = ('[{"id":"GPU-1","count":10,"devmem":23034,"devcore":100,"type":"NVIDIA-NVIDIA L4","numa":0,'
                    '"health":true},{"id":"GPU-2","count":10,"devmem":23034,"devcore":100,"type":"NVIDIA-NVIDIA L4",'
                    '"numa":0,"health":true}]')


@pytest.mark.parametrize(("register", "model"),
                         [(V100_REGISTER, "Tesla V100-SXM2-32GB"), (L4_REGISTER_JSON, "NVIDIA L4")])
def test_without_a_product_label_the_device_type_hami_registers_names_the_model(register: str, model: str) -> None:
    read = node_gpus(node({"nvidia.com/gpu": "20"}, annotations={"hami.io/node-nvidia-register": register}), CATALOGUE)
    assert (read.model.name, read.known) == (model, True)

MIXED_REGISTER = V100_REGISTER.replace("V100-SXM2-32GB,0,true:GPU-0f", "T4,0,true:GPU-0f")


@pytest.mark.parametrize(
    ("product", "annotations", "named"),
    [
        (None, None, None),  # no label, no register
        ("NVIDIA-B999", None, "NVIDIA-B999"),  # a model the catalogue does not have
        (None, {"hami.io/node-nvidia-register": MIXED_REGISTER},
         "NVIDIA-Tesla T4, NVIDIA-Tesla V100-SXM2-32GB"),  # mixed devices: which one a pod got is not on the node
        (None, {"hami.io/node-nvidia-register": "[not json"}, None),
        (None, {"hami.io/node-nvidia-register": "x" * 70_000}, None),  # beyond what any node writes: not read
    ],
)
def test_a_gpu_node_that_names_no_model_the_catalogue_has_is_read_on_the_default_and_says_so(
    product: str | None, annotations: dict[str, str] | None, named: str | None
) -> None:
    read = node_gpus(node({"nvidia.com/gpu": "8"}, product, annotations=annotations), CATALOGUE)
    assert (read.model, read.known, read.named, read.unknown_model) == (CATALOGUE.default, False, named, True)
    assert not node_gpus(node({"cpu": "8"}), CATALOGUE).unknown_model  # a node without GPUs is nothing to flag


@pytest.mark.parametrize(
    ("register", "allocatable", "gpus"),
    [
        (V100_REGISTER, {"nvidia.com/gpu": "20"}, 2.0),  # 10 vGPU slots a device: two devices
        (L4_REGISTER_JSON, {"nvidia.com/gpu": "20", "nvidia.com/gpumem": "46068"}, 2.0),
        (L4_REGISTER_JSON.replace('"health":true}]', '"health":false}]'), {"nvidia.com/gpu": "20"}, 1.0),  # unhealthy
        (V100_REGISTER.replace("0,true:GPU-0f", "0,false:GPU-0f"), {"nvidia.com/gpu": "20"}, 1.0),
        (V100_REGISTER, {"nvidia.com/gpu": "0"}, 0.0),  # its device plugin gone: never more than it advertises
        # No register (the simulator's HAMi nodes): its gpucores, a hundred a device
        (None, {"nvidia.com/gpu": "80", "nvidia.com/gpumem": "655360", "nvidia.com/gpucores": "800"}, 8.0),
        (None, {"nvidia.com/gpu": "80", "nvidia.com/gpucores": "lots"}, 0.0),
    ],
)
def test_a_hami_node_counts_its_devices_not_its_vgpu_slots(register: str | None, allocatable: dict[str, Any],
                                                           gpus: float) -> None:
    annotations = {"hami.io/node-nvidia-register": register} if register else None
    read = node_gpus(node(allocatable, annotations=annotations), CATALOGUE)
    assert (read.gpus, read.installed, read.has_gpus) == (gpus, gpus, gpus > 0)


def with_status(obj: dict[str, Any], created: str | None, *conditions: dict[str, str]) -> dict[str, Any]:
    if created is not None:
        obj["metadata"]["creationTimestamp"] = created
    obj["status"]["conditions"] = list(conditions)
    return obj


def test_its_ready_condition_and_creation_are_read_as_the_api_server_records_them() -> None:
    pressure = {"type": "MemoryPressure", "status": "False", "lastTransitionTime": "2026-11-25T09:00:00Z"}
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-25T09:58:31Z"}
    read = node_gpus(with_status(node({"nvidia.com/gpu": "8"}), "2026-11-25T09:57:02Z", pressure, ready), CATALOGUE)
    assert (read.ready, read.ready_changed_at, read.created_at) == (
        True, dt.datetime(2026, 11, 25, 9, 58, 31, tzinfo=UTC), dt.datetime(2026, 11, 25, 9, 57, 2, tzinfo=UTC))


@pytest.mark.parametrize("conditions", [
    [{"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-25T10:00:00Z"}],
    [{"type": "Ready", "status": "Unknown", "lastTransitionTime": "2026-11-25T10:00:00Z"}],  # its kubelet unheard
    [],  # a node whose kubelet has not posted its status yet
])
def test_a_node_is_ready_only_when_its_ready_condition_says_true(conditions: list[dict[str, str]]) -> None:
    read = node_gpus(with_status(node({"nvidia.com/gpu": "8"}), None, *conditions), CATALOGUE)
    assert not read.ready and read.installed == 8.0
    assert read.ready_changed_at == (dt.datetime(2026, 11, 25, 10, tzinfo=UTC) if conditions else None)
