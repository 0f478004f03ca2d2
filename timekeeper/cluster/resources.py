"""GPUBudget and ClusterGPUBudget resources, as plain functions over their JSON: what a spec means for the ledger and
what the status says (docs/budgets.md, "GPUBudget resources"). The database stays the source of truth for use.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpusharing.contract import BudgetState, Period
from gpusharing.names import InvalidName, check_budget_name, is_group
from gpusharing.units.duration import DurationError, parse_duration
from timekeeper.budgets.periods import iso_utc
from timekeeper.budgets.requests import BUDGET_FIELDS, BudgetRequestError, budget_from_json
from timekeeper.budgets.status import Budget, BudgetStatus
from timekeeper.cluster.objects import CustomResource, ObjectRef

GROUP, VERSION = "gpusharing.io", "v1alpha1"
GPU_BUDGETS = CustomResource(GROUP, VERSION, "gpubudgets", namespaced=True)
CLUSTER_GPU_BUDGETS = CustomResource(GROUP, VERSION, "clustergpubudgets", namespaced=False)
KINDS = {GPU_BUDGETS: "GPUBudget", CLUSTER_GPU_BUDGETS: "ClusterGPUBudget"}
GPU_BUDGET_NAME = "budget"  # the one GPUBudget a namespace may have (CEL in the CRD)


def owner(obj: Mapping[str, Any]) -> str:
    """How the ledger names the resource that owns a budget: `GPUBudget ns/budget`, `ClusterGPUBudget team.vision`."""
    metadata = obj["metadata"]
    if metadata.get("namespace"):
        return f"GPUBudget {metadata['namespace']}/{metadata['name']}"
    return f"ClusterGPUBudget {metadata['name']}"


def budget_name(obj: Mapping[str, Any]) -> str:
    """The ledger's name of the budget the resource holds: its namespace, or (cluster-scoped) its own name."""
    metadata = obj["metadata"]
    return str(metadata.get("namespace") or metadata["name"])


def budget_from_resource(obj: Mapping[str, Any]) -> Budget:
    """The budget the resource's spec asks for; BudgetRequestError saying why when it cannot be one (the API server's
    schema and CEL rules refuse such specs, unless the CRD installed is not ours)."""
    metadata, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    name = budget_name(obj)
    try:
        check_budget_name(name)
    except InvalidName as exc:
        raise BudgetRequestError(str(exc)) from None
    if metadata.get("namespace") and metadata.get("name") != GPU_BUDGET_NAME:
        raise BudgetRequestError(f"a namespace's GPUBudget is named {GPU_BUDGET_NAME!r}")
    if not metadata.get("namespace") and not is_group(name):
        raise BudgetRequestError(
            f"a ClusterGPUBudget is named as its group, with a dot (e.g. team.vision), not {name!r}"
        )
    if not isinstance(spec, dict):
        raise BudgetRequestError("spec must be an object")
    unlimited = spec.get("unlimited") is True
    if unlimited == ("gpuMinutes" in spec):
        raise BudgetRequestError("set either spec.gpuMinutes or spec.unlimited: true")
    body = {key: spec[key] for key in BUDGET_FIELDS if key in spec}
    body["gpuMinutes"] = None if unlimited else spec["gpuMinutes"]
    return budget_from_json(name, body, Period.MONTHLY)


@dataclass(frozen=True)
class FairShareSpec:
    """A budget resource's spec.fairShare: its weight among its siblings and its usage's half-life (None: the default:
    the budget's GPU-minutes, TIMEKEEPER_FAIRSHARE_HALF_LIFE)."""

    weight: float | None = None
    half_life_seconds: float | None = None


MAX_FAIR_SHARE_WEIGHT = 1e12


def fair_share_spec(obj: Mapping[str, Any]) -> FairShareSpec:
    """spec.fairShare as the CRD's schema admits it; what is out of bounds there is left at its default."""
    raw = (obj.get("spec") or {}).get("fairShare") if isinstance(obj.get("spec"), dict) else None
    if not isinstance(raw, dict):
        return FairShareSpec()
    raw_weight = raw.get("weight")
    weight = float(raw_weight) if isinstance(raw_weight, (int, float)) and not isinstance(raw_weight, bool) else None
    if weight is not None and not 0 < weight <= MAX_FAIR_SHARE_WEIGHT:
        weight = None
    try:
        half_life = parse_duration(raw.get("halfLife"), "spec.fairShare.halfLife", 1.0) if "halfLife" in raw else None
    except DurationError:
        half_life = None
    return FairShareSpec(weight, half_life)


def event_target(obj: Mapping[str, Any]) -> ObjectRef:
    metadata = obj["metadata"]
    kind = "GPUBudget" if metadata.get("namespace") else "ClusterGPUBudget"
    return ObjectRef(f"{GROUP}/{VERSION}", kind, metadata["name"], metadata.get("uid", ""), metadata.get("namespace"))


@dataclass(frozen=True)
class IdleStatus:
    """What a budget's status says of idleness: its idle GPU-hours this period, and its pods idle beyond the
    warning of the policy in force (a group's: those of the namespaces below it)."""

    idle_gpu_hours: float
    idle_pods: tuple[str, ...]  # namespace/pod (idle 4h12m)


@dataclass(frozen=True)
class Problem:
    """Why a resource's budget is not (or not wholly) in the ledger: a Ready condition's reason and message."""

    reason: str
    message: str


def resource_status(
    obj: Mapping[str, Any],
    status: BudgetStatus | None,
    problem: Problem | None,
    children: list[str],
    now: dt.datetime,
    idle: IdleStatus | None = None,
    fair_share: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The status subresource: the budget in its current period, and conditions Ready, Exhausted and Warning (and,
    once the idle policies have run, Idle and the idle GPU-hours), each keeping its lastTransitionTime while its
    status stays."""
    generation = (obj.get("metadata") or {}).get("generation")
    result: dict[str, Any] = {"observedGeneration": generation}
    if status is not None:
        allowance, remaining, percent = status.allowance_gpu_minutes, status.remaining_gpu_minutes, status.percent_used
        result.update({
            "budgetGpuMinutes": None if allowance is None else round(allowance, 2),
            "topUpGpuMinutes": round(status.top_up_gpu_minutes, 2),
            "usedGpuMinutes": round(status.used_gpu_minutes, 2),
            "remainingGpuMinutes": None if remaining is None else round(remaining, 2),
            "percentUsed": None if percent is None else round(percent, 1),
            "periodStart": iso_utc(status.window.start),
            "periodEnd": iso_utc(status.window.end) if status.window.end else None,
            "state": str(status.state),
            "ownState": str(status.own_state),
            "limitedBy": status.limited_by,
            "ancestors": [ancestor.namespace for ancestor in status.ancestors],
        })
        if is_group(status.namespace):
            result["children"] = children
        if idle is not None:
            result["idleGpuHours"] = round(idle.idle_gpu_hours, 2)
    if fair_share is not None:  # {band, ratio, rank, usage, asOf, reason}, as the `fairshare` task last ranked it
        result["fairShare"] = dict(fair_share)
    state = status.state if status is not None else BudgetState.UNKNOWN
    limited_elsewhere = status is not None and status.limited_by not in (None, status.namespace)
    wanted = [
        (
            "Ready",
            problem is None,
            problem.reason if problem else "Reconciled",
            problem.message if problem else "the budget is in the timekeeper's ledger",
        ),
        (
            "Exhausted",
            state is BudgetState.OVER_BUDGET,
            ("AncestorExhausted" if limited_elsewhere else "BudgetExhausted")
            if state is BudgetState.OVER_BUDGET
            else "WithinBudget",
            _state_message(status),
        ),
        (
            "Warning",
            state is BudgetState.WARNING,
            ("AncestorThresholdReached" if limited_elsewhere else "ThresholdReached")
            if state is BudgetState.WARNING
            else "BelowThresholds",
            _state_message(status),
        ),
    ]
    if idle is not None:
        wanted.append(
            ("Idle", bool(idle.idle_pods), "PodsIdle" if idle.idle_pods else "NoIdlePods", _idle_message(idle))
        )
    previous = {c.get("type"): c for c in ((obj.get("status") or {}).get("conditions") or []) if isinstance(c, dict)}
    conditions = []
    for kind, true, reason, message in wanted:
        value = "True" if true else "False"
        before = previous.get(kind) or {}
        since = before.get("lastTransitionTime") if before.get("status") == value else None
        conditions.append({"type": kind, "status": value, "reason": reason, "message": message,
                           "observedGeneration": generation, "lastTransitionTime": since or iso_utc(now)})
    result["conditions"] = conditions
    return {key: value for key, value in result.items() if value is not None}


def _state_message(status: BudgetStatus | None) -> str:
    if status is None:
        return "not in the ledger"
    if status.state is BudgetState.UNLIMITED:
        return "no limit here or above"
    limiting = next(s for s in (status, *status.ancestors) if s.namespace == status.limited_by)
    percent = limiting.percent_used or 0.0
    return (f"{limiting.namespace} has used {limiting.used_gpu_minutes:.1f} of {limiting.allowance_gpu_minutes:g} "
            f"GPU-minutes ({percent:.0f} %) in its {limiting.period} period")


def _idle_message(idle: IdleStatus) -> str:
    if not idle.idle_pods:
        return "no GPU pod is idle beyond the warning of its idle policy"
    shown = ", ".join(idle.idle_pods[:5]) + (f" and {len(idle.idle_pods) - 5} more" if len(idle.idle_pods) > 5 else "")
    return f"{len(idle.idle_pods)} GPU pod(s) idle beyond the warning of their idle policy: {shown}"


def status_differs(current: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    """Whether writing `wanted` would change what the object shows."""
    return dict(current or {}) != dict(wanted)
