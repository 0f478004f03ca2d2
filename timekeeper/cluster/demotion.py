"""Acting on budgets that cross: which Event a change of state deserves, which pods an exhausted namespace loses.
Plain functions; timekeeper.cluster.budgetsync acts on them."""

from __future__ import annotations

from collections.abc import Iterable

from gpusharing.contract import BudgetState
from gpusharing.names import is_group
from gpusharing.thresholds import usage_warning
from timekeeper.budgets.status import BudgetStatus
from timekeeper.cluster.informers import GovernedPod

EXHAUSTED = "GPUBudgetExhausted"
RESTORED = "GPUBudgetRestored"
THRESHOLD = "GPUBudgetWarning"


def eviction_candidates(pods: Iterable[GovernedPod]) -> list[GovernedPod]:
    """The running GPU pods the webhook admitted in budget, whatever priority class it let them keep (the webhook's
    record says so): not those it admitted demoted, already at the over-budget class; by name."""
    running = [pod for pod in pods if pod.record.running and pod.record.deleted_at is None and not pod.record.demoted]
    return sorted(running, key=lambda pod: pod.record.name)


def transition_event(status: BudgetStatus, previous: BudgetState) -> tuple[str, str, bool] | None:
    """(reason, message, warning) of the Event for a change of state, or None when it deserves none (a warning
    threshold is told by threshold_event)."""
    if status.state is BudgetState.OVER_BUDGET:
        action = (
            "its running GPU pods are being evicted" if status.evict_on_exhaustion else "running pods are left alone"
        )
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
        return (
            RESTORED,
            f"GPU budget available again ({status.state}); new GPU pods get the in-budget priority class",
            False,
        )
    return None


def threshold_event(status: BudgetStatus) -> tuple[str, str, bool]:
    """(reason, message, warning) of the Event for a budget that reached a warning threshold."""
    return THRESHOLD, usage_warning(status.namespace, status.warning()), True
