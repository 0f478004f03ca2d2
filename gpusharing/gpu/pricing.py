"""What a pod's GPU asks cost on a GPU model: the asks read in their dialect (`gpusharing.gpu.request`), before
the device's model is known, priced on the model the pod may run on at admission, or on the one its node has once it
is bound (docs/dialects.md, "GPU models").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Context, Decimal, localcontext
from typing import Any

from gpusharing.gpu.catalogue import GpuModel, PodModels, describe
from gpusharing.gpu.claims import ClaimGpuRequest, price_claim
from gpusharing.gpu.dialects import ContainerAsk, DeviceAsk, Dialect, Source
from gpusharing.gpu.dra import DeviceAlternative
from gpusharing.gpu.fields import ContainerRole, Errors, InvalidGpuRequest
from gpusharing.gpu.mig import dynamic_slice
from gpusharing.units.quantity import MAX_DIGITS, MAX_EXPONENT
from gpusharing.units.share import MAX_GPU_SHARE, format_share

# Inputs are bounded (gpusharing.units.quantity), so shares are sums of products that fit this precision whole:
# a share is only rounded once, upwards, by format_share.
SHARE_ARITHMETIC = Context(prec=4 * (MAX_DIGITS + MAX_EXPONENT))
MAX_WARNINGS = 10  # the API server shows each; a pod of a thousand containers gets ten and a count

ClaimAsks = tuple[tuple[str, tuple[tuple[str, tuple[DeviceAlternative, ...]], ...]], ...]  # claim, its GPU requests


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


@dataclass(frozen=True)
class DevicesAsked:
    """What one container asks of each of its devices, without the rest of its spec: all that pricing reads."""

    container: str
    role: ContainerRole
    devices: int
    ask: DeviceAsk
    compute_limit: Decimal | None = None

    @classmethod
    def of(cls, asked: ContainerAsk) -> "DevicesAsked":
        return cls(asked.container.name, asked.container.role, asked.devices, asked.ask, asked.compute_limit)


@dataclass(frozen=True)
class PodGpuAsks:
    """A pod's GPU asks in its dialect, before the model of the GPUs it gets is known: small plain data, kept for a
    pod's life so that it is priced again on the model of the node it is bound to."""

    dialect: Dialect
    asks: tuple[DevicesAsked, ...]
    order: tuple[str, ...]  # its containers' names, init containers first: Kubernetes' effective-request rule
    pod_demands: tuple[tuple[int, Source], ...] = ()  # memory one device must hold, pod-wide
    claims: ClaimAsks = ()
    mps: bool = False
    warnings: tuple[str, ...] = ()

    def priced(self, models: PodModels, devices_per_node: int) -> "GpuRequest":
        """The request priced on the smallest of `models` that holds what it asks; InvalidGpuRequest when it holds
        more than a device of the model has, or more GPUs than one pod may be billed for."""
        with localcontext(SHARE_ARITHMETIC):
            return self._priced(models, devices_per_node)

    def _priced(self, models: PodModels, devices_per_node: int) -> "GpuRequest":
        errors = Errors()
        demands = _demands(self)
        model = _model_for(models, demands)
        _check_fits(model, models, demands, errors)
        if errors:
            raise InvalidGpuRequest(errors)
        priced = [_price(ask, model) for ask in self.asks]
        claim_requests = [
            request
            for claim, alternatives in self.claims
            for request in price_claim(claim, alternatives, devices_per_node, model)
        ]
        order = list(self.order)
        share = effective_pod_total(priced, order, lambda r: r.share) + sum((c.share for c in claim_requests),
                                                                           Decimal(0))
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
        warnings = [*models.warnings, *self.warnings]
        if len(warnings) > MAX_WARNINGS:
            warnings = [*warnings[: MAX_WARNINGS - 1], f"and {len(warnings) - MAX_WARNINGS + 1} more warnings"]
        return GpuRequest(self.dialect, tuple(priced), share, int(memory), model.name, tuple(claim_requests),
                          self.mps, tuple(warnings))


def effective_pod_total(
    requests: Iterable[ContainerGpuRequest], order: Sequence[str], value: Callable[[ContainerGpuRequest], Decimal]
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


# ---- the GPU model, and what the pod's asks cost on it -------------------------------------------------------------


def _demands(asks: "PodGpuAsks") -> list[tuple[int, Source]]:
    """The memory sizes one device must hold."""
    demands = [(a.ask.memory_mib, a.ask.source) for a in asks.asks if a.ask.memory_mib is not None and a.ask.source]
    return demands + list(asks.pod_demands)


def _model_for(models: PodModels, demands: list[tuple[int, Source]]) -> GpuModel:
    """The smallest model the pod may run on that holds what it asks of one device (the largest share billed among
    the devices it may get), else the largest (whose refusal says why)."""
    needed = max((mib for mib, _ in demands), default=0)
    return next((m for m in models.candidates if m.memory_mib >= needed), models.candidates[-1])


def _check_fits(model: GpuModel, models: PodModels, demands: list[tuple[int, Source]], errors: Errors) -> None:
    for memory, source in demands:
        if memory > model.memory_mib:
            if not models.named:
                whose = ("the default GPU model; a pod names its own by nvidia.com/gpu.product or HAMi's "
                         "nvidia.com/use-gputype")
            elif len(models.candidates) > 1:
                whose = "the largest GPU model the pod may run on"
            else:
                whose = "the pod's GPU model"
            what = f"asks for {memory} MiB" if source.subject != "pod" else f"asks for {memory} MiB over its containers"
            errors.add(source.subject, source.key, source.raw,
                       f"{what}, more than a device has ({describe(model)}, {whose})")


def _price(ask: DevicesAsked, model: GpuModel) -> ContainerGpuRequest:
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
    return ContainerGpuRequest(ask.container, ask.role, ask.devices, compute, memory_mib, share, profile,
                               ask.compute_limit)
