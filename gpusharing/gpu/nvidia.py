"""NVIDIA's own dialects, read as their code reads them: the device plugin's whole GPUs and MIG slices, and KAI
Scheduler's fractions and memory sizes, which a pod asks for in annotations rather than resources."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from gpusharing.gpu.dialects import (
    KAI_CONTAINER_NAME,
    KAI_CONTAINER_TYPE,
    KAI_FRACTION,
    KAI_MEMORY,
    KAI_MPS,
    KAI_NUM_DEVICES,
    NVIDIA_GPU,
    ContainerAsk,
    DeviceAsk,
    DialectReading,
    Source,
)
from gpusharing.gpu.fields import TOO_MANY_DEVICES, Container, ContainerRole, Errors, unsigned
from gpusharing.gpu.fields import devices as read_devices
from gpusharing.gpu.mig import InvalidMigProfile, mig_profile
from gpusharing.messages import shortened
from gpusharing.units.quantity import QuantityError, QuantityOutOfBounds, parse_decimal
from gpusharing.units.share import MAX_GPU_SHARE, MIN_GPU_SHARE

# ---- NVIDIA device plugin: whole GPUs and MIG slices ---------------------------------------------------------------


def read_nvidia(containers: list[Container], errors: Errors) -> DialectReading:
    """The containers' whole GPUs and MIG slices, as the NVIDIA device plugin hands them out; refusals go to
    `errors`."""
    reading = DialectReading()
    for c in containers:
        for key, raw in c.values.items():
            if key == NVIDIA_GPU:
                count = read_devices(errors, c.subject, key, raw, 0, "must be a whole number of GPUs")
                if count:
                    reading.asks.append(ContainerAsk(c, count, DeviceAsk(Decimal(1))))
                continue
            try:
                profile = mig_profile(key)
            except InvalidMigProfile as exc:
                errors.add(c.subject, key, None, str(exc))
                continue
            count = read_devices(errors, c.subject, key, raw, 0, "must be a whole number of MIG slices")
            if count:
                reading.asks.append(ContainerAsk(c, count, DeviceAsk(None, mig=profile)))
    return reading


# ---- NVIDIA KAI Scheduler (pkg/binder/plugins/gpusharing/gpu-request/gpu_request_validator.go) ---------------------


def kai_requests_gpu(annotations: Mapping[str, Any]) -> bool:
    """Whether the pod asks KAI Scheduler for a fraction or a memory size of a GPU."""
    return KAI_FRACTION in annotations or KAI_MEMORY in annotations


def kai_refusals(annotations: Mapping[str, Any], errors: Errors) -> None:
    """What KAI refuses of a pod that asks for no fraction: fraction devices or MPS without one."""
    if kai_requests_gpu(annotations):
        return
    if KAI_NUM_DEVICES in annotations:
        errors.add(
            "annotation",
            KAI_NUM_DEVICES,
            annotations[KAI_NUM_DEVICES],
            f"needs {KAI_FRACTION} or {KAI_MEMORY}: KAI shares devices only by a fraction or a memory size",
        )
    if annotations.get(KAI_MPS) == "true":
        errors.add(
            "annotation",
            KAI_MPS,
            "true",
            f"needs {KAI_FRACTION} or {KAI_MEMORY}: KAI runs MPS only for a fraction of a GPU",
        )


def read_kai(annotations: Mapping[str, Any], containers: list[Container], errors: Errors) -> DialectReading:
    """The pod's ask in KAI Scheduler's annotations, given to the one container KAI gives it to, as KAI's binder reads
    them; refusals go to `errors`."""
    reading = DialectReading(mps=annotations.get(KAI_MPS) == "true")
    fraction_raw, memory_raw = annotations.get(KAI_FRACTION), annotations.get(KAI_MEMORY)
    if fraction_raw is not None and memory_raw is not None:
        errors.add(
            "annotation",
            KAI_MEMORY,
            memory_raw,
            f"cannot be set together with {KAI_FRACTION}: ask for a fraction or for memory, not both",
        )
    fraction = _kai_fraction(errors, fraction_raw)
    memory = unsigned(
        errors,
        "annotation",
        KAI_MEMORY,
        memory_raw,
        "must be a whole number of MiB above 0, in digits only (KAI reads it as an unsigned integer)",
    )
    count = unsigned(errors, "annotation", KAI_NUM_DEVICES, annotations.get(KAI_NUM_DEVICES),
                     "must be a whole number of devices above 0, in digits only (KAI reads it as an unsigned integer)")
    if count is not None and count > MAX_GPU_SHARE:
        errors.add(
            "annotation", KAI_NUM_DEVICES, annotations[KAI_NUM_DEVICES], f"asks for {count} GPUs, {TOO_MANY_DEVICES}"
        )
    if KAI_CONTAINER_TYPE in annotations:
        reading.warnings.append(
            f"annotation {KAI_CONTAINER_TYPE} is ignored: KAI Scheduler dropped it in v0.10.2; the GPU goes to the "
            f"container or init container named by {KAI_CONTAINER_NAME}, else to the first container"
        )
    target = _kai_target(annotations, containers, errors)
    if errors or target is None:
        return reading
    if fraction is not None:
        ask = DeviceAsk(fraction, memory_fraction=fraction)
    else:
        assert memory is not None
        ask = DeviceAsk(None, memory_mib=memory, source=Source("annotation", KAI_MEMORY, str(memory_raw)))
    reading.asks.append(ContainerAsk(target, count or 1, ask))
    return reading


def _kai_fraction(errors: Errors, raw: object) -> Decimal | None:
    if raw is None:
        return None
    rule = (f"must be a decimal number above 0 and below 1 (a whole GPU is {NVIDIA_GPU}: 1), at least {MIN_GPU_SHARE} "
            "(the smallest share billed)")
    try:
        fraction = parse_decimal(raw)
    except QuantityOutOfBounds as exc:
        errors.add("annotation", KAI_FRACTION, raw, str(exc))
        return None
    except QuantityError:
        errors.add("annotation", KAI_FRACTION, raw, rule)
        return None
    if not MIN_GPU_SHARE <= fraction < 1:
        errors.add("annotation", KAI_FRACTION, raw, rule)
        return None
    return fraction


def _kai_target(annotations: Mapping[str, Any], containers: list[Container], errors: Errors) -> Container | None:
    """KAI's fraction container: the init container, else the container, named by gpu-fraction-container-name;
    without a name, the first container (pkg/binder/common/gpu_access.go GetFractionContainerRef)."""
    name = annotations.get(KAI_CONTAINER_NAME)
    if name is None:
        first = next((c for c in containers if c.role is ContainerRole.REGULAR), None)
        if first is None:
            errors.add(
                "annotation",
                KAI_FRACTION if KAI_FRACTION in annotations else KAI_MEMORY,
                None,
                "the pod has no container to give the GPU to",
            )
        return first
    ordered = sorted(containers, key=lambda c: c.role is ContainerRole.REGULAR)  # init containers first, as KAI looks
    for container in ordered:
        if container.name == name:
            return container
    names = shortened(", ".join(f'"{c.name}"' for c in containers) or "none", 200)
    errors.add(
        "annotation", KAI_CONTAINER_NAME, name, f"names no container or init container of this pod (it has {names})"
    )
    return None
