"""One GPU request model for every sharing dialect.

``parse_gpu_request`` reads a Pod (as the API server sends it, JSON) in whichever dialect it speaks, as that
dialect's backend reads it (`gpusharing.gpu.dialects`), prices what it asks on the GPU model it will run on
(`gpusharing.gpu.catalogue`) and returns one normalized ``GpuRequest`` with the warnings the reading gave, ``None`` when
the pod asks for no GPU, or raises ``InvalidGpuRequest`` carrying every rule the pod breaks, each naming where, the
key, the value and the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Context, Decimal, localcontext
from typing import Any

from gpusharing.decoded import as_list, as_mapping
from gpusharing.gpu.catalogue import GpuCatalogue, GpuModel, PodModels, describe, pod_models, shipped_catalogue
from gpusharing.gpu.claims import ClaimGpuRequest, claimed_gpus, price_claim
from gpusharing.gpu.dialects import (
    KAI_ANNOTATIONS,
    KAI_FRACTION,
    NVIDIA_GPU,
    ContainerAsk,
    Dialect,
    DialectReading,
    HamiSettings,
    Source,
    dialect_of_key,
    is_gpu_key,
    read_aliyun,
    read_gpu_manager,
    read_hami,
)
from gpusharing.gpu.dra import (
    ClaimLookup,
    no_claims,
)
from gpusharing.gpu.fields import Container, ContainerRole, Errors, GpuRequestError, InvalidGpuRequest
from gpusharing.gpu.mig import dynamic_slice
from gpusharing.gpu.nvidia import kai_refusals, kai_requests_gpu, read_kai, read_nvidia
from gpusharing.messages import shortened
from gpusharing.units.quantity import MAX_DIGITS, MAX_EXPONENT, QuantityError, parse_quantity
from gpusharing.units.share import MAX_GPU_SHARE, format_share

__all__ = [
    "ContainerGpuRequest", "ClaimGpuRequest", "ContainerRole", "Dialect", "GpuRequest", "GpuRequestError",
    "GpuRequestSettings", "HamiSettings", "InvalidGpuRequest", "as_list", "as_mapping", "effective_pod_total",
    "format_share", "parse_gpu_request",
]

# Inputs are bounded (gpusharing.units.quantity), so shares are sums of products that fit this precision whole:
# a share is only rounded once, upwards, by format_share.
_SHARE_ARITHMETIC = Context(prec=4 * (MAX_DIGITS + MAX_EXPONENT))
MAX_CONTAINERS = 1000  # init containers and containers of one pod: far beyond any real pod, and read in milliseconds
MAX_WARNINGS = 10  # the API server shows each; a pod of a thousand containers gets ten and a count
DEFAULT_DRA_GPU_CLASSES = frozenset({"gpu.nvidia.com", "mig.nvidia.com"})


@dataclass(frozen=True)
class GpuRequestSettings:
    """What the reader needs to know of the cluster: its GPU models and its backends' configuration."""

    catalogue: GpuCatalogue = field(default_factory=shipped_catalogue)
    aliyun_memory_unit_mib: int = 1024  # gpushare counts GiB by default; its device plugin may count MiB
    hami: HamiSettings = field(default_factory=HamiSettings)
    dra_gpu_classes: frozenset[str] = DEFAULT_DRA_GPU_CLASSES  # DeviceClasses whose devices are GPUs
    dra_devices_per_node: int = 8  # billed for a claim of all the matching devices of a node


@dataclass(frozen=True)
class ContainerGpuRequest:
    """What one container gets of each of its devices, and the share it is billed for."""

    container: str
    role: ContainerRole
    devices: int
    compute_fraction: Decimal  # of each device, 0 < f <= 1
    memory_mib: int  # of each device
    share: Decimal  # devices × max(compute fraction, memory fraction)
    mig_profile: str | None = None
    compute_limit: Decimal | None = None  # gpu-manager's burst ceiling (vcuda-core-limit), not billed

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "container": self.container,
            "role": str(self.role),
            "devices": self.devices,
            "computeFraction": format_share(self.compute_fraction),
            "memoryMiB": self.memory_mib,
            "share": format_share(self.share),
        }
        if self.mig_profile is not None:
            record["migProfile"] = self.mig_profile
        if self.compute_limit is not None:
            record["computeLimit"] = format_share(self.compute_limit)
        return record


@dataclass(frozen=True)
class GpuRequest:
    """A pod's GPU request in every dialect alike: what the webhook records on the pod and the timekeeper bills."""

    dialect: Dialect
    containers: tuple[ContainerGpuRequest, ...]
    share: Decimal  # the pod's billed GPU share: Kubernetes' effective-request rule, plus its claims
    memory_mib: int  # GPU memory the pod holds, all devices together, by the same rule
    model: str  # the GPU model its memory was divided by
    claims: tuple[ClaimGpuRequest, ...] = ()
    mps: bool = False  # KAI runs the fraction under MPS (same bill)
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "dialect": str(self.dialect),
            "share": format_share(self.share),
            "memoryMiB": self.memory_mib,
            "model": self.model,
            "containers": [c.to_dict() for c in self.containers],
        }
        if self.claims:
            record["claims"] = [c.to_dict() for c in self.claims]
        if self.mps:
            record["mps"] = True
        return record


def parse_gpu_request(
    pod: Mapping[str, Any], settings: GpuRequestSettings = GpuRequestSettings(), claims: ClaimLookup = no_claims
) -> GpuRequest | None:
    """The pod's GPU request in one normalized record; None when it asks for no GPU.

    `claims` finds the specs of the resource claims the pod names. Raises InvalidGpuRequest listing every rule the
    pod breaks.
    """
    with localcontext(_SHARE_ARITHMETIC):
        return _parse_gpu_request(pod, settings, claims)


def _parse_gpu_request(pod: Mapping[str, Any], settings: GpuRequestSettings, lookup: ClaimLookup) -> GpuRequest | None:
    errors = Errors()
    spec = as_mapping(pod.get("spec"))
    metadata = as_mapping(pod.get("metadata"))
    count = sum(len(as_list(spec.get(list_name))) for list_name in ("initContainers", "containers"))
    if count > MAX_CONTAINERS:
        errors.add(
            "pod",
            "",
            None,
            f"has {count} containers and init containers, more than the {MAX_CONTAINERS} the webhook reads",
        )
        raise InvalidGpuRequest(errors)
    annotations = as_mapping(metadata.get("annotations"))
    containers = list(_containers(spec, settings.hami, errors))
    dialect = _dialect_in_use(containers, annotations, settings.hami, errors)
    if dialect in (None, Dialect.WHOLE_GPU, Dialect.MIG):  # `mps` is KAI's only in a pod no other sharing dialect reads
        kai_refusals(annotations, errors)
    if errors:
        raise InvalidGpuRequest(errors)
    reading = _read(dialect, pod, annotations, containers, settings, errors) if dialect else DialectReading()
    claimed = claimed_gpus(pod, settings.dra_gpu_classes, lookup, errors)
    if errors:
        raise InvalidGpuRequest(errors)
    if not reading.asks and not claimed:
        return None  # e.g. nvidia.com/gpu: 0, or claims of no GPU device
    models = pod_models(pod, settings.catalogue, read_gpu_type=dialect is Dialect.HAMI)
    model = _model_for(models, reading)
    _check_fits(model, models, reading, errors)
    if errors:
        raise InvalidGpuRequest(errors)
    priced = [_price(ask, model) for ask in reading.asks]
    claim_requests = [
        request
        for claim, alternatives in claimed
        for request in price_claim(claim, alternatives, settings.dra_devices_per_node, model)
    ]
    order = [c.name for c in containers]
    share = effective_pod_total(priced, order, lambda r: r.share) + sum((c.share for c in claim_requests), Decimal(0))
    memory = effective_pod_total(priced, order, lambda r: Decimal(r.devices * r.memory_mib))
    memory += sum(c.devices * c.memory_mib for c in claim_requests)
    if share > MAX_GPU_SHARE:
        errors.add(
            "pod",
            "",
            None,
            f"is billed for {format_share(share)} GPUs in all, more than the {MAX_GPU_SHARE} one pod may be",
        )
        raise InvalidGpuRequest(errors)
    warnings = [*models.warnings, *reading.warnings]
    if len(warnings) > MAX_WARNINGS:
        warnings = [*warnings[: MAX_WARNINGS - 1], f"and {len(warnings) - MAX_WARNINGS + 1} more warnings"]
    return GpuRequest(
        dialect or Dialect.DRA,
        tuple(priced),
        share,
        int(memory),
        model.name,
        tuple(claim_requests),
        reading.mps,
        tuple(warnings),
    )


def effective_pod_total(
    requests: Iterable[ContainerGpuRequest], order: list[str], value: Callable[[ContainerGpuRequest], Decimal]
) -> Decimal:
    """Kubernetes' effective request of `value`: the larger of any init container (with the native sidecars declared
    before it) and all regular containers plus all native sidecars."""
    by_name: dict[str, tuple[ContainerRole, Decimal]] = {}
    for request in requests:
        _, total = by_name.get(request.container, (request.role, Decimal(0)))
        by_name[request.container] = (request.role, total + value(request))
    sidecars_so_far = Decimal(0)
    largest_init = Decimal(0)
    steady = Decimal(0)
    for name in order:
        if name not in by_name:
            continue
        role, amount = by_name.pop(name)
        if role is ContainerRole.INIT:
            largest_init = max(largest_init, amount + sidecars_so_far)
        elif role is ContainerRole.SIDECAR:
            sidecars_so_far += amount
            steady += amount
        else:
            steady += amount
    return max(largest_init, steady)


def _containers(spec: Mapping[str, Any], hami: HamiSettings, errors: Errors) -> Iterable[Container]:
    for list_name, default_role in (("initContainers", ContainerRole.INIT), ("containers", ContainerRole.REGULAR)):
        for index, raw in enumerate(as_list(spec.get(list_name))):
            if not isinstance(raw, Mapping):
                continue
            role = default_role
            if default_role is ContainerRole.INIT and raw.get("restartPolicy") == "Always":
                role = ContainerRole.SIDECAR
            container = Container(str(raw.get("name", f"#{index}")), role, index, raw)
            container.values = _gpu_values(container, as_mapping(raw.get("resources")), hami, errors)
            yield container


def _gpu_values(
    container: Container, resources: Mapping[str, Any], hami: HamiSettings, errors: Errors
) -> dict[str, str]:
    """The GPU keys a container sets, from its limits or requests; both, when given, must be equal."""
    limits = as_mapping(resources.get("limits"))
    requests = as_mapping(resources.get("requests"))
    values: dict[str, str] = {}
    for key in [*limits, *(k for k in requests if k not in limits)]:
        if not isinstance(key, str) or not is_gpu_key(key, hami):
            continue
        limit, request = limits.get(key), requests.get(key)
        if limit is not None and request is not None and not _same_quantity(limit, request):
            errors.add(
                container.subject,
                key,
                None,
                f"limit {shortened(str(limit))!r} and request {shortened(str(request))!r} differ; "
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


def _dialect_in_use(
    containers: list[Container], annotations: Mapping[str, Any], hami: HamiSettings, errors: Errors
) -> Dialect | None:
    """The one dialect the pod's containers and annotations speak, with the first container (or annotation) that speaks
    it."""
    seen: dict[Dialect, str] = {}
    whole_gpu_at: str | None = None
    for container in containers:
        for key in container.values:
            dialect = dialect_of_key(key, hami)
            where = f"{container.subject} sets {key}"
            if dialect is None:
                whole_gpu_at = whole_gpu_at or where
            else:
                seen.setdefault(dialect, where)
    if kai_requests_gpu(annotations):
        kai_keys = [key for key in KAI_ANNOTATIONS if key in annotations]
        seen.setdefault(Dialect.KAI, f"annotation {kai_keys[0]}")
    if whole_gpu_at is not None and Dialect.HAMI not in seen:
        if Dialect.KAI in seen:
            key = KAI_FRACTION if KAI_FRACTION in annotations else "gpu-memory"
            errors.add(
                "annotation",
                key,
                None,
                f"cannot be combined with an {NVIDIA_GPU} limit ({whole_gpu_at}): "
                "KAI gives a pod either a fraction of a GPU or whole GPUs",
            )
            return None
        if Dialect.MIG not in seen:  # whole GPUs beside MIG slices are both the NVIDIA device plugin's
            seen[Dialect.WHOLE_GPU] = whole_gpu_at
    if len(seen) > 1:
        spoken = " and ".join(f"{dialect} ({where})" for dialect, where in seen.items())
        errors.add("pod", "", None, f"mixes GPU-sharing dialects {spoken}; a pod must use one")
        return None
    return next(iter(seen), None)


def _read(
    dialect: Dialect,
    pod: Mapping[str, Any],
    annotations: Mapping[str, Any],
    containers: list[Container],
    settings: GpuRequestSettings,
    errors: Errors,
) -> DialectReading:
    if dialect is Dialect.GPU_MANAGER:
        return read_gpu_manager(pod, containers, errors)
    if dialect is Dialect.HAMI:
        return read_hami(pod, containers, settings.hami, errors)
    if dialect is Dialect.ALIYUN_GPUSHARE:
        return read_aliyun(pod, containers, settings.aliyun_memory_unit_mib, errors)
    if dialect is Dialect.KAI:
        return read_kai(annotations, containers, errors)
    return read_nvidia(containers, errors)


# ---- the GPU model, and what the pod's asks cost on it -------------------------------------------------------------


def _demands(reading: DialectReading) -> list[tuple[int, Source]]:
    """The memory sizes one device must hold."""
    demands = [
        (a.ask.memory_mib, a.ask.source)
        for a in reading.asks
        if a.ask.memory_mib is not None and a.ask.source is not None
    ]
    return demands + reading.pod_demands


def _model_for(models: PodModels, reading: DialectReading) -> GpuModel:
    """The smallest model the pod may run on that holds what it asks of one device (the largest share billed among
    the devices it may get), else the largest (whose refusal says why)."""
    needed = max((mib for mib, _ in _demands(reading)), default=0)
    return next((m for m in models.candidates if m.memory_mib >= needed), models.candidates[-1])


def _check_fits(model: GpuModel, models: PodModels, reading: DialectReading, errors: Errors) -> None:
    if not models.named:
        whose = "the default GPU model; a pod names its own by nvidia.com/gpu.product or HAMi's nvidia.com/use-gputype"
    elif len(models.candidates) > 1:
        whose = "the largest GPU model the pod may run on"
    else:
        whose = "the pod's GPU model"
    for memory, source in _demands(reading):
        if memory > model.memory_mib:
            what = f"asks for {memory} MiB" if source.subject != "pod" else f"asks for {memory} MiB over its containers"
            errors.add(source.subject, source.key, source.raw,
                       f"{what}, more than a device has ({describe(model)}, {whose})")


def _price(ask: ContainerAsk, model: GpuModel) -> ContainerGpuRequest:
    device = ask.ask
    profile = None
    if device.mig is not None:
        compute = device.mig.compute(model.mig_compute_slices)
        memory_fraction = device.mig.memory(model.memory_mib)
        memory_mib = device.mig.memory_mib
        profile = device.mig.profile
    else:
        if device.memory_mib is not None:
            memory_mib, memory_fraction = device.memory_mib, Decimal(device.memory_mib) / model.memory_mib
        elif device.memory_fraction is not None:
            memory_fraction = device.memory_fraction
            memory_mib = int(device.memory_fraction * model.memory_mib)
        else:
            memory_mib, memory_fraction = model.memory_mib, Decimal(1)
        compute = device.compute if device.compute is not None else memory_fraction
        if device.dynamic_mig:
            carved = dynamic_slice(memory_mib, model.mig_compute_slices, model.memory_mib)
            if device.mig_only or carved.share(model.mig_compute_slices, model.memory_mib) > max(
                compute, memory_fraction
            ):
                compute, memory_mib = carved.compute(model.mig_compute_slices), carved.memory_mib
                memory_fraction = carved.memory(model.memory_mib)
                profile = carved.profile
    share = ask.devices * max(compute, memory_fraction)
    c = ask.container
    return ContainerGpuRequest(c.name, c.role, ask.devices, compute, memory_mib, share, profile, ask.compute_limit)


# ---- resource claims (DRA) -----------------------------------------------------------------------------------------
