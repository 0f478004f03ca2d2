"""What a node's GPUs are, as the API server records them: how many it offers to pods, in whole GPUs whatever the
backend advertises (what fair share divides), and their model (what a pod bound to it is billed on).

Each backend's device plugin puts its own resources in the node's allocatable; they are read the way the webhook reads
a pod's request in that dialect, and where a backend's unit says less than a GPU's worth (HAMi's `nvidia.com/gpu`
counts vGPU slots), the node counts more, never less: a GPU counted too many lets the queue release a pod that then
waits for kube-scheduler, a GPU counted too few would hold pods back from a GPU that is free.

The model is the GPU operator's product label, else the device type HAMi's device plugin registers on the node: both
are written on the Node, which no tenant can change; a pod's own annotations (HAMi's record of the device it was
given) are the tenant's to write and are not read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpusharing.decoded import as_list, as_mapping
from gpusharing.gpu.catalogue import PRODUCT_LABEL, GpuCatalogue, GpuModel
from gpusharing.gpu.dialects import ALIYUN_GPU_COUNT, NVIDIA_GPU, VCUDA_CORE
from gpusharing.gpu.mig import InvalidMigProfile, is_mig_resource, mig_profile
from gpusharing.units.quantity import QuantityError, parse_quantity

VCUDA_CORES_PER_GPU = 100  # gpu-manager's vcuda-core: a hundredth of a GPU's compute
HAMI_REGISTER = "hami.io/node-nvidia-register"  # HAMi's device plugin: each device's uuid, count, memory, cores, type
MAX_REGISTER_CHARS = 65_536  # a node of dozens of devices writes a few KiB
MAX_REGISTERED = 64
_HAMI_TYPE_PREFIX = "NVIDIA-"  # HAMi's type is the vendor's name, a dash, then NVML's


@dataclass(frozen=True)
class NodeGpus:
    """A node's GPUs: those it offers new pods, whether it has any, and their model."""

    gpus: float  # offered to new pods (0 while cordoned)
    model: GpuModel  # its GPUs' model: the product label's, HAMi's registered type's, else the catalogue's default
    known: bool  # the catalogue has the model the node names; False: it names none, or one the catalogue lacks
    named: str | None = None  # what the node names its GPUs, as written (an Event quotes it)
    has_gpus: bool = False  # it advertises GPUs at all, cordoned or not
    uid: str = ""  # the Node's metadata.uid, which an Event about it names

    @property
    def unknown_model(self) -> bool:
        """A GPU node whose pods are billed on the default model, since the catalogue cannot tell what it has."""
        return self.has_gpus and not self.known


def node_gpus(node: Mapping[str, Any], catalogue: GpuCatalogue) -> NodeGpus:
    """The node's GPUs: whole GPUs (`nvidia.com/gpu`; ACK's device plugin's `aliyun.com/gpu-count`, the label's name
    as a resource), gpu-manager's vcuda-core over 100, and each MIG slice as its share of its GPU on the node's model,
    as a pod's slice is billed. A cordoned node's count for nothing: no new pod gets them. What cannot be read counts
    nothing."""
    metadata = as_mapping(node.get("metadata"))
    named, model = _named_model(as_mapping(metadata.get("labels")), as_mapping(metadata.get("annotations")), catalogue)
    allocatable = as_mapping(as_mapping(node.get("status")).get("allocatable"))
    on = model or catalogue.default
    total = Decimal(0)
    for resource, raw in allocatable.items():
        try:
            count = parse_quantity(str(raw))
            if resource in (NVIDIA_GPU, ALIYUN_GPU_COUNT):
                total += count
            elif resource == VCUDA_CORE:
                total += count / VCUDA_CORES_PER_GPU
            elif is_mig_resource(resource):
                total += count * mig_profile(resource).share(on.mig_compute_slices, on.memory_mib)
        except (QuantityError, InvalidMigProfile):
            continue
    cordoned = as_mapping(node.get("spec")).get("unschedulable") is True
    gpus = 0.0 if cordoned else float(total)
    return NodeGpus(gpus, on, model is not None, named, total > 0, str(metadata.get("uid") or ""))


def _named_model(labels: Mapping[str, Any], annotations: Mapping[str, Any],
                 catalogue: GpuCatalogue) -> tuple[str | None, GpuModel | None]:
    """What the node names its GPUs, and the catalogue's model of that name (None: it names none the catalogue has)."""
    product = labels.get(PRODUCT_LABEL)
    if isinstance(product, str) and product:
        return product, catalogue.by_product(product)
    types = _hami_types(annotations.get(HAMI_REGISTER))
    models = {catalogue.by_name(t.removeprefix(_HAMI_TYPE_PREFIX)) for t in types}
    if len(models) != 1:  # none, or a node of mixed devices: which one a pod got is not recorded on the node
        return ", ".join(types) or None, None
    return types[0], models.pop()


def _hami_types(raw: object) -> list[str]:
    """The device types HAMi's register annotation lists: JSON (HAMi 2.5 and later) or its older
    `uuid,count,memory,cores,type,numa,healthy:` form."""
    if not isinstance(raw, str) or not raw or len(raw) > MAX_REGISTER_CHARS:
        return []
    if raw.lstrip().startswith("["):
        try:
            devices = json.loads(raw)
        except ValueError:
            return []
        found = [as_mapping(d).get("type") for d in as_list(devices)[:MAX_REGISTERED]]
    else:
        found = [fields[4] for entry in raw.split(":", MAX_REGISTERED)[:MAX_REGISTERED]
                 if len(fields := entry.split(",")) >= 7]
    return sorted({t for t in found if isinstance(t, str) and 0 < len(t) <= 128})
