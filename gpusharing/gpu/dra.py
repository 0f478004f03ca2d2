"""Dynamic Resource Allocation (resource.k8s.io/v1): the devices a pod's resource claims ask for.

A pod lists claims in `spec.resourceClaims`, each naming a ResourceClaimTemplate (one claim made for the pod) or a
ResourceClaim (possibly shared). Their specs live outside the pod, so the reader is given a lookup; the webhook's
is an in-memory index fed by a watch. Only what billing needs is kept: per request, its device class, how many
devices (or all a node has) and, for MIG devices, the profile the request's selector names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusharing.compat import StrEnum
from gpusharing.decoded import as_list, as_mapping

MAX_REQUESTS = 32  # the API server's limit on a claim's requests
MAX_ALTERNATIVES = 8  # and on a request's firstAvailable list
MAX_POD_CLAIMS = 128  # far beyond the API server's own limit on a pod's claims; read in microseconds
# The NVIDIA DRA driver's MIG devices are told apart by this attribute in a request's CEL selector.
_MIG_PROFILE_SELECTOR = re.compile(
    r"""\.profile\s*==\s*['"](?P<profile>[0-9]{1,2}g\.[0-9]{1,4}gb(?:[+.-][a-z.]{1,10})?)['"]"""
)


class ClaimSource(StrEnum):
    TEMPLATE = "ResourceClaimTemplate"
    CLAIM = "ResourceClaim"


@dataclass(frozen=True)
class DeviceAlternative:
    device_class: str
    count: int | None  # None: allocationMode All, every matching device of a node
    mig_profile: str | None = None  # e.g. "1g.10gb", when a selector asks for that profile
    name: str = ""  # a firstAvailable sub-request's name ("" for `exactly`)


@dataclass(frozen=True)
class DeviceRequest:
    name: str
    alternatives: tuple[DeviceAlternative, ...]  # `exactly`: one; `firstAvailable`: the first that can be had


@dataclass(frozen=True)
class ClaimSpec:
    """What billing needs of a resource claim: its device requests."""

    requests: tuple[DeviceRequest, ...]


class ClaimUnknown(LookupError):
    """The claim's spec is not known to the reader; the message says why (not created yet, no API access, ...)."""


ClaimLookup = Callable[[ClaimSource, str, str], ClaimSpec]  # (source, namespace, name) -> spec, or ClaimUnknown


def no_claims(source: ClaimSource, namespace: str, name: str) -> ClaimSpec:
    raise ClaimUnknown(
        "the webhook reads no resource claims: it has no access to the Kubernetes API (KUBECONFIG or in-cluster)"
    )


def claim_spec(spec: Mapping[str, Any]) -> ClaimSpec:
    """What billing needs of a ResourceClaim's `spec` (a template's `spec.spec`), as the API server serves it."""
    requests = []
    for request in as_list(as_mapping(spec.get("devices")).get("requests"))[:MAX_REQUESTS]:
        request = as_mapping(request)
        exactly = request.get("exactly")
        options = [exactly] if exactly is not None else as_list(request.get("firstAvailable"))[:MAX_ALTERNATIVES]
        alternatives = tuple(_alternative(as_mapping(option)) for option in options)
        requests.append(DeviceRequest(str(request.get("name", "")), alternatives))
    return ClaimSpec(tuple(requests))


def _alternative(option: Mapping[str, Any]) -> DeviceAlternative:
    count: int | None = None
    if option.get("allocationMode") != "All":
        raw = option.get("count")
        count = raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else 1  # ExactCount defaults to 1
    profile = None
    for selector in as_list(option.get("selectors")):
        expression = as_mapping(as_mapping(selector).get("cel")).get("expression")
        match = _MIG_PROFILE_SELECTOR.search(expression) if isinstance(expression, str) else None
        if match:
            profile = match["profile"]
            break
    return DeviceAlternative(str(option.get("deviceClassName", "")), count, profile, str(option.get("name", "")))


MAX_ALLOCATED = 1024  # results read of one claim's allocation: far beyond any node's devices


def allocated_claim_spec(claim: Mapping[str, Any]) -> ClaimSpec | None:
    """What a ResourceClaim was actually allocated (`status.allocation`), in the form of a spec asking for exactly
    that: per request, the alternative the scheduler chose and how many devices it got. None: not allocated.

    Billing prices this rather than the spec, so a claim deleted and made again with more devices after the pod was
    admitted is billed for what the pod holds.
    """
    allocation = as_mapping(as_mapping(claim.get("status")).get("allocation"))
    results = as_list(as_mapping(allocation.get("devices")).get("results"))[:MAX_ALLOCATED]
    if not allocation:
        return None
    counts: dict[tuple[str, str], int] = {}
    for result in results:
        name, _, sub = str(as_mapping(result).get("request", "")).partition("/")
        counts[name, sub] = counts.get((name, sub), 0) + 1
    spec = claim_spec(as_mapping(claim.get("spec")))
    requests = []
    for request in spec.requests:
        chosen = []
        for alternative in request.alternatives:
            devices = counts.get((request.name, alternative.name), 0)
            if devices:
                chosen.append(
                    DeviceAlternative(alternative.device_class, devices, alternative.mig_profile, alternative.name)
                )
        requests.append(DeviceRequest(request.name, tuple(chosen)))
    return ClaimSpec(tuple(request for request in requests if request.alternatives))


@dataclass(frozen=True)
class PodClaim:
    """One entry of a pod's `spec.resourceClaims`: the claim made from a template, or a claim named."""

    name: str  # the pod's name for the claim
    source: ClaimSource
    source_name: str


def pod_claims(spec: Mapping[str, Any]) -> list[PodClaim]:
    """The resource claims a pod's spec names (entries naming neither a template nor a claim left out)."""
    claims = []
    for entry in as_list(spec.get("resourceClaims")):
        entry = as_mapping(entry)
        name = str(entry.get("name", ""))
        if isinstance(entry.get("resourceClaimTemplateName"), str):
            claims.append(PodClaim(name, ClaimSource.TEMPLATE, entry["resourceClaimTemplateName"]))
        elif isinstance(entry.get("resourceClaimName"), str):
            claims.append(PodClaim(name, ClaimSource.CLAIM, entry["resourceClaimName"]))
    return claims
