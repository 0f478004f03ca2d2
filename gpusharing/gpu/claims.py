"""A pod's resource claims read for the GPUs they ask (DRA), and each request priced on a GPU model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpusharing.decoded import as_mapping
from gpusharing.gpu.catalogue import GpuModel
from gpusharing.gpu.dra import (
    MAX_POD_CLAIMS,
    ClaimLookup,
    ClaimSource,
    ClaimSpec,
    ClaimUnknown,
    DeviceAlternative,
    pod_claims,
)
from gpusharing.gpu.fields import TOO_MANY_DEVICES, Errors
from gpusharing.gpu.mig import InvalidMigProfile, parse_profile
from gpusharing.messages import shortened
from gpusharing.units.share import MAX_GPU_SHARE, format_share


@dataclass(frozen=True)
class ClaimGpuRequest:
    """GPUs a pod gets through one request of one of its resource claims, held for the pod's whole life."""

    claim: str  # the pod's name for the claim
    request: str
    device_class: str
    devices: int
    memory_mib: int  # of each device
    share: Decimal
    mig_profile: str | None = None

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "claim": self.claim,
            "request": self.request,
            "deviceClass": self.device_class,
            "devices": self.devices,
            "memoryMiB": self.memory_mib,
            "share": format_share(self.share),
        }
        if self.mig_profile is not None:
            record["migProfile"] = self.mig_profile
        return record



def claimed_gpus(
    pod: Mapping[str, Any], gpu_classes: frozenset[str], lookup: ClaimLookup, errors: Errors
) -> list[tuple[str, list[tuple[str, list[DeviceAlternative]]]]]:
    """Per claim of the pod, its requests' GPU alternatives (requests of no GPU class left out)."""
    claims = pod_claims(as_mapping(pod.get("spec")))
    if len(claims) > MAX_POD_CLAIMS:
        errors.add(
            "pod",
            "spec.resourceClaims",
            None,
            f"has {len(claims)} resource claims, more than the {MAX_POD_CLAIMS} the webhook reads",
        )
        return []
    namespace = str(as_mapping(pod.get("metadata")).get("namespace") or "")
    found = []
    for claim in claims:
        subject = f'resource claim "{shortened(claim.name)}"'
        key = "resourceClaimTemplateName" if claim.source is ClaimSource.TEMPLATE else "resourceClaimName"
        try:
            spec: ClaimSpec = lookup(claim.source, namespace, claim.source_name)
        except ClaimUnknown as exc:
            errors.add(subject, key, claim.source_name, str(exc))
            continue
        requests = []
        for request in spec.requests:
            gpus = [a for a in request.alternatives if a.device_class in gpu_classes]
            for alternative in gpus:
                if alternative.mig_profile is not None:
                    try:
                        parse_profile(alternative.mig_profile)
                    except InvalidMigProfile as exc:
                        errors.add(subject, f"request {shortened(request.name)!r}", alternative.mig_profile, str(exc))
                if alternative.count is not None and alternative.count > MAX_GPU_SHARE:
                    errors.add(
                        subject,
                        f"request {shortened(request.name)!r}",
                        alternative.count,
                        f"asks for {alternative.count} GPUs, {TOO_MANY_DEVICES}",
                    )
            if gpus:
                requests.append((request.name, gpus))
        if requests:
            found.append((claim.name, requests))
    return found


def price_claim(
    claim: str, requests: Sequence[tuple[str, Sequence[DeviceAlternative]]], devices_per_node: int, model: GpuModel
) -> list[ClaimGpuRequest]:
    """Each request billed for the costliest of its alternatives (the scheduler takes the first it can have)."""
    priced = []
    for name, alternatives in requests:
        options = []
        for alternative in alternatives:
            devices = alternative.count if alternative.count is not None else devices_per_node
            if alternative.mig_profile is not None:
                mig = parse_profile(alternative.mig_profile)
                share = devices * mig.share(model.mig_compute_slices, model.memory_mib)
                options.append(
                    ClaimGpuRequest(claim, name, alternative.device_class, devices, mig.memory_mib, share, mig.profile)
                )
            else:
                options.append(
                    ClaimGpuRequest(claim, name, alternative.device_class, devices, model.memory_mib, Decimal(devices))
                )
        priced.append(max(options, key=lambda o: o.share))
    return priced
