"""Fair share at admission (docs/fair-share.md): the band a GPU pod is admitted in (the burst guard), the gate it
waits behind in the fair-share queue, and why a pod that names its node is refused."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpusharing.contract import FAIR_SHARE_GATE
from gpusharing.fairshare import beyond_fair_share, beyond_process_part, fair_share_gate
from webhook.admission.patch import JsonPatch, pointer
from webhook.caches.budgets import NamespaceBudget


def named_node(namespace: str) -> str:
    """Why a pod that names its node is refused while fair share is on: the API server would refuse the gated pod
    with a validation error that does not say why it is gated."""
    return (f"fair share is on in namespace {namespace!r}: GPU pods wait in its queue and kube-scheduler places them; "
            "a pod cannot name its node (spec.nodeName): remove it, and choose nodes with a nodeSelector or node "
            "affinity")


def queue_for_fair_share(spec: Mapping[str, Any], patch: JsonPatch) -> None:
    """The fair-share gate among the pod's scheduling gates, which the controller removes in fair-share order
    (Kueue's admission gate); the pod's other gates stay, and a gate already there (a reinvocation) is not added
    again."""
    if not isinstance(spec.get("schedulingGates"), list):
        patch.add(pointer("spec", "schedulingGates"), [{"name": FAIR_SHARE_GATE}])
    elif fair_share_gate(spec) is None:
        patch.add(pointer("spec", "schedulingGates", "-"), {"name": FAIR_SHARE_GATE})


def fair_share_band(budget: NamespaceBudget, gpus: float, admitted: float, processes: int = 1) -> tuple[str, str]:
    """The band's class a GPU pod of `gpus` is admitted in, and why: its namespace's band, or one lower when with it
    the namespace would hold more than its fair share of the cluster's GPUs (the burst guard, Kueue's entry penalty:
    a light team's burst does not all take the top band). `admitted`: what this process admitted there since the
    timekeeper counted the namespace's GPUs; `processes`: the live webhook processes, each of which fills its part
    of the room left (gpusharing.fairshare.beyond_process_part)."""
    band = budget.fair_share
    assert band is not None
    if band.burst_class == band.band_class or not beyond_process_part(
        band.held_gpus, band.share_gpus, admitted, gpus, processes
    ):
        return band.band_class, band.reason[:MAX_REASON_ANNOTATION]
    holding = band.held_gpus + admitted
    if beyond_fair_share(holding, band.share_gpus, gpus):
        why = f"with this pod it would hold {holding + gpus:g} GPUs, above its fair share of {band.share_gpus:.4g}"
    else:
        part = max(0.0, band.share_gpus - band.held_gpus) / processes
        why = (f"this webhook process admitted {admitted:g} GPUs since they were counted, its part ({part:.4g}) of the "
               f"room left in its fair share of {band.share_gpus:.4g} GPUs, which {processes} webhook processes share")
    return band.burst_class, f"{band.reason}; one band lower: {why}"[:MAX_REASON_ANNOTATION]


MAX_REASON_ANNOTATION = 512
