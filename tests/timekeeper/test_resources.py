"""What a GPUBudget's or a ClusterGPUBudget's spec means for the ledger (the API server's own checks: tests/e2e)."""

from __future__ import annotations

from typing import Any

import pytest

from gpusharing.contract import AdmissionMode, Period, Shortfall
from gpusharing.idle.policy import IdleAction, IdlePolicy
from timekeeper.budgets.requests import BudgetRequestError
from timekeeper.budgets.status import Budget
from timekeeper.cluster.resources import budget_from_resource


def gpu_budget(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "budget", "namespace": "ml-team"}, "spec": spec}


def test_safe_admissions_settings_pass_from_the_spec_into_the_budget() -> None:
    budget = budget_from_resource(gpu_budget(gpuMinutes=60, admission="safe", onShortfall="refuse"))
    assert budget == Budget(
        "ml-team", 60.0, Period.MONTHLY, admission=AdmissionMode.SAFE, on_shortfall=Shortfall.REFUSE
    )
    group = budget_from_resource(
        {"metadata": {"name": "team.vision"}, "spec": {"unlimited": True, "admission": "strict"}}
    )
    assert (group.namespace, group.admission, group.on_shortfall) == (
        "team.vision",
        AdmissionMode.STRICT,
        Shortfall.DEMOTE,
    )
    assert budget_from_resource(gpu_budget(gpuMinutes=60)).admission is AdmissionMode.OPEN


def test_a_spec_the_crd_would_refuse_is_refused_with_the_apis_words() -> None:
    with pytest.raises(BudgetRequestError, match="admission must be one of open, safe, strict, not 'unsafe'"):
        budget_from_resource(gpu_budget(gpuMinutes=60, admission="unsafe"))


def test_an_idle_policy_passes_from_the_spec_into_the_budget() -> None:
    budget = budget_from_resource(
        gpu_budget(gpuMinutes=60, idle={"after": "4h", "action": "evict", "warnBefore": "30m"})
    )
    assert budget.idle == IdlePolicy(4 * 3600, IdleAction.EVICT, 1800)
    group = budget_from_resource(
        {"metadata": {"name": "team.vision"}, "spec": {"unlimited": True, "idle": {"after": "90s"}}}
    )
    assert group.idle == IdlePolicy(90)
    assert budget_from_resource(gpu_budget(gpuMinutes=60)).idle is None
    with pytest.raises(BudgetRequestError, match=r"^idle.warnBefore \(4h\) must be shorter than idle.after \(4h\)"):
        budget_from_resource(gpu_budget(gpuMinutes=60, idle={"after": "4h", "warnBefore": "4h"}))
