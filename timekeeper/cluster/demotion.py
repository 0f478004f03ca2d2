"""Acting on budgets that cross: which Event a change of state deserves, which pods an exhausted namespace loses.
Plain functions; timekeeper.cluster.controller acts on them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpusharing.contract import ANNOTATION_GPU_SHARE, BudgetState
from gpusharing.names import is_group
from gpusharing.thresholds import usage_warning
from timekeeper.budgets.status import BudgetStatus

EXHAUSTED = "GPUBudgetExhausted"
RESTORED = "GPUBudgetRestored"
THRESHOLD = "GPUBudgetWarning"


def eviction_candidates(pods: Iterable[Any], in_budget_class: str) -> list[tuple[str, str]]:
    """Names and uids of the running GPU pods that still carry the in-budget priority class (the webhook's GPU pods)."""
    names = []
    for pod in pods:
        metadata, spec, status = pod.metadata, pod.spec, pod.status
        if metadata is None or spec is None or metadata.deletion_timestamp is not None:
            continue
        if spec.priority_class_name != in_budget_class or ANNOTATION_GPU_SHARE not in (metadata.annotations or {}):
            continue
        if status is not None and status.phase == "Running":
            names.append((metadata.name, metadata.uid))
    return sorted(names)


def transition_event(status: BudgetStatus, previous: BudgetState) -> tuple[str, str, bool] | None:
    """(reason, message, warning) of the Event for a change of state, or None when it deserves none (a warning
    threshold is told by threshold_event)."""
    if status.state is BudgetState.OVER_BUDGET:
        action = "its running GPU pods are being evicted" if status.evict_on_exhaustion else "running pods are left alone"
        limiting = next(s for s in (status, *status.ancestors) if s.namespace == status.limited_by)
        whose = "GPU budget exhausted" if limiting is status else f"GPU budget of {limiting.namespace} exhausted"
        pods = "new GPU pods of its namespaces" if is_group(status.namespace) else "new GPU pods"
        return (
            EXHAUSTED,
            f"{whose}: {limiting.used_gpu_minutes:.1f} of {limiting.allowance_gpu_minutes:g} GPU-minutes used "
            f"in the {limiting.period} period; {pods} get the over-budget priority class and {action}",
            True,
        )
    if previous is BudgetState.OVER_BUDGET:
        return RESTORED, f"GPU budget available again ({status.state}); new GPU pods get the in-budget priority class", False
    return None


def threshold_event(status: BudgetStatus) -> tuple[str, str, bool]:
    """(reason, message, warning) of the Event for a budget that reached a warning threshold."""
    return THRESHOLD, usage_warning(status.namespace, status.warning_json()), True
