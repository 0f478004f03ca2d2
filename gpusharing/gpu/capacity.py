"""What a node's GPUs are, as the API server records them: how many it has and how many it offers to pods, in whole
GPUs whatever the backend advertises (what fair share divides and the capacity ledger records), their model (what a pod
bound to it is billed on), whether it is Ready and since when, and when it was created.

Each backend's device plugin puts its own resources in the node's allocatable; they are read the way the webhook reads
a pod's request in that dialect. HAMi's `nvidia.com/gpu` counts vGPU slots (10 a device by default), not GPUs: a HAMi
node is counted by the devices its device plugin registers on it, else (no register) by its `nvidia.com/gpucores`.

The model is the GPU operator's product label, else the device type HAMi's device plugin registers on the node: both
are written on the Node, which no tenant can change; a pod's own annotations (HAMi's record of the device it was
given) are the tenant's to write and are not read.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpusharing.decoded import as_list, as_mapping, instant
from gpusharing.gpu.catalogue import PRODUCT_LABEL, GpuCatalogue, GpuModel
from gpusharing.gpu.dialects import ALIYUN_GPU_COUNT, NVIDIA_GPU, VCUDA_CORE, HamiSettings
from gpusharing.gpu.mig import InvalidMigProfile, is_mig_resource, mig_profile
from gpusharing.units.quantity import QuantityError, parse_quantity

VCUDA_CORES_PER_GPU = 100  # gpu-manager's vcuda-core: a hundredth of a GPU's compute
HAMI_CORES = HamiSettings().cores  # HAMi's gpucores: a hundredth of a device's compute
HAMI_REGISTER = "hami.io/node-nvidia-register"  # HAMi's device plugin: each device's uuid, count, memory, cores, type
MAX_REGISTER_CHARS = 65_536  # a node of dozens of devices writes a few KiB
MAX_REGISTERED = 64
_HAMI_TYPE_PREFIX = "NVIDIA-"  # HAMi's type is the vendor's name, a dash, then NVML's


@dataclass(frozen=True)
class NodeGpus:
    """A node's GPUs: those it offers new pods, those it has, their model; whether it is Ready, and since when."""

    gpus: float  # offered to new pods (0 while cordoned)
    model: GpuModel  # its GPUs' model: the product label's, HAMi's registered type's, else the catalogue's default
    known: bool  # the catalogue has the model the node names; False: it names none, or one the catalogue lacks
    named: str | None = None  # what the node names its GPUs, as written (an Event quotes it)
    has_gpus: bool = False  # it advertises GPUs at all, cordoned or not
    uid: str = ""  # the Node's metadata.uid, which an Event about it names
    installed: float = 0.0  # its GPUs, cordoned or not (what the capacity ledger records)
    ready: bool = False  # its Ready condition's status is True (False, Unknown or no condition: not Ready)
    ready_changed_at: dt.datetime | None = None  # the Ready condition's lastTransitionTime: so since then
    created_at: dt.datetime | None = None  # its metadata.creationTimestamp

    @property
    def unknown_model(self) -> bool:
        """A GPU node whose pods are billed on the default model, since the catalogue cannot tell what it has."""
        return self.has_gpus and not self.known


def node_gpus(node: Mapping[str, Any], catalogue: GpuCatalogue) -> NodeGpus:
    """The node's GPUs: whole GPUs (`nvidia.com/gpu`, HAMi's counted by device; ACK's device plugin's
    `aliyun.com/gpu-count`, the label's name as a resource), gpu-manager's vcuda-core over 100, and each MIG slice as
    its share of its GPU on the node's model, as a pod's slice is billed. A cordoned node's are offered to no new pod.
    What cannot be read counts nothing."""
    metadata = as_mapping(node.get("metadata"))
    registered = _hami_devices(as_mapping(metadata.get("annotations")).get(HAMI_REGISTER))
    named, model = _named_model(as_mapping(metadata.get("labels")), registered, catalogue)
    status = as_mapping(node.get("status"))
    allocatable = as_mapping(status.get("allocatable"))
    on = model or catalogue.default
    hami = _hami_gpus(registered, allocatable)
    total = Decimal(0)
    for resource, raw in allocatable.items():
        try:
            count = parse_quantity(str(raw))
            if resource == NVIDIA_GPU:
                total += count if hami is None else min(count, hami)  # never more than it advertises
            elif resource == ALIYUN_GPU_COUNT:
                total += count
            elif resource == VCUDA_CORE:
                total += count / VCUDA_CORES_PER_GPU
            elif is_mig_resource(resource):
                total += count * mig_profile(resource).share(on.mig_compute_slices, on.memory_mib)
        except (QuantityError, InvalidMigProfile):
            continue
    cordoned = as_mapping(node.get("spec")).get("unschedulable") is True
    ready = next((as_mapping(c) for c in as_list(status.get("conditions")) if as_mapping(c).get("type") == "Ready"), {})
    return NodeGpus(
        0.0 if cordoned else float(total), on, model is not None, named, total > 0, str(metadata.get("uid") or ""),
        float(total), ready.get("status") == "True", instant(ready.get("lastTransitionTime")),
        instant(metadata.get("creationTimestamp")),
    )


def _named_model(labels: Mapping[str, Any], registered: list[tuple[str, bool]],
                 catalogue: GpuCatalogue) -> tuple[str | None, GpuModel | None]:
    """What the node names its GPUs, and the catalogue's model of that name (None: it names none the catalogue has)."""
    product = labels.get(PRODUCT_LABEL)
    if isinstance(product, str) and product:
        return product, catalogue.by_product(product)
    types = sorted({kind for kind, _ in registered})
    models = {catalogue.by_name(t.removeprefix(_HAMI_TYPE_PREFIX)) for t in types}
    if len(models) != 1:  # none, or a node of mixed devices: which one a pod got is not recorded on the node
        return ", ".join(types) or None, None
    return types[0], models.pop()


def _hami_gpus(registered: list[tuple[str, bool]], allocatable: Mapping[str, Any]) -> Decimal | None:
    """A HAMi node's GPUs, since its `nvidia.com/gpu` counts vGPU slots: its healthy registered devices, else (no
    register) its gpucores over 100; None: not a HAMi node."""
    if registered:
        return Decimal(sum(healthy for _, healthy in registered))
    if HAMI_CORES not in allocatable:
        return None
    try:
        return parse_quantity(str(allocatable[HAMI_CORES])) / 100
    except QuantityError:
        return Decimal(0)


def _hami_devices(raw: object) -> list[tuple[str, bool]]:
    """The devices HAMi's register annotation lists, each its type and whether it is healthy: JSON (HAMi 2.5 and
    later) or its older `uuid,count,memory,cores,type,numa,healthy:` form."""
    if not isinstance(raw, str) or not raw or len(raw) > MAX_REGISTER_CHARS:
        return []
    if raw.lstrip().startswith("["):
        try:
            devices = json.loads(raw)
        except ValueError:
            return []
        listed = map(as_mapping, as_list(devices)[:MAX_REGISTERED])
        found = [(device.get("type"), device.get("health") is not False) for device in listed]
    else:
        found = [(fields[4], fields[6].strip() != "false") for entry in raw.split(":", MAX_REGISTERED)[:MAX_REGISTERED]
                 if len(fields := entry.split(",")) >= 7]
    return [(kind, healthy) for kind, healthy in found if isinstance(kind, str) and 0 < len(kind) <= 128]
