"""The share and GPU model a pod is billed at, from where the API server says it runs (plain data; docs/budgets.md,
"The GPU model a pod is billed on").

Admission reads a pod on the models it names, else the catalogue's default: nothing better is known before the
scheduler places it. Once it is bound, its node's GPUs are what it holds: its request is priced again on the node's
model (a memory request is a fraction of that model's memory, a MIG profile a slice of that model), never below what
was admitted. A pod that names no model, or another than its node's, is billed on its node's.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpusharing.gpu.capacity import NodeGpus
from gpusharing.gpu.catalogue import GpuModel, PodModels
from gpusharing.gpu.dra import ClaimLookup
from gpusharing.gpu.request import GpuRequestSettings, InvalidGpuRequest
from timekeeper.accounting.record import RecordedPod, claimed_share


@dataclass(frozen=True)
class Placement:
    """What a pod is billed at: its share and GPU model, and the node they were read on (None: not bound, or its
    node is not known: the admission's estimate)."""

    share: float
    model: GpuModel
    node: str | None = None


def placement(pod: RecordedPod, node: NodeGpus | None, settings: GpuRequestSettings,
              claims: ClaimLookup) -> Placement | None:
    """The pod's share and model on `node`, the one it is bound to (None: not bound, or not cached); None while a DRA
    pod's claims are not allocated."""
    catalogue = settings.catalogue
    on = node.model if node is not None else None
    if pod.claimed is not None:
        priced = claimed_share(pod, settings, claims, on)
        if priced is None:
            return None
        share, name = priced
        model = catalogue.by_name(name) or catalogue.default
    elif on is None or pod.asks is None or pod.share is None:
        share = pod.share if pod.share is not None else pod.admitted
        model = (catalogue.by_name(pod.model) if pod.model else None) or catalogue.default
    else:
        try:
            on_node = pod.asks.priced(PodModels((on,), True), settings.dra_devices_per_node)
            share = max(pod.admitted, float(on_node.share))
        except InvalidGpuRequest:  # it asks more than a device of its node's model holds: read as admitted
            share = pod.share
        model = on
    return Placement(share, model, None if node is None else pod.node)
