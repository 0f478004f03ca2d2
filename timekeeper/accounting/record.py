"""The API server's record of a governed GPU pod, which its bill follows: plain data from the pod as the watch serves
it (no Kubernetes client, no SQL). The bill reads only what the pod's author can no longer change (the kubelet's start
and end, the share of its immutable spec or of its claims' allocation), never the author's annotations or the meter
(docs/budgets.md, accounting).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpusharing.contract import (
    ANNOTATION_BUDGET_STATE,
    ANNOTATION_FAIR_SHARE_BAND,
    ANNOTATION_GPU_SHARE,
    ANNOTATION_IDLE_HOLD,
    ANNOTATION_SAFE_ADMISSION,
    BILLING_FINALIZER,
    IDLE_EXEMPT_LABEL,
    BudgetState,
)
from gpusharing.decoded import as_list, as_mapping, instant
from gpusharing.fairshare import fair_share_gate
from gpusharing.gpu.catalogue import GpuModel
from gpusharing.gpu.dra import ClaimLookup, ClaimSource, ClaimSpec, ClaimUnknown
from gpusharing.gpu.request import (
    GpuRequestSettings,
    InvalidGpuRequest,
    PodGpuAsks,
    admission_models,
    parse_gpu_request,
    read_gpu_asks,
)
from gpusharing.kube.owners import Owner, controller_of
from gpusharing.units.quantity import QuantityError, parse_decimal
from gpusharing.units.share import MAX_GPU_SHARE, MIN_GPU_SHARE
from gpusharing.usage_report import Labels, recorded_labels
from timekeeper.accounting.ledger import Observation

ENDED_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class RecordedPod:
    """What the bill and the idle policy read of a governed pod, from the API server's copy."""

    uid: str
    namespace: str
    name: str
    share: float | None  # None: priced by its claims' allocations (claimed)
    admitted: float  # the share the webhook recorded at admission, which no update can change: the least billed
    model: str | None  # the catalogue's model its spec was read on: the admission's estimate, before it is bound
    labels: Labels
    started_at: dt.datetime | None  # None: not started, nothing to bill
    finished_at: dt.datetime | None  # its containers' latest finishedAt, once none runs
    deleted_at: dt.datetime | None  # metadata.deletionTimestamp: the end of its grace period
    finalizer: int | None  # the index of the billing finalizer among its finalizers, None without it
    claimed: Mapping[str, Any] | None = None  # a DRA pod: what pricing its claims needs (its spec, claim names)
    # What the idle policy looks at (timekeeper.cluster.idling): who re-creates it, its exemption, its priority class.
    owner: Owner | None = None
    idle_exempt: bool = False
    demoted: bool = False  # admitted out of budget, as the webhook's record says (not its priority class, the tenant's)
    running: bool = False  # its phase is Running, as its kubelet says
    band: str | None = None  # the fair-share band's PriorityClass it was admitted in (the webhook's record); None: none
    gate: int | None = None  # the index of the fair-share gate among its scheduling gates: it waits in the queue
    created_at: dt.datetime | None = None  # metadata.creationTimestamp: its place in its namespace's queue
    node: str | None = None  # spec.nodeName: the node it is bound to, whose GPU model it is billed on
    asks: PodGpuAsks | None = None  # what it asks of its GPUs, to price on its node's model (None: claimed, or unread)

    def observation(self, share: float, now: dt.datetime, grace_seconds: float) -> Observation | None:
        """The pod's record now, or None when it never started. A pod whose deletion's grace period has passed by
        `grace_seconds` while no container says it stopped (its node is gone) ended at its deletion."""
        if self.started_at is None:
            return None
        end = self.finished_at
        if end is None and self.deleted_at is not None and now >= self.deleted_at + dt.timedelta(seconds=grace_seconds):
            end = self.deleted_at
        if end is None:
            return Observation(share, self.started_at, now, ended=False)
        return Observation(share, self.started_at, max(end, self.started_at), ended=True)


def recorded_pod(pod: Mapping[str, Any], settings: GpuRequestSettings) -> RecordedPod | None:
    """The record of a pod the webhook governs (it carries the webhook's share), or None."""
    metadata, status, spec = as_mapping(pod.get("metadata")), as_mapping(pod.get("status")), as_mapping(pod.get("spec"))
    annotations = as_mapping(metadata.get("annotations"))
    admitted = _share(annotations.get(ANNOTATION_GPU_SHARE))
    if admitted is None:
        return None
    claimed = None
    share: float | None = admitted
    model = None
    asks = None
    if as_list(spec.get("resourceClaims")):
        claimed = {"metadata": {"namespace": metadata.get("namespace")}, "spec": _with_claim_names(spec, status)}
        share = None
    else:
        try:
            # As the webhook read it, before kube-scheduler bound it: a backend's admission rules (HAMi refuses a pod
            # created bound to a node) are no reading of what the pod asks.
            asks = read_gpu_asks({**pod, "spec": {k: v for k, v in spec.items() if k != "nodeName"}}, settings)
            gpu = None if asks is None else asks.priced(admission_models(pod, asks, settings),
                                                        settings.dra_devices_per_node)
        except InvalidGpuRequest:  # read as admitted once; only a change of settings since makes it unreadable
            asks = gpu = None
        if gpu is not None:  # never below what was admitted: KAI's fraction is an annotation, which a tenant may lower
            share, model = max(admitted, float(gpu.share)), gpu.model
    finalizers = [f for f in as_list(metadata.get("finalizers")) if isinstance(f, str)]
    return RecordedPod(
        uid=str(metadata.get("uid", "")),
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        share=share,
        admitted=admitted,
        model=model,
        labels=recorded_labels(metadata.get("labels")),
        started_at=instant(status.get("startTime")),
        finished_at=_finished_at(status),
        deleted_at=instant(metadata.get("deletionTimestamp")),
        finalizer=finalizers.index(BILLING_FINALIZER) if BILLING_FINALIZER in finalizers else None,
        claimed=claimed,
        owner=controller_of(pod),
        idle_exempt=as_mapping(metadata.get("labels")).get(IDLE_EXEMPT_LABEL) == "true",
        # Out of budget: its namespace was, safe admission demoted it, or its owner was held for idleness.
        demoted=annotations.get(ANNOTATION_BUDGET_STATE) == BudgetState.OVER_BUDGET
        or annotations.get(ANNOTATION_SAFE_ADMISSION) == "demoted" or ANNOTATION_IDLE_HOLD in annotations,
        band=_band(annotations.get(ANNOTATION_FAIR_SHARE_BAND)),
        running=status.get("phase") == "Running",
        gate=fair_share_gate(spec),
        created_at=instant(metadata.get("creationTimestamp")),
        node=_node_name(spec.get("nodeName")),
        asks=asks,
    )


def claimed_share(pod: RecordedPod, settings: GpuRequestSettings, allocated: ClaimLookup,
                  on_model: GpuModel | None = None) -> tuple[float, str] | None:
    """A DRA pod's share and model, priced by what its claims were allocated (on its node's model, once known);
    None while one is not known."""
    if pod.claimed is None:
        return None
    try:
        gpu = parse_gpu_request(pod.claimed, settings, allocated, on_model)
    except InvalidGpuRequest:
        return None
    if gpu is None:
        return pod.admitted, (on_model or settings.catalogue.default).name
    return max(pod.admitted, float(gpu.share)), gpu.model


def allocation_lookup(claims: Mapping[tuple[str, str], ClaimSpec | None] | None) -> ClaimLookup:
    """A ClaimLookup over the allocations of the cluster's ResourceClaims ((namespace, name) -> allocated spec)."""
    def lookup(source: ClaimSource, namespace: str, name: str) -> ClaimSpec:
        spec = None if claims is None else claims.get((namespace, name))
        if spec is None:
            raise ClaimUnknown(f"ResourceClaim {namespace}/{name} is not allocated, or not known yet")
        return spec

    return lookup


def _with_claim_names(spec: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """The spec with each claim made from a template named by the claim the API server made for the pod (its
    `status.resourceClaimStatuses`), so that all are priced by their allocation."""
    made = {
        as_mapping(entry).get("name"): as_mapping(entry).get("resourceClaimName")
        for entry in as_list(status.get("resourceClaimStatuses"))
    }
    claims = []
    for entry in as_list(spec.get("resourceClaims")):
        entry = as_mapping(entry)
        name = made.get(entry.get("name"))
        claims.append({"name": entry.get("name"), "resourceClaimName": name} if isinstance(name, str) else dict(entry))
    return {**spec, "resourceClaims": claims}


def _finished_at(status: Mapping[str, Any]) -> dt.datetime | None:
    """When the last of its containers stopped, once none runs (an ended phase, or every container terminated). An
    ended pod whose containers say nothing (they never ran, or their node is gone) ended at its last condition's
    change, or its start."""
    statuses = [as_mapping(s) for s in as_list(status.get("containerStatuses"))]
    finished = [instant(as_mapping(as_mapping(s.get("state")).get("terminated")).get("finishedAt")) for s in statuses]
    if status.get("phase") not in ENDED_PHASES and (not statuses or None in finished):
        return None
    ends = [at for at in finished if at is not None] or [
        at for c in as_list(status.get("conditions")) if (at := instant(as_mapping(c).get("lastTransitionTime")))
    ] or [at for at in [instant(status.get("startTime"))] if at is not None]
    return max(ends) if ends else None


def _share(raw: object) -> float | None:
    try:
        value = parse_decimal(raw)
    except QuantityError:
        return None
    return float(value) if Decimal(MIN_GPU_SHARE) <= value <= Decimal(MAX_GPU_SHARE) else None


def _node_name(raw: object) -> str | None:
    return raw if isinstance(raw, str) and 0 < len(raw) <= 253 else None


def _band(raw: object) -> str | None:
    """The band's class the webhook recorded: a PriorityClass name (DNS subdomain), else nothing."""
    return raw if isinstance(raw, str) and 0 < len(raw) <= 253 else None
