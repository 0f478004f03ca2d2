"""What the namespaces' GPU pods have committed of their budgets, and what is left uncommitted (safe admission): a pod
with a deadline that has not ended commits its share x its model's weight x the time its deadline leaves it
(gpusharing.commitment); a pod without one commits nothing it can be held to. The controller publishes the committed
pods (timekeeper.database.cluster.commitments), a pod being admitted holds a reservation until then
(timekeeper.database.budgets.reservations), and what is left is counted along the namespace's path to its root budget
(docs/safe-admission.md).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpusharing.commitment import commitment, gpu_minutes, pod_deadline_seconds
from gpusharing.contract import ANNOTATION_ADMISSION_ID, ANNOTATION_GPU_MODEL, ANNOTATION_GPU_SHARE
from gpusharing.decoded import as_mapping, instant
from gpusharing.gpu.catalogue import GpuCatalogue
from gpusharing.listing import Uncommitted as ListedUncommitted
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
    name: str = ""  # the pod's, as the controller publishes it (admitted_as names it)
    uid: str = ""  # the pod's metadata.uid: what the controller publishes it by

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
        str(metadata.get("name", "")),
        str(metadata.get("uid", "")),
    )


def on_node(pod: CommittedPod, share: float, weight: int) -> CommittedPod:
    """The commitment once the pod is bound, at its share and weight on its node's GPU model where they cost more
    than the model admission read it on: a commitment is corrected up, never down (docs/safe-admission.md)."""
    if share * weight <= pod.share * pod.weight:
        return pod
    return replace(pod, share=share, weight=weight)


@dataclass(frozen=True)
class NamespaceCommitments:
    micro_gpu_seconds: int


def commitments_by_namespace(pods: Iterable[CommittedPod], now: dt.datetime) -> dict[str, NamespaceCommitments]:
    """What each namespace's pods have committed."""
    committed: dict[str, int] = defaultdict(int)
    for pod in pods:
        committed[pod.namespace] += pod.committed(now)
    return {ns: NamespaceCommitments(micro) for ns, micro in committed.items()}


@dataclass(frozen=True)
class Uncommitted:
    """What the tightest budget over a namespace has left: its allowance less its use, less what the pods below it
    committed and the admissions below it reserved (micro-GPU-seconds)."""

    budget: str
    micro_gpu_seconds: int
    remaining_gpu_minutes: float | None
    committed: int
    reserved: int

    def listed(self) -> ListedUncommitted:
        """The figures as the listing and a reservation's answer carry them (gpusharing.listing), in GPU-minutes."""
        return ListedUncommitted(gpu_minutes(self.micro_gpu_seconds), self.micro_gpu_seconds, self.budget,
                                 self.remaining_gpu_minutes, gpu_minutes(self.committed), gpu_minutes(self.reserved))

    def to_json(self) -> dict[str, Any]:
        """The figures' JSON, as a reservation's answer says them: the listing's, so that both say them alike."""
        return self.listed().to_json()


def held_below(budgets: Mapping[str, Budget], held: Mapping[str, int]) -> dict[str, int]:
    """What is held under each budget, from what each namespace holds: its own, and its ancestors' along its path."""
    below: dict[str, int] = defaultdict(int)
    for namespace, amount in held.items():
        for name in (namespace, *ancestry(budgets, namespace)):
            below[name] += amount
    return below


def tightest(
    status: BudgetStatus, committed_below: Mapping[str, int], reserved_below: Mapping[str, int]
) -> Uncommitted | None:
    """What is left uncommitted of the tightest of the namespace's budget and its ancestors' (each less what is
    committed and reserved below it); None when none of them has a limit."""
    least: Uncommitted | None = None
    for budget in (status, *status.ancestors):
        allowance = budget.allowance_gpu_minutes
        if allowance is None:
            continue
        committed, reserved = committed_below.get(budget.namespace, 0), reserved_below.get(budget.namespace, 0)
        left = max(0, round(allowance * MICROS_PER_GPU_MINUTE) - budget.used_micro_gpu_seconds - committed - reserved)
        if least is None or left < least.micro_gpu_seconds:
            least = Uncommitted(budget.namespace, left, budget.remaining_gpu_minutes, committed, reserved)
    return least


@dataclass(frozen=True)
class ListedCommitments:
    """A budget's commitments as the listing says them: what its namespace's pods committed (None while the timekeeper
    does not know it) and what is left uncommitted of the tightest budget over it (None: no limit, or not known)."""

    committed_gpu_minutes: float | None = None
    uncommitted: ListedUncommitted | None = None


NOT_KNOWN = ListedCommitments()


def listed_commitments(
    statuses: Iterable[BudgetStatus],
    committed: Mapping[str, NamespaceCommitments] | None,
    budgets: Mapping[str, Budget],
    reserved: Mapping[str, int],
) -> dict[str, ListedCommitments]:
    """Each status's commitments, by its name, for the listing (`budgets`: all of them, the hierarchy; `reserved`: what
    the admissions the pods do not yet count hold, by namespace); not known while `committed` is None."""
    if committed is None:
        return {status.namespace: NOT_KNOWN for status in statuses}
    committed_below = held_below(budgets, {ns: own.micro_gpu_seconds for ns, own in committed.items()})
    reserved_below = held_below(budgets, reserved)
    listed = {}
    for status in statuses:
        own = committed.get(status.namespace)
        least = tightest(status, committed_below, reserved_below)
        listed[status.namespace] = ListedCommitments(gpu_minutes(own.micro_gpu_seconds if own else 0),
                                                     None if least is None else least.listed())
    return listed
