"""Sharing dialects read as their backends read them, into what every container asks of each device it gets: every
dialect's keys, and the readers of gpu-manager, HAMi and Aliyun gpushare (NVIDIA's own are in gpusharing.gpu.nvidia).

What a device is (its model, its memory) is not known here: a memory size stays in MiB or a fraction until
`gpusharing.gpu.request` prices the asks on the pod's GPU model. Each rule cites the backend code it follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpusharing.compat import StrEnum
from gpusharing.decoded import as_mapping
from gpusharing.gpu.fields import TOO_MANY_DEVICES, Container, ContainerRole, Errors, percent, whole
from gpusharing.gpu.fields import devices as read_devices
from gpusharing.gpu.mig import MigSlice, is_mig_resource
from gpusharing.units.share import MAX_GPU_SHARE

VCUDA_CORE = "tencent.com/vcuda-core"
VCUDA_MEMORY = "tencent.com/vcuda-memory"
VCUDA_CORE_LIMIT = "tencent.com/vcuda-core-limit"  # a pod annotation
VCUDA_MEMORY_UNIT_MIB = 256
NVIDIA_GPU = "nvidia.com/gpu"
HAMI_VGPU_MODE = "nvidia.com/vgpu-mode"
ALIYUN_MEMORY = "aliyun.com/gpu-mem"
ALIYUN_CORE = "aliyun.com/gpu-core.percentage"
ALIYUN_GPU_COUNT = "aliyun.com/gpu-count"  # a pod label: ACK's multi-GPU sharing
KAI_FRACTION = "gpu-fraction"
KAI_MEMORY = "gpu-memory"
KAI_NUM_DEVICES = "gpu-fraction-num-devices"
KAI_CONTAINER_NAME = "gpu-fraction-container-name"
KAI_CONTAINER_TYPE = "gpu-fraction-container-type"  # KAI v0.10.0 to v0.10.1 only
KAI_MPS = "mps"
KAI_ANNOTATIONS = (KAI_FRACTION, KAI_MEMORY, KAI_NUM_DEVICES, KAI_CONTAINER_NAME, KAI_CONTAINER_TYPE, KAI_MPS)
GPU_MANAGER_KEYS = (VCUDA_CORE, VCUDA_MEMORY)
ALIYUN_KEYS = (ALIYUN_MEMORY, ALIYUN_CORE)
DEFAULT_SCHEDULER = "default-scheduler"


class Dialect(StrEnum):
    GPU_MANAGER = "gpu-manager"
    HAMI = "hami"
    ALIYUN_GPUSHARE = "aliyun-gpushare"
    KAI = "kai"
    WHOLE_GPU = "whole-gpu"
    MIG = "mig"
    DRA = "dra"


@dataclass(frozen=True)
class HamiSettings:
    """A HAMi installation's own configuration (its device ConfigMap, `nvidia:` section)."""

    count: str = NVIDIA_GPU  # resourceCountName
    memory: str = "nvidia.com/gpumem"  # resourceMemoryName
    memory_percentage: str = "nvidia.com/gpumem-percentage"  # resourceMemoryPercentageName
    cores: str = "nvidia.com/gpucores"  # resourceCoreName
    memory_factor: int = 1  # memoryFactor: the memory resource counts this many MiB
    default_memory_mib: int = 0  # defaultMemory: a device's memory when none is asked for; 0: the whole device
    scheduler_name: str = "hami-scheduler"  # schedulerName: the pods HAMi's webhook takes

    @property
    def sharing_keys(self) -> tuple[str, ...]:
        return (self.memory, self.memory_percentage, self.cores)


@dataclass(frozen=True)
class Source:
    """Where a memory size was given, so that a refusal can name it."""

    subject: str
    key: str
    raw: str | None


@dataclass(frozen=True)
class DeviceAsk:
    """What a container asks of each device it gets, before the device's model is known."""

    compute: Decimal | None  # of the device; None: as much as its memory share (gpushare shares compute)
    memory_mib: int | None = None  # in MiB, which must fit the device
    memory_fraction: Decimal | None = None  # of the device's memory; neither: the whole device's memory
    mig: MigSlice | None = None  # a MIG slice of the NVIDIA device plugin
    dynamic_mig: bool = False  # HAMi carves a MIG slice that holds the memory asked for
    mig_only: bool = False  # ... and never gives a shared device instead
    source: Source | None = None


@dataclass(frozen=True)
class ContainerAsk:
    """What one container asks of each of `devices` devices, in one dialect."""

    container: Container
    devices: int
    ask: DeviceAsk
    compute_limit: Decimal | None = None  # gpu-manager lets a fraction burst up to this, unbilled


@dataclass
class DialectReading:
    """What a dialect's reader found in a pod: each container's asks, the warnings to give, and demands on the pod as
    a whole."""

    asks: list[ContainerAsk] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    pod_demands: list[tuple[int, Source]] = field(default_factory=list)  # memory one device must hold, pod-wide
    mps: bool = False


def dialect_of_key(key: str, hami: HamiSettings) -> Dialect | None:
    """The dialect a resource key belongs to; None for nvidia.com/gpu, which is HAMi's in a HAMi pod."""
    if key in GPU_MANAGER_KEYS:
        return Dialect.GPU_MANAGER
    if key in hami.sharing_keys or (key == hami.count and key != NVIDIA_GPU):
        return Dialect.HAMI
    if key in ALIYUN_KEYS:
        return Dialect.ALIYUN_GPUSHARE
    if is_mig_resource(key):
        return Dialect.MIG
    return None


def is_gpu_key(key: str, hami: HamiSettings) -> bool:
    return key in (NVIDIA_GPU, hami.count) or dialect_of_key(key, hami) is not None


# ---- tkestack gpu-manager (gpu-admission pkg/util/util.go, gpu-manager pkg/services/virtual-manager) ---------------


def read_gpu_manager(pod: Mapping[str, Any], containers: list[Container], errors: Errors) -> DialectReading:
    """The pod's asks in tkestack gpu-manager's vcuda resources, as gpu-admission reads them; refusals go to
    `errors`."""
    reading = DialectReading()
    limit = _vcuda_core_limit(pod, errors, reading.warnings)
    for c in containers:
        if c.values:
            ask = _gpu_manager_container(c, errors, limit)
            if ask is not None:
                reading.asks.append(ask)
    return reading


def _vcuda_core_limit(pod: Mapping[str, Any], errors: Errors, warnings: list[str]) -> Decimal | None:
    """gpu-manager's soft limit: a fraction may use up to this percent of the device when it is free."""
    raw = _annotations(pod).get(VCUDA_CORE_LIMIT)
    if raw is None:
        return None
    # gpu-manager reads it with strconv.Atoi and cannot start the container otherwise.
    if not isinstance(raw, str) or not raw.strip().isdigit() or len(raw.strip()) > 9:
        errors.add(
            "annotation",
            VCUDA_CORE_LIMIT,
            raw,
            "must be a whole percentage: gpu-manager cannot start the pod's containers otherwise",
        )
        return None
    value = int(raw.strip())
    if value > 100:
        warnings.append(f"annotation {VCUDA_CORE_LIMIT}={value} is more than 100: gpu-manager caps it at 100")
    return percent(min(value, 100))


def _gpu_manager_container(c: Container, errors: Errors, limit: Decimal | None) -> ContainerAsk | None:
    core_raw, memory_raw = c.values.get(VCUDA_CORE), c.values.get(VCUDA_MEMORY)
    before = len(errors)
    units = whole(errors, c.subject, VCUDA_MEMORY, memory_raw, 0, None, "must be a whole number of 256 MiB units")
    core = whole(errors, c.subject, VCUDA_CORE, core_raw, 0, None,
                 "must be a whole number: 1 to 99 (percent of one GPU) or a multiple of 100 (whole GPUs)")
    if len(errors) > before:
        return None
    # gpu-admission: a container asks for a GPU when vcuda-core > 0 (and, below 100, vcuda-memory > 0); 0 is none.
    if not core:
        if units:
            errors.add(c.subject, VCUDA_MEMORY, memory_raw,
                       f"needs {VCUDA_CORE} above 0: gpu-manager cannot give GPU memory without GPU compute")
        return None
    if core > 100 * MAX_GPU_SHARE:
        errors.add(c.subject, VCUDA_CORE, core_raw, f"asks for {core / 100:g} GPUs, {TOO_MANY_DEVICES}")
        return None
    if core >= 100:
        if core % 100:
            errors.add(
                c.subject, VCUDA_CORE, core_raw, "above 99 must be a multiple of 100 (whole GPUs): use 100, 200, ..."
            )
            return None
        return ContainerAsk(c, core // 100, DeviceAsk(Decimal(1)))
    if not units:
        errors.add(
            c.subject,
            VCUDA_CORE,
            core_raw,
            f"a fraction of a GPU needs {VCUDA_MEMORY} too (units of {VCUDA_MEMORY_UNIT_MIB} MiB)",
        )
        return None
    memory = DeviceAsk(
        percent(core), memory_mib=units * VCUDA_MEMORY_UNIT_MIB, source=Source(c.subject, VCUDA_MEMORY, memory_raw)
    )
    return ContainerAsk(c, 1, memory, compute_limit=limit)


# ---- HAMi (pkg/scheduler/webhook.go, pkg/device/nvidia/device.go) --------------------------------------------------


def read_hami(
    pod: Mapping[str, Any], containers: list[Container], hami: HamiSettings, errors: Errors
) -> DialectReading:
    """The pod's asks in HAMi's resources (named as `hami` configures them), as HAMi's scheduler and webhook read
    them; refusals go to `errors`."""
    reading = DialectReading()
    mode = _annotations(pod).get(HAMI_VGPU_MODE)
    modes = str(mode) if mode is not None else ""
    dynamic_mig = "mig" in modes
    mig_only = dynamic_mig and "hami-core" not in modes and "mps" not in modes
    for c in containers:
        if c.values:
            ask = _hami_container(c, hami, errors, reading.warnings, dynamic_mig, mig_only)
            if ask is not None:
                reading.asks.append(ask)
    if reading.asks:
        _hami_admission(pod, containers, hami, errors)
    return reading


def _hami_admission(pod: Mapping[str, Any], containers: list[Container], hami: HamiSettings, errors: Errors) -> None:
    """What HAMi's admission webhook refuses of a GPU pod it takes (the default scheduler's pods and its own)."""
    spec = as_mapping(pod.get("spec"))
    if spec.get("schedulerName") not in (None, "", DEFAULT_SCHEDULER, hami.scheduler_name):
        return
    privileged = next((c for c in containers if c.privileged), None)
    if privileged is not None:
        errors.add(privileged.subject, "securityContext.privileged", "true",
                   "HAMi refuses a GPU pod with a privileged container (it would see every GPU of the node)")
    node = spec.get("nodeName")
    if isinstance(node, str) and node:
        errors.add("pod", "spec.nodeName", node,
                   "HAMi refuses a GPU pod that is already bound to a node: its scheduler must choose the devices")


def _hami_container(
    c: Container, hami: HamiSettings, errors: Errors, warnings: list[str], dynamic_mig: bool, mig_only: bool
) -> ContainerAsk | None:
    before = len(errors)
    sharing = [key for key in hami.sharing_keys if key in c.values]
    count = read_devices(
        errors, c.subject, hami.count, c.values.get(hami.count), 0, "must be a whole number of devices"
    )
    memory = whole(
        errors, c.subject, hami.memory, c.values.get(hami.memory), 0, None, "must be a whole number of MiB per device"
    )
    percentage = whole(errors, c.subject, hami.memory_percentage, c.values.get(hami.memory_percentage), 0, 100,
                       "must be a whole percentage of each device's memory, 0 to 100")
    cores = whole(
        errors,
        c.subject,
        hami.cores,
        c.values.get(hami.cores),
        0,
        None,
        "must be a whole percentage of each device's compute",
    )
    if len(errors) > before:
        return None
    if count is None:
        count = 1 if sharing else 0  # HAMi gives one device (defaultGPUNum) when only memory or cores are asked for
    if count == 0:
        return None  # HAMi allocates nothing for 0 devices, whatever else is set
    if cores is not None and cores > 100:
        warnings.append(
            f"{c.subject}: {hami.cores}={cores} is more than 100: HAMi grants 100 (the whole device's compute)"
        )
        cores = 100
    # 0 means "not set" for memory and percentage (HAMi reads 0 MiB as no limit); memory in MiB wins over a percentage.
    if memory and percentage:
        warnings.append(f"{c.subject}: {hami.memory_percentage} is ignored: HAMi uses {hami.memory} when both are set")
    if memory:
        ask = DeviceAsk(
            None, memory_mib=memory * hami.memory_factor, source=Source(c.subject, hami.memory, c.values[hami.memory])
        )
    elif percentage:
        ask = DeviceAsk(None, memory_fraction=percent(percentage))
    elif hami.default_memory_mib:
        ask = DeviceAsk(
            None,
            memory_mib=hami.default_memory_mib,
            source=Source(c.subject, "defaultMemory", str(hami.default_memory_mib)),
        )
    else:
        ask = DeviceAsk(None)
    # HAMi does not limit compute when gpucores is unset or 0: the pod may use the whole device.
    compute = percent(cores) if cores else Decimal(1)
    return ContainerAsk(
        c, count, DeviceAsk(compute, ask.memory_mib, ask.memory_fraction, None, dynamic_mig, mig_only, ask.source)
    )


# ---- Aliyun gpushare (gpushare-scheduler-extender pkg/utils/pod.go, pkg/cache/nodeinfo.go) and ACK --------------


def read_aliyun(pod: Mapping[str, Any], containers: list[Container], unit_mib: int, errors: Errors) -> DialectReading:
    """The pod's asks in Aliyun gpushare's resources (memory in units of `unit_mib` MiB), as gpushare's extender and
    ACK read them; refusals go to `errors`."""
    reading = DialectReading()
    count_raw = as_mapping(as_mapping(pod.get("metadata")).get("labels")).get(ALIYUN_GPU_COUNT)
    cards = (
        whole(
            errors, "label", ALIYUN_GPU_COUNT, count_raw, 1, MAX_GPU_SHARE, "must be a whole number of GPUs, at least 1"
        )
        or 1
    )
    unit = "GiB" if unit_mib == 1024 else f"{unit_mib} MiB"
    for c in containers:
        if c.values:
            ask = _aliyun_container(c, unit, unit_mib, cards, errors)
            if ask is not None:
                reading.asks.append(ask)
    # The extender puts the GPU memory of all the pod's containers on one device (ACK: on `cards` devices, evenly).
    per_card = sum(a.ask.memory_mib or 0 for a in reading.asks if a.container.role is ContainerRole.REGULAR)
    if per_card:
        reading.pod_demands.append((per_card, Source("pod", ALIYUN_MEMORY, None)))
    return reading


def _aliyun_container(c: Container, unit: str, unit_mib: int, cards: int, errors: Errors) -> ContainerAsk | None:
    memory_raw, core_raw = c.values.get(ALIYUN_MEMORY), c.values.get(ALIYUN_CORE)
    before = len(errors)
    units = whole(errors, c.subject, ALIYUN_MEMORY, memory_raw, 0, None, f"must be a whole number of {unit}")
    core_rule = "must be a multiple of 5 from 5 to 100 (percent of one GPU's computing power)"
    core = whole(errors, c.subject, ALIYUN_CORE, core_raw, 5, 100, core_rule)
    if core is not None and core % 5:
        errors.add(c.subject, ALIYUN_CORE, core_raw, core_rule)
        core = None
    if core is not None and not units:
        errors.add(
            c.subject,
            ALIYUN_CORE,
            core_raw,
            f"needs {ALIYUN_MEMORY}: ACK allocates computing power with GPU memory only",
        )
    if core is not None and cards > 1:
        errors.add(
            c.subject,
            ALIYUN_CORE,
            core_raw,
            f"cannot be combined with label {ALIYUN_GPU_COUNT}: ACK's multi-GPU sharing shares computing power",
        )
    if units and units % cards:
        errors.add(c.subject, ALIYUN_MEMORY, memory_raw,
                   f"ACK shares it over the {cards} GPUs of label {ALIYUN_GPU_COUNT} evenly: it must divide by {cards}")
    if len(errors) > before or not units:
        return None  # gpushare: 0 GiB is a container without a GPU
    compute = percent(core) if core is not None else None  # without it gpushare isolates memory only
    memory = DeviceAsk(
        compute, memory_mib=units // cards * unit_mib, source=Source(c.subject, ALIYUN_MEMORY, memory_raw)
    )
    return ContainerAsk(c, cards, memory)


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_mapping(as_mapping(pod.get("metadata")).get("annotations"))
