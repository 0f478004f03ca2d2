"""The GPUs a node offers to pods, in whole GPUs whatever the backend advertises: what fair share divides. Each
backend's device plugin puts its own resources in the node's allocatable; they are read the way the webhook reads a
pod's request in that dialect, and where a backend's unit says less than a GPU's worth (HAMi's `nvidia.com/gpu`
counts vGPU slots), the node counts more, never less: a GPU counted too many lets the queue release a pod that then
waits for kube-scheduler, a GPU counted too few would hold pods back from a GPU that is free."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from gpusharing.decoded import as_mapping
from gpusharing.gpu.catalogue import PRODUCT_LABEL, GpuCatalogue
from gpusharing.gpu.dialects import ALIYUN_GPU_COUNT, NVIDIA_GPU, VCUDA_CORE
from gpusharing.gpu.mig import InvalidMigProfile, is_mig_resource, mig_profile
from gpusharing.units.quantity import QuantityError, parse_quantity

VCUDA_CORES_PER_GPU = 100  # gpu-manager's vcuda-core: a hundredth of a GPU's compute


def node_gpus(node: Mapping[str, Any], catalogue: GpuCatalogue) -> float:
    """The GPUs `node` offers to new pods: whole GPUs (`nvidia.com/gpu`; ACK's device plugin's `aliyun.com/gpu-count`,
    the label's name as a resource), gpu-manager's
    vcuda-core over 100, and each MIG slice as its share of its GPU on the node's model (its `nvidia.com/gpu.product`,
    else the catalogue's default), as a pod's slice is billed. A cordoned node's count for nothing: no new pod gets
    them. What cannot be read counts nothing."""
    if as_mapping(node.get("spec")).get("unschedulable") is True:
        return 0.0
    allocatable = as_mapping(as_mapping(node.get("status")).get("allocatable"))
    product = as_mapping(as_mapping(node.get("metadata")).get("labels")).get(PRODUCT_LABEL)
    model = (catalogue.by_product(product) if isinstance(product, str) else None) or catalogue.default
    total = Decimal(0)
    for resource, raw in allocatable.items():
        try:
            count = parse_quantity(str(raw))
            if resource in (NVIDIA_GPU, ALIYUN_GPU_COUNT):
                total += count
            elif resource == VCUDA_CORE:
                total += count / VCUDA_CORES_PER_GPU
            elif is_mig_resource(resource):
                total += count * mig_profile(resource).share(model.mig_compute_slices, model.memory_mib)
        except (QuantityError, InvalidMigProfile):
            continue
    return float(total)
