"""A node's GPUs in whole GPUs (gpusharing/gpu/capacity.py), whatever its backend advertises: what fair share divides
and the queue releases pods into."""

from __future__ import annotations

from typing import Any

import pytest

from gpusharing.gpu.capacity import node_gpus
from gpusharing.gpu.catalogue import shipped_catalogue

CATALOGUE = shipped_catalogue()


def node(allocatable: dict[str, Any], product: str | None = None, cordoned: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.product": product} if product else {}},
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
    assert node_gpus(node(allocatable), CATALOGUE) == gpus


def test_a_mig_slice_counts_as_its_share_of_the_node_s_model_as_a_pod_s_slice_is_billed() -> None:
    # An H200's 3g.71gb is half the GPU; on the default A100 80 GB, 7/8 (docs/dialects.md)
    h200 = node({"nvidia.com/mig-3g.71gb": "2", "nvidia.com/mig-1g.18gb": "1"}, product="NVIDIA-H200")
    assert node_gpus(h200, CATALOGUE) == pytest.approx(2 * 0.5 + 1 / 7, abs=0.02)
    assert node_gpus(node({"nvidia.com/mig-3g.40gb": "2"}), CATALOGUE) == 1.0
    assert node_gpus(node({"nvidia.com/mig-bad": "2", "nvidia.com/gpu": "1"}), CATALOGUE) == 1.0


def test_a_cordoned_node_offers_nothing_to_new_pods() -> None:
    assert node_gpus(node({"nvidia.com/gpu": "8"}, cordoned=True), CATALOGUE) == 0.0
