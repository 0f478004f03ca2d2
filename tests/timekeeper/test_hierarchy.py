"""Hierarchies and warning thresholds: the plain arithmetic of timekeeper.budgets.status and gpusharing.thresholds, the
leader election against the fake API, and the API on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import logging

import pytest

from demo.kubeapi import FakeKube
from gpusharing.contract import BudgetState, Period
from gpusharing.thresholds import check_warning_thresholds, usage_warning
from gpusharing.units.weights import MICROS_PER_GPU_MINUTE
from tests.timekeeper.conftest import METER, SpecClient
from timekeeper.budgets.hierarchy import hierarchy_problem, roll_up
from timekeeper.budgets.periods import period_window
from timekeeper.budgets.status import Budget, state_for
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.leader import LeaderElection

NOW = dt.datetime(2026, 11, 23, 10, 0, tzinfo=dt.timezone.utc)
WINDOWS = {kind: period_window(kind, NOW) for kind in Period}


def minutes(value: float) -> int:
    return int(value * MICROS_PER_GPU_MINUTE)


def test_thresholds_warn_from_the_lowest_and_exhaustion_wins() -> None:
    assert state_for(100, minutes(79.9), (80, 95)) is BudgetState.IN_BUDGET
    assert state_for(100, minutes(80), (80, 95)) is BudgetState.WARNING
    assert state_for(100, minutes(100), (80, 95)) is BudgetState.OVER_BUDGET
    assert state_for(100, minutes(99), ()) is BudgetState.IN_BUDGET  # no thresholds, no warning
    assert state_for(0, 0, (80,)) is BudgetState.OVER_BUDGET
    assert state_for(None, minutes(1e9), (80,)) is BudgetState.UNLIMITED


@pytest.mark.parametrize("raw", [[95, 80], [80, 80], [0], [100], [50.5], [True], "80", [1, 2, 3, 4, 5, 6]])
def test_thresholds_must_be_whole_percents_strictly_increasing(raw: object) -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        check_warning_thresholds(raw)
    assert check_warning_thresholds([]) == () and check_warning_thresholds([1, 50, 99]) == (1, 50, 99)


def test_usage_rolls_up_in_each_groups_own_period_and_the_worst_state_wins() -> None:
    budgets = {
        "org.acme": Budget("org.acme", 1000, Period.MONTHLY),
        "team.vision": Budget("team.vision", 100, Period.WEEKLY, parent="org.acme"),
        "ml-team": Budget("ml-team", 80, Period.DAILY, parent="team.vision"),
        "cv-team": Budget("cv-team", None, Period.MONTHLY, parent="team.vision"),
        "alone": Budget("alone", 10, Period.MONTHLY),
    }
    used = {
        "ml-team": {Period.DAILY: minutes(10), Period.WEEKLY: minutes(50), Period.MONTHLY: minutes(300)},
        "cv-team": {Period.DAILY: minutes(0), Period.WEEKLY: minutes(46), Period.MONTHLY: minutes(600)},
        "alone": {Period.MONTHLY: minutes(1)},
    }
    statuses = roll_up(budgets, used, {"team.vision": {Period.WEEKLY: 10.0}}, WINDOWS)
    vision, acme, ml, cv = (statuses[n] for n in ("team.vision", "org.acme", "ml-team", "cv-team"))
    assert vision.used_gpu_minutes == 96 and vision.allowance_gpu_minutes == 110  # a week of both, with its top-up
    assert acme.used_gpu_minutes == 900  # a month of both
    assert [a.namespace for a in ml.ancestors] == ["team.vision", "org.acme"]
    assert (ml.own_state, vision.own_state, acme.own_state) == (
        BudgetState.IN_BUDGET,
        BudgetState.WARNING,
        BudgetState.WARNING,
    )
    assert (ml.state, ml.limited_by) == (BudgetState.WARNING, "team.vision")  # the nearest budget that warns
    assert (cv.own_state, cv.state) == (BudgetState.UNLIMITED, BudgetState.WARNING)  # limited through its parents
    assert [w["budget"] for w in ml.to_json()["warnings"]] == ["team.vision", "org.acme"]
    over = roll_up(budgets, {**used, "cv-team": {**used["cv-team"], Period.MONTHLY: minutes(750)}}, {}, WINDOWS)
    assert (over["ml-team"].state, over["ml-team"].limited_by) == (BudgetState.OVER_BUDGET, "org.acme")
    assert statuses["alone"].ancestors == () and statuses["alone"].state is BudgetState.IN_BUDGET


def test_a_parent_without_a_budget_is_no_ancestor_and_a_loop_is_never_walked_twice() -> None:
    budgets = {
        "a.g": Budget("a.g", 1, Period.MONTHLY, parent="b.g"),
        "b.g": Budget("b.g", 1, Period.MONTHLY, parent="a.g"),
        "ns": Budget("ns", 1, Period.MONTHLY, parent="missing.g"),
    }
    statuses = roll_up(budgets, {}, {}, WINDOWS)
    assert statuses["ns"].ancestors == () and [a.namespace for a in statuses["a.g"].ancestors] == ["b.g"]


def test_hierarchy_problems_cycles_depth_and_missing_parents() -> None:
    chain = {f"l{i}.g": Budget(f"l{i}.g", 1, Period.MONTHLY, parent=f"l{i + 1}.g" if i < 3 else None) for i in range(4)}
    assert hierarchy_problem(chain, "ns", "l0.g") is None  # four levels above a namespace
    assert "5 levels of budgets above a namespace, more than 4" in (
        hierarchy_problem({**chain, "top.g": Budget("top.g", 1, Period.MONTHLY)}, "l3.g", "top.g") or ""
    )
    assert "l3.g -> l0.g -> l1.g -> l2.g -> l3.g is a cycle" in (hierarchy_problem(chain, "l3.g", "l0.g") or "")
    assert "which has no budget" in (hierarchy_problem(chain, "ns", "nope.g") or "")
    assert hierarchy_problem(chain, "ns", "nope.g", parent_must_exist=False) is None
    assert "is a namespace" in (hierarchy_problem(chain, "ns", "other-ns") or "")


def test_the_warning_reads_as_the_issue_asks() -> None:
    warning = {
        "budget": "ml-team",
        "percentUsed": 86.7,
        "gpuMinutes": 6000.0,
        "period": "monthly",
        "periodStart": "2026-11-01T00:00:00Z",
    }
    assert usage_warning("ml-team", warning) == "namespace ml-team has used 86 % of its 6000 GPU-minutes for November"
    weekly = {**warning, "budget": "team.vision", "period": "weekly", "periodStart": "2026-11-16T00:00:00Z"}
    assert usage_warning("ml-team", weekly) == (
        "namespace ml-team is part of team.vision, which has used 86 % of its 6000 GPU-minutes for the week of 16 "
        "November"
    )
    assert (
        usage_warning("team.vision", {**weekly, "period": "none"})
        == "group team.vision has used 86 % of its 6000 GPU-minutes"
    )


def test_leader_election_takes_over_only_a_lapsed_lease(fake_kube: FakeKube) -> None:
    now = [0.0]
    kube = KubeApi(fake_kube.api_client())
    first, second = (
        LeaderElection(kube, "gpusharing-system", who, 10, monotonic=lambda: now[0]) for who in ("first", "second")
    )
    assert first.try_acquire_or_renew() and not second.try_acquire_or_renew()
    now[0] = 9.0
    assert not second.try_acquire_or_renew()  # seen unchanged for 9 s of 10
    assert first.try_acquire_or_renew()  # renewed: the second starts counting again
    now[0] = 18.0
    assert not second.try_acquire_or_renew()
    now[0] = 28.5
    assert second.try_acquire_or_renew() and not first.try_acquire_or_renew()
    lease = fake_kube.leases[("gpusharing-system", "gpusharing-timekeeper")]
    assert (lease["spec"]["holderIdentity"], lease["spec"]["leaseTransitions"]) == ("second", 1)
    second.release()
    assert first.try_acquire_or_renew()  # given up: taken at once


def test_an_api_outage_is_one_line_when_it_starts_and_one_when_it_ends(
    fake_kube: FakeKube, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a line per renewal (every controller pass, in every worker)."""
    now = [0.0]
    election = LeaderElection(KubeApi(fake_kube.api_client()), "gpusharing-system", "me", 10, monotonic=lambda: now[0])
    caplog.set_level(logging.INFO, logger="timekeeper.cluster.leader")
    assert election.try_acquire_or_renew()
    fake_kube.up = False
    for _ in range(30):
        now[0] += 10
        assert not election.try_acquire_or_renew()
    fake_kube.up = True
    now[0] += 10
    assert election.try_acquire_or_renew() and election.try_acquire_or_renew()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["INFO", "WARNING", "INFO", "INFO", "INFO"], lines
    assert lines[0][1] == "took the lease gpusharing-system/gpusharing-timekeeper as me"
    assert lines[1][1].startswith("the Lease gpusharing-system/gpusharing-timekeeper is unavailable: ")
    assert lines[1][1].endswith(
        "; this process does not lead meanwhile: GPUBudgets are not synced, no Event is written and "
        "no pod evicted (logged again when it is back)"
    )
    assert lines[2][1] == "lost the lease gpusharing-system/gpusharing-timekeeper as me"
    assert (
        lines[3][1] == "the Lease gpusharing-system/gpusharing-timekeeper is back after 5 min 00 s (30 renewals failed)"
    )
    assert lines[4][1] == "took the lease gpusharing-system/gpusharing-timekeeper as me"


def test_a_leader_keeps_its_lease_while_it_works_and_knows_at_once_when_it_is_lost(fake_kube: FakeKube) -> None:
    now = [0.0]
    kube = KubeApi(fake_kube.api_client())
    first, second = (
        LeaderElection(kube, "gpusharing-system", who, 9, monotonic=lambda: now[0]) for who in ("first", "second")
    )
    assert first.try_acquire_or_renew() and first.term == 0
    assert not second.try_acquire_or_renew()
    for step in range(1, 10):  # a pass of 27 s, three times the lease, kept between its acts
        now[0] = 3.0 * step
        assert first.keep() and first.remaining_seconds() > 0
        assert not second.try_acquire_or_renew()
    now[0] += 9.5  # paused past its lease without renewing: it knows, without asking anyone
    assert first.remaining_seconds() == 0
    assert second.try_acquire_or_renew() and second.term == 1  # the successor's term is higher
    assert not first.keep()  # the renewal it tries now is refused: the Lease is the second's


def test_a_stale_write_loses_the_race(fake_kube: FakeKube) -> None:
    kube = KubeApi(fake_kube.api_client())
    election = LeaderElection(kube, "gpusharing-system", "me", 10)
    assert election.try_acquire_or_renew()
    lease = kube.read_lease("gpusharing-system", "gpusharing-timekeeper")
    assert kube.replace_lease("gpusharing-system", "gpusharing-timekeeper", lease) is not None
    # its resourceVersion is gone
    assert kube.replace_lease("gpusharing-system", "gpusharing-timekeeper", lease) is None


def spend(api: SpecClient, namespace: str, gpu_seconds: float) -> dict[str, object]:
    body = {"podUid": f"uid-{namespace}", "namespace": namespace, "pod": "p", "gpuShare": 1.0, "seq": int(gpu_seconds),
            "gpuSeconds": gpu_seconds}
    answer: dict[str, object] = api.as_(METER).post("/api/v1/reports", json=body).json
    return answer


def test_groups_through_the_api(api: SpecClient) -> None:
    refused = api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 10, "parent": "team.vision"})
    assert (
        refused.status_code == 409
        and "team.vision, which has no budget: set the group's budget first" in refused.json["error"]
    )
    assert api.get("/api/v1/budgets/team.vision").status_code == 404
    assert api.put("/api/v1/budgets/team.vision", json={"gpuMinutes": 3, "period": "daily"}).status_code == 201
    assert api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 10, "parent": "team.vision"}).status_code == 201
    assert (
        api.patch(
            "/api/v1/budgets/team-b", json={"parent": "team.vision", "gpuMinutes": 1.5, "warningThresholds": [50]}
        ).status_code
        == 201
    )
    assert spend(api, "team-a", 90)["state"] == "in-budget"
    assert spend(api, "team-b", 60)["state"] == "warning"  # its own 67 %, and the group's 2.5 of 3 GPU-minutes (83 %)
    listing = {item["namespace"]: item for item in api.get("/api/v1/budgets").json["items"]}
    assert (listing["team.vision"]["kind"], listing["team.vision"]["usedGpuMinutes"]) == ("group", 2.5)
    assert (listing["team-a"]["ownState"], listing["team-a"]["state"], listing["team-a"]["limitedBy"]) == (
        "in-budget",
        "warning",
        "team.vision",
    )
    assert [w["budget"] for w in listing["team-b"]["warnings"]] == ["team-b", "team.vision"]
    assert spend(api, "team-a", 121)["state"] == "over-budget"  # the group's budget is spent: so is every namespace's
    assert api.get("/api/v1/budgets/team-b").json["state"] == "over-budget"
    assert (
        api.post("/api/v1/budgets/team.vision/top-ups", json={"gpuMinutes": 10, "reason": "deadline"}).json["state"]
        == "in-budget"
    )
    assert api.get("/api/v1/budgets/team-b").json["state"] == "warning"  # its own 50 % threshold
    cycle = api.put("/api/v1/budgets/team.vision", json={"gpuMinutes": 3, "parent": "team.vision"})
    assert cycle.status_code == 409 and "is a cycle" in cycle.json["error"]
    assert api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 10, "parent": "team-b"}).status_code == 400
    busy = api.delete("/api/v1/budgets/team.vision")
    assert busy.status_code == 409 and "is the parent of team-a, team-b" in busy.json["error"]
    for child in ("team-a", "team-b"):
        api.patch(f"/api/v1/budgets/{child}", json={"parent": None})
    assert api.delete("/api/v1/budgets/team.vision").status_code == 204
