"""What the namespaces' GPU pods have committed of their budgets, and what is left uncommitted (safe admission).

The timekeeper follows the cluster's GPU pods (those the webhook recorded a share on) by a watch. A pod with a
deadline that has not ended commits its share x its model's weight x the time its deadline leaves it: all of its
deadline until it starts, then what remains of it (gpusharing.commitment). A pod without a deadline commits
nothing it can be held to, and is not counted. The listing the webhook polls says, per namespace, what is still
uncommitted and which admissions (the webhook's reservations) it has counted, so the webhook can give those up.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusharing.commitment import commitment, gpu_minutes, pod_deadline_seconds
from gpusharing.contract import ANNOTATION_ADMISSION_ID, ANNOTATION_GPU_MODEL, ANNOTATION_GPU_SHARE
from gpusharing.gpu.catalogue import GpuCatalogue
from gpusharing.gpu.reading import as_mapping, instant
from gpusharing.units.quantity import QuantityError, parse_decimal
from gpusharing.units.share import MAX_GPU_SHARE, MIN_GPU_SHARE
from gpusharing.units.weights import MICROS_PER_GPU_MINUTE
from timekeeper.budgets.hierarchy import ancestry
from timekeeper.budgets.status import Budget, BudgetStatus

ENDED_PHASES = ("Succeeded", "Failed")
MAX_ADMISSION_ID = 64


@dataclass(frozen=True)
class CommittedPod:
    """A GPU pod with a deadline that has not ended, as the timekeeper keeps it."""

    namespace: str
    share: float
    weight: int  # thousandths, of the model the webhook recorded (or the default)
    deadline_seconds: int
    started_at: dt.datetime | None  # None: not started yet (its whole deadline is ahead)
    admission_id: str | None = None

    def remaining_seconds(self, now: dt.datetime) -> float:
        if self.started_at is None:
            return float(self.deadline_seconds)
        return max(0.0, self.deadline_seconds - (now - self.started_at).total_seconds())

    def committed(self, now: dt.datetime) -> int:
        """Weighted micro-GPU-seconds it can still use."""
        return commitment(self.share, self.weight, self.remaining_seconds(now))


def committed_pod(pod: Mapping[str, Any], catalogue: GpuCatalogue) -> CommittedPod | None:
    """The pod as a commitment, or None when it commits nothing: not a GPU pod the webhook admitted, no deadline,
    or ended."""
    metadata, status = as_mapping(pod.get("metadata")), as_mapping(pod.get("status"))
    annotations = as_mapping(metadata.get("annotations"))
    deadline = pod_deadline_seconds(pod)
    if deadline is None or status.get("phase") in ENDED_PHASES:
        return None
    try:
        share = parse_decimal(annotations.get(ANNOTATION_GPU_SHARE))
    except QuantityError:
        return None
    if not MIN_GPU_SHARE <= share <= MAX_GPU_SHARE:
        return None
    recorded = annotations.get(ANNOTATION_GPU_MODEL)
    weight = catalogue.weight_of(recorded if isinstance(recorded, str) else None)
    admission_id = annotations.get(ANNOTATION_ADMISSION_ID)
    return CommittedPod(
        str(metadata.get("namespace", "")),
        float(share),
        weight,
        deadline,
        instant(status.get("startTime")),
        admission_id if isinstance(admission_id, str) and len(admission_id) <= MAX_ADMISSION_ID else None,
    )


@dataclass(frozen=True)
class NamespaceCommitments:
    micro_gpu_seconds: int
    admission_ids: tuple[str, ...]


def commitments_by_namespace(pods: Iterable[CommittedPod], now: dt.datetime) -> dict[str, NamespaceCommitments]:
    """What each namespace's pods have committed, and the admissions counted in it."""
    committed: dict[str, int] = defaultdict(int)
    ids: dict[str, list[str]] = defaultdict(list)
    for pod in pods:
        committed[pod.namespace] += pod.committed(now)
        if pod.admission_id:
            ids[pod.namespace].append(pod.admission_id)
    return {ns: NamespaceCommitments(committed[ns], tuple(sorted(ids[ns]))) for ns in committed}


def uncommitted_json(
    status: BudgetStatus, committed: Mapping[str, NamespaceCommitments] | None, group_committed: Mapping[str, int]
) -> dict[str, Any]:
    """The listing's word on a namespace's commitments: what its pods committed, and what is left uncommitted of the
    tightest of its own budget and its ancestors' (each less what all the pods below it committed); null when the
    timekeeper does not (yet) follow the cluster's pods, or when no budget above it has a limit."""
    if committed is None:
        return {"committedGpuMinutes": None, "uncommitted": None, "admissionIds": []}
    own = committed.get(status.namespace, NamespaceCommitments(0, ()))
    tightest: dict[str, Any] | None = None
    for budget in (status, *status.ancestors):
        allowance = budget.allowance_gpu_minutes
        if allowance is None:
            continue
        below = group_committed.get(budget.namespace, 0) if budget is not status else own.micro_gpu_seconds
        left = max(0, round(allowance * MICROS_PER_GPU_MINUTE) - budget.used_micro_gpu_seconds - below)
        if tightest is None or left < tightest["microGpuSeconds"]:
            tightest = {
                "microGpuSeconds": left,
                "gpuMinutes": gpu_minutes(left),
                "budget": budget.namespace,
                "remainingGpuMinutes": budget.remaining_gpu_minutes,
                "committedGpuMinutes": gpu_minutes(below),
            }
    return {
        "committedGpuMinutes": gpu_minutes(own.micro_gpu_seconds),
        "uncommitted": tightest,
        "admissionIds": list(own.admission_ids) if status.admission.checks_commitments else [],
    }


def group_commitments(budgets: Mapping[str, Budget], committed: Mapping[str, NamespaceCommitments]) -> dict[str, int]:
    """What the pods below each group committed (a namespace's commitments count in every ancestor's)."""
    groups: dict[str, int] = defaultdict(int)
    for namespace, own in committed.items():
        for ancestor in ancestry(budgets, namespace):
            groups[ancestor] += own.micro_gpu_seconds
    return groups


def listing_json(
    statuses: Iterable[BudgetStatus], committed: Mapping[str, NamespaceCommitments] | None, budgets: Mapping[str, Budget]
) -> list[dict[str, Any]]:
    """Budget statuses as the API answers them, each with its commitments (`budgets`: all of them, the hierarchy)."""
    groups = group_commitments(budgets, committed) if committed is not None else {}
    return [{**status.to_json(), **uncommitted_json(status, committed, groups)} for status in statuses]

