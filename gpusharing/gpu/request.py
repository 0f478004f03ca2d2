"""One GPU request model for every sharing dialect.

``parse_gpu_request`` reads a Pod (as the API server sends it, JSON) in whichever dialect it speaks, as that
dialect's backend reads it (`gpusharing.gpu.dialects`), prices what it asks on the GPU model it will run on
(`gpusharing.gpu.catalogue`, `gpusharing.gpu.pricing`) and returns one normalized ``GpuRequest`` with the warnings the
reading gave, ``None`` when the pod asks for no GPU, or raises ``InvalidGpuRequest`` carrying every rule the pod
breaks, each naming where, the key, the value and the rule. ``read_gpu_asks`` stops before the price: what the pod
asks, to be priced on any model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import localcontext
from typing import Any

from gpusharing.decoded import as_list, as_mapping
from gpusharing.gpu.catalogue import GpuCatalogue, GpuModel, PodModels, pod_models, shipped_catalogue
from gpusharing.gpu.claims import ClaimGpuRequest, claimed_gpus
from gpusharing.gpu.dialects import (
    KAI_ANNOTATIONS,
    KAI_FRACTION,
    NVIDIA_GPU,
    Dialect,
    DialectReading,
    HamiSettings,
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
from gpusharing.gpu.nvidia import kai_refusals, kai_requests_gpu, read_kai, read_nvidia
from gpusharing.gpu.pricing import (
    SHARE_ARITHMETIC,
    ContainerGpuRequest,
    DevicesAsked,
    GpuRequest,
    PodGpuAsks,
    effective_pod_total,
)
from gpusharing.messages import shortened
from gpusharing.units.quantity import QuantityError, parse_quantity
from gpusharing.units.share import format_share

__all__ = [
    "ContainerGpuRequest", "ClaimGpuRequest", "ContainerRole", "Dialect", "GpuRequest", "GpuRequestError",
    "GpuRequestSettings", "HamiSettings", "InvalidGpuRequest", "PodGpuAsks", "as_list", "as_mapping",
    "admission_models", "effective_pod_total", "format_share", "parse_gpu_request", "read_gpu_asks",
]

MAX_CONTAINERS = 1000  # init containers and containers of one pod: far beyond any real pod, and read in milliseconds
DEFAULT_DRA_GPU_CLASSES = frozenset({"gpu.nvidia.com", "mig.nvidia.com"})


@dataclass(frozen=True)
class GpuRequestSettings:
    """What the reader needs to know of the cluster: its GPU models and its backends' configuration."""

    catalogue: GpuCatalogue = field(default_factory=shipped_catalogue)
    aliyun_memory_unit_mib: int = 1024  # gpushare counts GiB by default; its device plugin may count MiB
    hami: HamiSettings = field(default_factory=HamiSettings)
    dra_gpu_classes: frozenset[str] = DEFAULT_DRA_GPU_CLASSES  # DeviceClasses whose devices are GPUs
    dra_devices_per_node: int = 8  # billed for a claim of all the matching devices of a node


def parse_gpu_request(
    pod: Mapping[str, Any], settings: GpuRequestSettings = GpuRequestSettings(), claims: ClaimLookup = no_claims,
    on_model: GpuModel | None = None,
) -> GpuRequest | None:
    """The pod's GPU request in one normalized record; None when it asks for no GPU.

    `claims` finds the specs of the resource claims the pod names; `on_model`, the model of the node it is bound to,
    replaces the models it names (or the default). Raises InvalidGpuRequest listing every rule the pod breaks.
    """
    with localcontext(SHARE_ARITHMETIC):  # once: read_gpu_asks and priced would each enter it (a copy each time)
        asks = _read_gpu_asks(pod, settings, claims)
        if asks is None:
            return None
        models = PodModels((on_model,), True) if on_model is not None else admission_models(pod, asks, settings)
        return asks._priced(models, settings.dra_devices_per_node)  # priced, in the context entered above


def admission_models(pod: Mapping[str, Any], asks: PodGpuAsks, settings: GpuRequestSettings) -> PodModels:
    """The models the pod may run on, as admission reads them before it is bound: those it names, else the default."""
    return pod_models(pod, settings.catalogue, read_gpu_type=asks.dialect is Dialect.HAMI)


def read_gpu_asks(
    pod: Mapping[str, Any], settings: GpuRequestSettings = GpuRequestSettings(), lookup: ClaimLookup = no_claims
) -> PodGpuAsks | None:
    """What the pod asks of the GPUs it gets, before their model is known; None when it asks for no GPU. Raises
    InvalidGpuRequest listing every rule the pod breaks in its dialect."""
    with localcontext(SHARE_ARITHMETIC):
        return _read_gpu_asks(pod, settings, lookup)


def _read_gpu_asks(pod: Mapping[str, Any], settings: GpuRequestSettings, lookup: ClaimLookup) -> PodGpuAsks | None:
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
    return PodGpuAsks(
        dialect or Dialect.DRA,
        tuple(DevicesAsked.of(ask) for ask in reading.asks),
        tuple(c.name for c in containers),
        tuple(reading.pod_demands),
        tuple((claim, tuple((name, tuple(alternatives)) for name, alternatives in requests))
              for claim, requests in claimed),
        reading.mps,
        tuple(reading.warnings),
    )


def _containers(spec: Mapping[str, Any], hami: HamiSettings, errors: Errors) -> Iterable[Container]:
    for list_name, default_role in (("initContainers", ContainerRole.INIT), ("containers", ContainerRole.REGULAR)):
        for index, raw in enumerate(as_list(spec.get(list_name))):
            if type(raw) is not dict and not isinstance(raw, Mapping):  # a decoded object spares the ABC check
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
    if type(a) is str and a == b:  # as the API server writes them (it copies an extended resource's limit): no parse
        return True
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


