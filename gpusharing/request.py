"""One GPU request model for every sharing dialect.

``parse_gpu_request`` reads a Pod (as the API server sends it, JSON) in whichever dialect it speaks and
returns one normalized ``GpuRequest``, ``None`` when the pod asks for no GPU, or raises
``InvalidGpuRequest`` carrying every rule the pod breaks, each naming where, the key, the value and the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Context, Decimal, localcontext
from enum import StrEnum
from typing import Any

from gpusharing.messages import shortened
from gpusharing.quantity import (
    MAX_DIGITS,
    MAX_EXPONENT,
    QuantityError,
    QuantityOutOfBounds,
    parse_decimal,
    parse_quantity,
    parse_whole_quantity,
)
from gpusharing.share import MAX_GPU_SHARE, MIN_GPU_SHARE, format_share

VCUDA_CORE = "tencent.com/vcuda-core"
VCUDA_MEMORY = "tencent.com/vcuda-memory"
VCUDA_MEMORY_UNIT_MIB = 256
NVIDIA_GPU = "nvidia.com/gpu"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENTAGE = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"
ALIYUN_MEMORY = "aliyun.com/gpu-mem"
KAI_FRACTION = "gpu-fraction"
KAI_MEMORY = "gpu-memory"
KAI_NUM_DEVICES = "gpu-fraction-num-devices"
KAI_CONTAINER_NAME = "gpu-fraction-container-name"
KAI_CONTAINER_TYPE = "gpu-fraction-container-type"

GPU_MANAGER_KEYS = (VCUDA_CORE, VCUDA_MEMORY)
HAMI_KEYS = (HAMI_MEMORY, HAMI_MEMORY_PERCENTAGE, HAMI_CORES)
ALIYUN_KEYS = (ALIYUN_MEMORY,)
RESOURCE_KEYS = (*GPU_MANAGER_KEYS, NVIDIA_GPU, *HAMI_KEYS, *ALIYUN_KEYS)
KAI_ANNOTATIONS = (KAI_FRACTION, KAI_MEMORY, KAI_NUM_DEVICES, KAI_CONTAINER_NAME, KAI_CONTAINER_TYPE)

# Inputs are bounded (gpusharing.quantity), so shares are sums of products that fit this precision whole:
# a share is only rounded once, upwards, by format_share.
_SHARE_ARITHMETIC = Context(prec=4 * (MAX_DIGITS + MAX_EXPONENT))
MAX_CONTAINERS = 1000  # init containers and containers of one pod: far beyond any real pod, and read in milliseconds
MAX_ERRORS_SHOWN = 10  # a pod with thousands of broken containers gets a message of reasonable length
_TOO_MANY_DEVICES = f"more than {MAX_GPU_SHARE}, the most GPUs one pod may be billed for"

class Dialect(StrEnum):
    GPU_MANAGER = "gpu-manager"
    HAMI = "hami"
    ALIYUN_GPUSHARE = "aliyun-gpushare"
    KAI = "kai"
    WHOLE_GPU = "whole-gpu"


class ContainerRole(StrEnum):
    INIT = "init"
    SIDECAR = "sidecar"  # a native sidecar: an init container with restartPolicy: Always
    REGULAR = "regular"


@dataclass(frozen=True)
class GpuModelSettings:
    """What the parser needs to know of the cluster's devices."""

    device_memory_mib: int = 81920
    aliyun_memory_unit_mib: int = 1024  # gpushare counts GiB by default; its device plugin may count MiB


@dataclass(frozen=True)
class ContainerGpuRequest:
    container: str
    role: ContainerRole
    devices: int
    compute_fraction: Decimal  # of each device, 0 < f <= 1
    memory_mib: int | None  # of each device; None: the whole device's memory
    share: Decimal  # devices × max(compute fraction, memory fraction)

    def to_dict(self) -> dict[str, Any]:
        return {
            "container": self.container,
            "role": str(self.role),
            "devices": self.devices,
            "computeFraction": format_share(self.compute_fraction),
            "memoryMiB": self.memory_mib,
            "share": format_share(self.share),
        }


@dataclass(frozen=True)
class GpuRequest:
    dialect: Dialect
    containers: tuple[ContainerGpuRequest, ...]
    share: Decimal  # the pod's billed GPU share, by Kubernetes' effective-request rule

    def memory_mib(self, settings: GpuModelSettings) -> int:
        """GPU memory the pod holds, all containers and devices together (whole devices at the configured size)."""
        return sum(c.devices * (c.memory_mib if c.memory_mib is not None else settings.device_memory_mib) for c in self.containers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dialect": str(self.dialect),
            "share": format_share(self.share),
            "containers": [c.to_dict() for c in self.containers],
        }


@dataclass(frozen=True)
class GpuRequestError:
    subject: str  # 'container "infer"', 'annotation', 'pod'
    key: str  # empty for a rule of the whole pod
    value: str | None
    rule: str

    def __str__(self) -> str:
        shown = f'{self.key}="{self.value}"' if self.value is not None else self.key
        where = f"annotation {shown}" if self.subject == "annotation" else ": ".join(p for p in (self.subject, shown) if p)
        return f"{where}: {self.rule}"


class InvalidGpuRequest(ValueError):
    def __init__(self, errors: list[GpuRequestError]):
        shown = "; ".join(str(e) for e in errors[:MAX_ERRORS_SHOWN])
        more = len(errors) - MAX_ERRORS_SHOWN
        super().__init__(shown + (f"; and {more} more" if more > 0 else ""))
        self.errors = errors


def as_mapping(value: object) -> Mapping[str, Any]:
    """The value if it is a JSON object, else empty: the API server sends typed pods, other callers may not."""
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass
class _Container:
    name: str
    role: ContainerRole
    index: int  # position among the pod's init containers or its containers
    values: dict[str, str] = field(default_factory=dict)  # GPU keys set in limits or requests

    @property
    def subject(self) -> str:
        kind = "container" if self.role is ContainerRole.REGULAR else "init container"
        return f'{kind} "{shortened(self.name)}"'


class _Errors(list[GpuRequestError]):
    def add(self, subject: str, key: str, value: object, rule: str) -> None:
        self.append(GpuRequestError(subject, key, None if value is None else shortened(str(value)), rule))


def parse_gpu_request(pod: Mapping[str, Any], settings: GpuModelSettings = GpuModelSettings()) -> GpuRequest | None:
    """The pod's GPU request in one normalized record; None when it asks for no GPU.

    Raises InvalidGpuRequest listing every rule the pod breaks.
    """
    with localcontext(_SHARE_ARITHMETIC):
        return _parse_gpu_request(pod, settings)


def _parse_gpu_request(pod: Mapping[str, Any], settings: GpuModelSettings) -> GpuRequest | None:
    errors = _Errors()
    spec = as_mapping(pod.get("spec"))
    count = sum(len(as_list(spec.get(list_name))) for list_name in ("initContainers", "containers"))
    if count > MAX_CONTAINERS:
        errors.add("pod", "", None, f"has {count} containers and init containers, more than the {MAX_CONTAINERS} the webhook reads")
        raise InvalidGpuRequest(errors)
    annotations = as_mapping(as_mapping(pod.get("metadata")).get("annotations"))
    containers = list(_containers(spec, errors))
    kai_keys = [key for key in KAI_ANNOTATIONS if key in annotations]

    dialects = _dialects_in_use(containers, kai_keys, errors)
    if errors:
        raise InvalidGpuRequest(errors)
    if not dialects:
        return None
    dialect = dialects[0]
    if dialect is Dialect.KAI:
        requests = _parse_kai(annotations, containers, settings, errors)
    else:
        parse_container = _CONTAINER_PARSERS[dialect]
        requests = [r for c in containers if c.values and (r := parse_container(c, settings, errors)) is not None]
    if errors:
        raise InvalidGpuRequest(errors)
    if not requests:
        return None  # e.g. nvidia.com/gpu: 0
    share = effective_pod_share(requests, [c.name for c in containers])
    if share > MAX_GPU_SHARE:
        errors.add("pod", "", None, f"is billed for {format_share(share)} GPUs in all, more than the {MAX_GPU_SHARE} one pod may be")
        raise InvalidGpuRequest(errors)
    return GpuRequest(dialect, tuple(requests), share)


def effective_pod_share(requests: list[ContainerGpuRequest], order: list[str]) -> Decimal:
    """Kubernetes' effective request: the larger of any init container (with the native sidecars declared
    before it) and all regular containers plus all native sidecars."""
    by_name = {r.container: r for r in requests}
    sidecars_so_far = Decimal(0)
    largest_init = Decimal(0)
    steady = Decimal(0)
    for name in order:
        request = by_name.get(name)
        if request is None:
            continue
        if request.role is ContainerRole.INIT:
            largest_init = max(largest_init, request.share + sidecars_so_far)
        elif request.role is ContainerRole.SIDECAR:
            sidecars_so_far += request.share
            steady += request.share
        else:
            steady += request.share
    return max(largest_init, steady)


def _containers(spec: Mapping[str, Any], errors: _Errors) -> Iterator[_Container]:
    for list_name, default_role in (("initContainers", ContainerRole.INIT), ("containers", ContainerRole.REGULAR)):
        for index, raw in enumerate(as_list(spec.get(list_name))):
            if not isinstance(raw, Mapping):
                continue
            role = default_role
            if default_role is ContainerRole.INIT and raw.get("restartPolicy") == "Always":
                role = ContainerRole.SIDECAR
            container = _Container(str(raw.get("name", f"#{index}")), role, index)
            container.values = _gpu_values(container, as_mapping(raw.get("resources")), errors)
            yield container


def _gpu_values(container: _Container, resources: Mapping[str, Any], errors: _Errors) -> dict[str, str]:
    """The GPU keys a container sets, from its limits or requests; both, when given, must be equal."""
    limits = as_mapping(resources.get("limits"))
    requests = as_mapping(resources.get("requests"))
    values: dict[str, str] = {}
    for key in RESOURCE_KEYS:
        limit, request = limits.get(key), requests.get(key)
        if limit is None and request is None:
            continue
        if limit is not None and request is not None and not _same_quantity(limit, request):
            errors.add(
                container.subject,
                key,
                None,
                f"limit {str(limit)!r} and request {str(request)!r} differ; "
                "Kubernetes requires an extended resource's request to equal its limit",
            )
            continue
        values[key] = str(limit if limit is not None else request)
    return values


def _same_quantity(a: object, b: object) -> bool:
    try:
        return parse_quantity(a) == parse_quantity(b)
    except QuantityError:
        return str(a) == str(b)


def _dialects_in_use(containers: list[_Container], kai_keys: list[str], errors: _Errors) -> list[Dialect]:
    """The dialects a pod speaks, with the first container (or annotation) that speaks each."""
    seen: dict[Dialect, str] = {}
    whole_gpu_at: str | None = None
    for container in containers:
        for key in container.values:
            dialect = _dialect_of_key(key)
            where = f"{container.subject} sets {key}"
            if dialect is None:
                whole_gpu_at = whole_gpu_at or where
            else:
                seen.setdefault(dialect, where)
    if kai_keys:
        seen.setdefault(Dialect.KAI, f"annotation {kai_keys[0]}")
    if whole_gpu_at is not None and Dialect.HAMI not in seen:
        if Dialect.KAI in seen:
            key = KAI_FRACTION if KAI_FRACTION in kai_keys else kai_keys[0]
            errors.add(
                "annotation",
                key,
                None,
                f"cannot be combined with an {NVIDIA_GPU} limit ({whole_gpu_at}): "
                "KAI gives a pod either a fraction of a GPU or whole GPUs",
            )
            return []
        seen[Dialect.WHOLE_GPU] = whole_gpu_at
    if len(seen) > 1:
        spoken = " and ".join(f"{dialect} ({where})" for dialect, where in seen.items())
        errors.add("pod", "", None, f"mixes GPU-sharing dialects {spoken}; a pod must use one")
        return []
    return list(seen)


def _dialect_of_key(key: str) -> Dialect | None:
    if key in GPU_MANAGER_KEYS:
        return Dialect.GPU_MANAGER
    if key in HAMI_KEYS:
        return Dialect.HAMI
    if key in ALIYUN_KEYS:
        return Dialect.ALIYUN_GPUSHARE
    return None  # nvidia.com/gpu: HAMi's when HAMi keys are present, whole GPUs otherwise


def _whole(
    errors: _Errors, subject: str, key: str, raw: str | None, low: int, high: int | None, rule: str
) -> int | None:
    """A plain integer in [low, high]; records `rule` and returns None otherwise."""
    if raw is None:
        return None
    try:
        number = parse_whole_quantity(raw)
    except QuantityOutOfBounds as exc:
        errors.add(subject, key, raw, str(exc))
        return None
    except QuantityError:
        number = None
    if number is None or number < low or (high is not None and number > high):
        errors.add(subject, key, raw, rule)
        return None
    return number


def _devices(errors: _Errors, subject: str, key: str, raw: str | None, low: int, rule: str) -> int | None:
    """A whole number of devices, at least `low` and no more than one pod may be billed for."""
    devices = _whole(errors, subject, key, raw, low, None, rule)
    if devices is not None and devices > MAX_GPU_SHARE:
        errors.add(subject, key, raw, f"asks for {devices} GPUs, {_TOO_MANY_DEVICES}")
        return None
    return devices


def _memory_fraction(memory_mib: int | None, settings: GpuModelSettings) -> Decimal:
    if memory_mib is None:
        return Decimal(1)
    return Decimal(memory_mib) / Decimal(settings.device_memory_mib)


def _request(
    container: _Container, devices: int, compute: Decimal, memory_mib: int | None, settings: GpuModelSettings
) -> ContainerGpuRequest:
    share = devices * max(compute, _memory_fraction(memory_mib, settings))
    return ContainerGpuRequest(container.name, container.role, devices, compute, memory_mib, share)


def _check_fits_device(
    errors: _Errors, subject: str, key: str, raw: str, memory_mib: int, settings: GpuModelSettings
) -> bool:
    if memory_mib > settings.device_memory_mib:
        errors.add(
            subject,
            key,
            raw,
            f"asks for {memory_mib} MiB, more than a device has ({settings.device_memory_mib} MiB, "
            "GPUSHARING_DEVICE_MEMORY_MIB)",
        )
        return False
    return True


def _parse_gpu_manager(c: _Container, settings: GpuModelSettings, errors: _Errors) -> ContainerGpuRequest | None:
    core_raw, memory_raw = c.values.get(VCUDA_CORE), c.values.get(VCUDA_MEMORY)
    before = len(errors)
    memory_units = _whole(errors, c.subject, VCUDA_MEMORY, memory_raw, 1, None, "must be a whole number of 256 MiB units, at least 1")
    if core_raw is None:
        errors.add(c.subject, VCUDA_MEMORY, memory_raw, f"needs {VCUDA_CORE}: gpu-manager cannot give GPU memory without GPU compute")
        return None
    core = _whole(
        errors, c.subject, VCUDA_CORE, core_raw, 1, None,
        "must be a whole number: 1 to 99 (percent of one GPU) or a multiple of 100 (whole GPUs)",
    )
    if core is not None and core > 100 * MAX_GPU_SHARE:
        errors.add(c.subject, VCUDA_CORE, core_raw, f"asks for {core / 100:g} GPUs, {_TOO_MANY_DEVICES}")
    if core is not None and core >= 100 and core % 100:
        errors.add(c.subject, VCUDA_CORE, core_raw, "above 99 must be a multiple of 100 (whole GPUs): use 100, 200, ...")
    if core is None or len(errors) > before:
        return None
    if core >= 100:
        return _request(c, core // 100, Decimal(1), None, settings)
    if memory_units is None:
        errors.add(
            c.subject, VCUDA_CORE, core_raw,
            f"a fraction of a GPU needs {VCUDA_MEMORY} too (units of {VCUDA_MEMORY_UNIT_MIB} MiB)",
        )
        return None
    memory_mib = memory_units * VCUDA_MEMORY_UNIT_MIB
    if not _check_fits_device(errors, c.subject, VCUDA_MEMORY, memory_raw or "", memory_mib, settings):
        return None
    return _request(c, 1, Decimal(core) / 100, memory_mib, settings)


def _parse_hami(c: _Container, settings: GpuModelSettings, errors: _Errors) -> ContainerGpuRequest | None:
    before = len(errors)
    gpu_raw = c.values.get(NVIDIA_GPU)
    sharing = [key for key in HAMI_KEYS if key in c.values]
    devices = _devices(errors, c.subject, NVIDIA_GPU, gpu_raw, 1 if sharing else 0,
                       "must be a whole number of devices" + (", at least 1" if sharing else ""))
    memory_mib = _whole(errors, c.subject, HAMI_MEMORY, c.values.get(HAMI_MEMORY), 1, None,
                        "must be a whole number of MiB per device, at least 1")
    percentage = _whole(errors, c.subject, HAMI_MEMORY_PERCENTAGE, c.values.get(HAMI_MEMORY_PERCENTAGE), 0, 100,
                        "must be a whole percentage of each device's memory, 0 to 100")
    cores = _whole(errors, c.subject, HAMI_CORES, c.values.get(HAMI_CORES), 0, 100,
                   "must be a whole percentage of each device's compute, 0 to 100")
    if HAMI_MEMORY in c.values and HAMI_MEMORY_PERCENTAGE in c.values:
        errors.add(c.subject, HAMI_MEMORY_PERCENTAGE, c.values[HAMI_MEMORY_PERCENTAGE],
                   f"cannot be set together with {HAMI_MEMORY}: give memory in MiB or as a percentage, not both")
    if len(errors) > before:
        return None
    if devices is None:
        devices = 1  # HAMi gives one vGPU when only its memory or cores are asked for
    if devices == 0:
        return None
    if memory_mib is not None and not _check_fits_device(
        errors, c.subject, HAMI_MEMORY, c.values[HAMI_MEMORY], memory_mib, settings
    ):
        return None
    if percentage is not None:
        memory_mib = settings.device_memory_mib * percentage // 100
    # HAMi does not limit compute when gpucores is unset or 0, so the pod may use the whole device.
    compute = Decimal(cores) / 100 if cores else Decimal(1)
    return _request(c, devices, compute, memory_mib, settings)


def _parse_aliyun(c: _Container, settings: GpuModelSettings, errors: _Errors) -> ContainerGpuRequest | None:
    raw = c.values[ALIYUN_MEMORY]
    unit = "GiB" if settings.aliyun_memory_unit_mib == 1024 else f"{settings.aliyun_memory_unit_mib} MiB"
    units = _whole(errors, c.subject, ALIYUN_MEMORY, raw, 1, None, f"must be a whole number of {unit}, at least 1")
    if units is None:
        return None
    memory_mib = units * settings.aliyun_memory_unit_mib
    if not _check_fits_device(errors, c.subject, ALIYUN_MEMORY, raw, memory_mib, settings):
        return None
    # gpushare isolates memory only; the pod is billed by the memory it holds.
    return _request(c, 1, _memory_fraction(memory_mib, settings), memory_mib, settings)


def _parse_whole_gpu(c: _Container, settings: GpuModelSettings, errors: _Errors) -> ContainerGpuRequest | None:
    devices = _devices(errors, c.subject, NVIDIA_GPU, c.values[NVIDIA_GPU], 0, "must be a whole number of GPUs")
    if not devices:
        return None
    return _request(c, devices, Decimal(1), None, settings)


_CONTAINER_PARSERS: dict[Dialect, Callable[[_Container, GpuModelSettings, _Errors], ContainerGpuRequest | None]] = {
    Dialect.GPU_MANAGER: _parse_gpu_manager,
    Dialect.HAMI: _parse_hami,
    Dialect.ALIYUN_GPUSHARE: _parse_aliyun,
    Dialect.WHOLE_GPU: _parse_whole_gpu,
}


def _parse_kai(
    annotations: Mapping[str, Any], containers: list[_Container], settings: GpuModelSettings, errors: _Errors
) -> list[ContainerGpuRequest]:
    subject = "annotation"
    fraction_raw, memory_raw = annotations.get(KAI_FRACTION), annotations.get(KAI_MEMORY)
    fraction = _kai_fraction(errors, fraction_raw)
    memory_mib = _whole(errors, subject, KAI_MEMORY, memory_raw, 1, None, "must be a whole number of MiB, at least 1")
    devices = _devices(errors, subject, KAI_NUM_DEVICES, annotations.get(KAI_NUM_DEVICES), 1,
                       "must be a whole number of devices, at least 1")
    if fraction_raw is not None and memory_raw is not None:
        errors.add(subject, KAI_MEMORY, memory_raw, f"cannot be set together with {KAI_FRACTION}: ask for a fraction or for memory, not both")
    if fraction_raw is None and memory_raw is None:
        for key in (KAI_NUM_DEVICES, KAI_CONTAINER_NAME, KAI_CONTAINER_TYPE):
            if key in annotations:
                errors.add(subject, key, annotations[key], f"only applies with {KAI_FRACTION} or {KAI_MEMORY}")
        return []
    target = _kai_target_container(annotations, containers, errors)
    if memory_mib is not None:
        _check_fits_device(errors, subject, KAI_MEMORY, str(memory_raw), memory_mib, settings)
    if errors or target is None:
        return []
    if fraction is not None:
        compute = fraction
        memory_mib = int(fraction * settings.device_memory_mib)
    else:
        assert memory_mib is not None
        compute = _memory_fraction(memory_mib, settings)
    return [_request(target, devices or 1, compute, memory_mib, settings)]


def _kai_fraction(errors: _Errors, raw: object) -> Decimal | None:
    if raw is None:
        return None
    rule = f"must be a decimal number from {MIN_GPU_SHARE} (the smallest share billed) to 1"
    try:
        fraction = parse_decimal(raw)
    except QuantityOutOfBounds as exc:
        errors.add("annotation", KAI_FRACTION, raw, str(exc))
        return None
    except QuantityError:
        errors.add("annotation", KAI_FRACTION, raw, rule)
        return None
    if not MIN_GPU_SHARE <= fraction <= 1:
        errors.add("annotation", KAI_FRACTION, raw, rule)
        return None
    return fraction


def _kai_target_container(
    annotations: Mapping[str, Any], containers: list[_Container], errors: _Errors
) -> _Container | None:
    """The container KAI gives the fraction to: the named one, else the first of the requested type."""
    name = annotations.get(KAI_CONTAINER_NAME)
    kind = annotations.get(KAI_CONTAINER_TYPE)
    if kind is not None and kind not in ("InitContainer", "RegularContainer"):
        errors.add("annotation", KAI_CONTAINER_TYPE, kind, "must be InitContainer or RegularContainer")
        return None
    wants_init = kind == "InitContainer"
    if name is not None:
        for container in containers:
            if container.name == name:
                if kind is not None and (container.role is not ContainerRole.REGULAR) != wants_init:
                    actual = "a container" if container.role is ContainerRole.REGULAR else "an init container"
                    errors.add("annotation", KAI_CONTAINER_NAME, name, f"names {actual}, but {KAI_CONTAINER_TYPE} is {kind}")
                    return None
                return container
        names = ", ".join(f'"{c.name}"' for c in containers) or "none"
        errors.add("annotation", KAI_CONTAINER_NAME, name, f"names no container or init container of this pod (it has {names})")
        return None
    for container in containers:
        if (container.role is not ContainerRole.REGULAR) == wants_init:
            return container
    errors.add("annotation", KAI_CONTAINER_TYPE if wants_init else KAI_FRACTION,
               kind if wants_init else annotations.get(KAI_FRACTION, annotations.get(KAI_MEMORY)),
               "the pod has no " + ("init container" if wants_init else "container") + " to give the GPU to")
    return None
