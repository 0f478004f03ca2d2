"""The HTTP API on SQLite and PostgreSQL; every answer is held to openapi.yaml by the `api` client."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from gpusharing.contract import DEFAULT_METER_INTERVAL_SECONDS, BudgetState, Period, fresh_for
from gpusharing.report import MeterReport
from gpusharing.units.weights import MICROS_PER_SECOND
from tests.timekeeper.conftest import ADMIN, METER, READER, AppFactory, Clock, SpecClient, served
from timekeeper.database.accounting.report_queue import ReportQueue
from webhook.caches.budgets import BudgetStateCache


def report(
    seq: int, gpu_seconds: float, pod: str = "trainer", namespace: str = "team-a", **extra: Any
) -> dict[str, Any]:
    return {"podUid": f"uid-{namespace}-{pod}", "namespace": namespace, "pod": pod, "gpuShare": 0.5, "seq": seq,
            "gpuSeconds": gpu_seconds, **extra}


def test_set_get_and_list_a_budget(api: SpecClient) -> None:
    created = api.put(
        "/api/v1/budgets/team-a", json={"gpuMinutes": 6000, "period": "monthly", "evictOnExhaustion": True}
    )
    assert created.status_code == 201
    assert created.json == {
        "namespace": "team-a",
        "gpuMinutes": 6000.0,
        "period": "monthly",
        "periodStart": "2028-02-01T00:00:00Z",
        "periodEnd": "2028-03-01T00:00:00Z",
        "usedGpuMinutes": 0.0,
        "remainingGpuMinutes": 6000.0,
        "topUpGpuMinutes": 0.0,
        "percentUsed": 0.0,
        "evictOnExhaustion": True,
        "state": "in-budget",
        "ownState": "in-budget",
        "limitedBy": "team-a",
        "kind": "namespace",
        "parent": None,
        "ancestors": [],
        "managedBy": None,
        "warningThresholds": [80, 95],
        "admission": "open",
        "onShortfall": "demote",
        "warnings": [],
        "idle": None,
        "idleInForce": None,
        "idleHolds": [],
        # Without a Kubernetes API the timekeeper does not see the cluster's pods: their commitments are not known.
        "committedGpuMinutes": None,
        "uncommitted": None,
    }
    changed = api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 10, "period": "daily"})
    assert changed.status_code == 200
    assert changed.json["period"] == "daily" and changed.json["evictOnExhaustion"] is False
    assert api.as_(READER).get("/api/v1/budgets").json["items"] == [changed.json]
    assert api.as_(READER).get("/api/v1/budgets/team-a").json == changed.json


def test_reports_are_charged_exactly_once(api: SpecClient) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 3})
    meter = api.as_(METER)
    answers = [meter.post("/api/v1/reports", json=report(seq, gs)).json for seq, gs in
               [(1, 30), (2, 60), (2, 60), (1, 30), (4, 120), (3, 90), (5, 100)]]
    assert [(a["outcome"], a["chargedGpuSeconds"]) for a in answers] == [
        ("charged", 30.0), ("charged", 30.0), ("duplicate", 0.0), ("duplicate", 0.0),
        ("charged", 60.0), ("duplicate", 0.0), ("regressed", 0.0),
    ]
    assert api.get("/api/v1/budgets/team-a").json["usedGpuMinutes"] == 2.0


def test_the_report_that_reaches_the_budget_flips_the_state_at_once(api: SpecClient) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1})
    meter = api.as_(METER)
    assert meter.post("/api/v1/reports", json=report(1, 59.5)).json["state"] == "warning"  # above 80 %
    assert meter.post("/api/v1/reports", json=report(2, 60)).json["state"] == "over-budget"
    assert api.get("/api/v1/budgets").json["items"][0]["state"] == "over-budget"


def test_nothing_changes_after_a_final_report(api: SpecClient) -> None:
    meter = api.as_(METER)
    meter.post("/api/v1/reports", json=report(1, 30, final=True))
    late = meter.post("/api/v1/reports", json=report(2, 3000)).json
    assert late["outcome"] == "after-final" and late["chargedGpuSeconds"] == 0.0
    assert api.get("/api/v1/budgets/team-a").json["usedGpuMinutes"] == 0.5


def test_top_ups_raise_the_current_period_and_bring_a_namespace_back(api: SpecClient) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "period": "daily"})
    api.as_(METER).post("/api/v1/reports", json=report(1, 90))
    assert api.get("/api/v1/budgets/team-a").json["state"] == "over-budget"
    topped = api.post("/api/v1/budgets/team-a/top-ups", json={"gpuMinutes": 1, "reason": "paper deadline"})
    assert topped.status_code == 201
    assert topped.json["topUpGpuMinutes"] == 1.0 and topped.json["remainingGpuMinutes"] == 0.5
    assert topped.json["state"] == "in-budget"


def test_a_new_period_starts_from_zero_and_top_ups_stay_in_theirs(api: SpecClient, clock: Clock) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "period": "daily"})
    api.post("/api/v1/budgets/team-a/top-ups", json={"gpuMinutes": 5, "reason": "x"})
    api.as_(METER).post("/api/v1/reports", json=report(1, 120))
    assert api.get("/api/v1/budgets/team-a").json["usedGpuMinutes"] == 2.0
    clock.advance(hours=1)  # 2028-02-29, a leap day: a new daily period
    status = api.get("/api/v1/budgets/team-a").json
    assert (status["periodStart"], status["usedGpuMinutes"], status["topUpGpuMinutes"], status["state"]) == (
        "2028-02-29T00:00:00Z", 0.0, 0.0, "in-budget")
    # Consumption is charged to the period in which it is reported, however long the pod has run.
    api.as_(METER).post("/api/v1/reports", json=report(2, 150))
    assert api.get("/api/v1/budgets/team-a").json["usedGpuMinutes"] == 0.5


def test_a_monthly_budget_sums_the_days_of_its_month(api: SpecClient, clock: Clock) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 100, "period": "monthly"})
    meter = api.as_(METER)
    meter.post("/api/v1/reports", json=report(1, 60))  # 28 February
    clock.advance(hours=2)  # 29 February
    meter.post("/api/v1/reports", json=report(2, 180))
    assert api.get("/api/v1/budgets/team-a").json["usedGpuMinutes"] == 3.0
    clock.advance(days=1)  # 1 March: a new month
    assert api.get("/api/v1/budgets/team-a").json["usedGpuMinutes"] == 0.0


def test_the_listing_holds_namespaces_with_use_but_no_budget(make_app: AppFactory) -> None:
    api = SpecClient(make_app(default_gpu_minutes=1.0).test_client(), ADMIN)
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 100, "period": "weekly"})
    api.as_(METER).post("/api/v1/reports", json=report(1, 120, namespace="team-b"))
    items = api.get("/api/v1/budgets").json["items"]
    assert [(i["namespace"], i["gpuMinutes"], i["period"], i["state"]) for i in items] == [
        ("team-a", 100.0, "weekly", "in-budget"),
        ("team-b", 1.0, "monthly", "over-budget"),  # TIMEKEEPER_DEFAULT_GPU_MINUTES, default period
    ]


@pytest.mark.parametrize(
    ("default_gpu_minutes", "state"), [(None, "unlimited"), (0.0, "over-budget"), (600.0, "in-budget")]
)
def test_the_listing_tells_the_default_budget_and_the_state_of_a_namespace_it_leaves_out(
    make_app: AppFactory, default_gpu_minutes: float | None, state: str
) -> None:
    api = SpecClient(
        make_app(default_gpu_minutes=default_gpu_minutes, default_period=Period.WEEKLY).test_client(), ADMIN
    )
    listing = api.get("/api/v1/budgets").json
    assert listing.pop("listedAt") > 0  # the database's time
    assert listing == {"items": [], "default": {"gpuMinutes": default_gpu_minutes, "period": "weekly", "state": state}}
    assert api.get("/api/v1/budgets/newteam").json["state"] == state


def test_the_listing_holds_a_namespace_topped_up_under_the_default_before_any_use(make_app: AppFactory) -> None:
    api = SpecClient(make_app(default_gpu_minutes=0.0).test_client(), ADMIN)
    api.post("/api/v1/budgets/newteam/top-ups", json={"gpuMinutes": 30, "reason": "first experiments"})
    [item] = api.get("/api/v1/budgets").json["items"]
    assert (item["namespace"], item["gpuMinutes"], item["topUpGpuMinutes"], item["state"]) == (
        "newteam",
        0.0,
        30.0,
        "in-budget",
    )


def test_the_webhook_sees_every_namespace_as_the_timekeeper_does(make_app: AppFactory, tmp_path: Path) -> None:
    """The webhook's cache against the real listing: with a default of 0 a new namespace is over budget at admission."""
    app = make_app(default_gpu_minutes=0.0)
    api = SpecClient(app.test_client(), ADMIN)
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 60})
    api.post("/api/v1/budgets/topped/top-ups", json={"gpuMinutes": 1, "reason": "x"})
    (tmp_path / "token").write_text(READER)
    with served(app) as url:
        cache = BudgetStateCache(url, str(tmp_path / "token"))
        assert cache.refresh()
        for namespace in ("team-a", "topped", "newteam"):
            assert str(cache.state_of(namespace)) == api.get(f"/api/v1/budgets/{namespace}").json["state"], namespace
        assert cache.state_of("newteam") is BudgetState.OVER_BUDGET


def test_patch_changes_only_what_it_names_and_starts_from_the_default(make_app: AppFactory) -> None:
    api = SpecClient(make_app(default_gpu_minutes=600.0, default_period=Period.WEEKLY).test_client(), ADMIN)
    created = api.patch("/api/v1/budgets/team-a", json={"evictOnExhaustion": True})
    assert created.status_code == 201
    assert (created.json["gpuMinutes"], created.json["period"], created.json["evictOnExhaustion"]) == (
        600.0,
        "weekly",
        True,
    )
    changed = api.patch("/api/v1/budgets/team-a", json={"gpuMinutes": 90})
    assert changed.status_code == 200
    assert (changed.json["gpuMinutes"], changed.json["period"], changed.json["evictOnExhaustion"]) == (
        90.0,
        "weekly",
        True,
    )
    unlimited = api.patch("/api/v1/budgets/team-a", json={"gpuMinutes": None, "period": "daily"}).json
    assert (unlimited["state"], unlimited["period"], unlimited["evictOnExhaustion"]) == ("unlimited", "daily", True)
    assert [c["action"] for c in api.get("/api/v1/budgets/team-a/changes").json["items"]] == ["set", "set", "set"]


def test_safe_admissions_settings_are_kept_read_changed_and_audited(api: SpecClient) -> None:
    created = api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 60, "admission": "safe", "onShortfall": "refuse"})
    assert created.status_code == 201 and (created.json["admission"], created.json["onShortfall"]) == ("safe", "refuse")
    assert api.as_(READER).get("/api/v1/budgets/team-a").json == created.json
    assert api.as_(READER).get("/api/v1/budgets").json["items"] == [created.json]
    stricter = api.patch("/api/v1/budgets/team-a", json={"admission": "strict"}).json
    assert (stricter["admission"], stricter["onShortfall"], stricter["gpuMinutes"]) == ("strict", "refuse", 60.0)
    demoting = api.patch("/api/v1/budgets/team-a", json={"onShortfall": "demote"}).json
    assert (demoting["admission"], demoting["onShortfall"]) == ("strict", "demote")
    # A PUT says the whole budget: what it leaves out is the default again.
    reset = api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 60}).json
    assert (reset["admission"], reset["onShortfall"]) == ("open", "demote")
    changes = api.get("/api/v1/budgets/team-a/changes").json["items"]
    assert [(c["before"] or {}).get("admission") for c in changes] == [None, "safe", "strict", "strict"]
    assert [c["after"]["onShortfall"] for c in changes] == ["refuse", "refuse", "demote", "demote"]
    group = api.put("/api/v1/budgets/team.vision", json={"gpuMinutes": 600, "admission": "safe"})
    assert group.status_code == 201 and group.json["admission"] == "safe"


def test_a_namespace_without_a_budget_of_its_own_admits_openly(make_app: AppFactory) -> None:
    api = SpecClient(make_app(default_gpu_minutes=600.0).test_client(), ADMIN)
    default = api.get("/api/v1/budgets/team-a").json
    assert (default["admission"], default["onShortfall"]) == ("open", "demote")
    patched = api.patch("/api/v1/budgets/team-a", json={"admission": "safe"})
    assert patched.status_code == 201 and (patched.json["admission"], patched.json["gpuMinutes"]) == ("safe", 600.0)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "name at least one of gpuMinutes, period, evictOnExhaustion"),
        ({"period": "yearly"}, "period must be one of daily, weekly, monthly, none, not 'yearly'"),
        ({"evictOnExhaustion": "yes"}, "evictOnExhaustion must be true or false"),
        ({"admission": "x"}, "admission must be one of open, safe, strict, not 'x'"),
        ({"onShortfall": True}, "onShortfall must be one of demote, refuse, not True"),
        ({"gpuMinutes": -1}, "gpuMinutes must be a finite number, at least 0"),
        ({"reason": "x"}, "unknown field(s): reason"),
    ],
)
def test_a_bad_patch_is_refused_and_changes_nothing(api: SpecClient, body: dict[str, Any], message: str) -> None:
    answer = api.patch("/api/v1/budgets/team-a", json=body)
    assert answer.status_code == 400 and message in answer.json["error"]
    assert api.get("/api/v1/budgets").json["items"] == []
    assert api.as_(READER).patch("/api/v1/budgets/team-a", json={"gpuMinutes": 1}).status_code == 403


def test_a_budget_without_period_never_renews(api: SpecClient, clock: Clock) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 10, "period": "none"})
    api.as_(METER).post("/api/v1/reports", json=report(1, 120))
    clock.advance(days=400)
    api.as_(METER).post("/api/v1/reports", json=report(2, 240))
    status = api.get("/api/v1/budgets").json["items"][0]
    assert (status["periodStart"], status["periodEnd"], status["usedGpuMinutes"]) == ("1970-01-01T00:00:00Z", None, 4.0)


def test_without_a_default_a_namespace_without_budget_is_unlimited(api: SpecClient) -> None:
    api.as_(METER).post("/api/v1/reports", json=report(1, 6000, namespace="team-c"))
    status = api.get("/api/v1/budgets/team-c").json
    assert (status["gpuMinutes"], status["remainingGpuMinutes"], status["state"], status["usedGpuMinutes"]) == (
        None, None, "unlimited", 100.0)


def test_an_explicit_unlimited_budget_exempts_from_the_default(make_app: AppFactory) -> None:
    api = SpecClient(make_app(default_gpu_minutes=0.0).test_client(), ADMIN)
    assert api.get("/api/v1/budgets/ops").json["state"] == "over-budget"
    assert api.put("/api/v1/budgets/ops", json={"gpuMinutes": None}).json["state"] == "unlimited"
    refused = api.post("/api/v1/budgets/ops/top-ups", json={"gpuMinutes": 5, "reason": "x"})
    assert refused.status_code == 409 and "no limit" in refused.json["error"]


def test_removing_a_budget_restores_the_default_and_a_second_removal_is_404(api: SpecClient) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 5})
    removed = api.delete("/api/v1/budgets/team-a")
    assert removed.status_code == 200 and removed.json["state"] == "unlimited"
    again = api.delete("/api/v1/budgets/team-a")
    assert again.status_code == 404 and again.json == {"error": "namespace team-a has no budget of its own"}


def test_every_budget_change_is_audited_with_who_when_before_and_after(api: SpecClient) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 5})
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 7})
    api.post("/api/v1/budgets/team-a/top-ups", json={"gpuMinutes": 2, "reason": "demo day"})
    api.delete("/api/v1/budgets/team-a")
    changes = api.as_(READER).get("/api/v1/budgets/team-a/changes").json["items"]
    assert [(c["action"], c["actor"]) for c in changes] == [("set", "alice")] * 2 + [
        ("top-up", "alice"),
        ("remove", "alice"),
    ]
    assert changes[0]["before"] is None and changes[0]["after"]["gpuMinutes"] == 5.0
    assert changes[1]["before"]["gpuMinutes"] == 5.0 and changes[1]["after"]["gpuMinutes"] == 7.0
    assert changes[2]["after"]["reason"] == "demo day" and changes[2]["after"]["topUpGpuMinutes"] == 2.0
    assert changes[3]["before"]["gpuMinutes"] == 7.0 and changes[3]["after"] is None
    assert all(c["changedAt"] == "2028-02-28T23:00:00Z" for c in changes)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (report(1, -5), "gpuSeconds must be a finite number from 0"),
        (report(1, 1e300), "gpuSeconds must be a finite number from 0"),
        ({**report(1, 5), "gpuShare": -0.5}, "gpuShare must be a finite number"),
        ({**report(1, 5), "seq": 1.5}, "seq must be a whole number"),
        ({**report(1, 5), "seq": "1"}, "seq must be a whole number"),
        ({**report(1, 5), "gpuSeconds": "5"}, "gpuSeconds must be a number"),
        ({**report(1, 5), "final": "yes"}, "final must be true or false"),
        ({**report(1, 5), "bonusGpuSeconds": 5}, "unknown field(s): bonusGpuSeconds"),
        ({"podUid": "x"}, "missing field(s): namespace, pod, gpuShare, seq, gpuSeconds"),
        ({**report(1, 5), "podUid": ""}, "podUid must be a non-empty string"),
        ({**report(1, 5), "podUid": "uid\x00"}, "podUid 'uid\\x00' is not a uid"),
        ({**report(1, 5), "namespace": "ML-Team "}, "namespace 'ML-Team ' is not a namespace name"),
        ({**report(1, 5), "namespace": ".."}, "namespace '..' is not a namespace name"),
        ({**report(1, 5), "namespace": "'; DROP TABLE budgets; --"}, "is not a namespace name: lower-case letters"),
        ({**report(1, 5), "namespace": "a" * 64}, "at most 63 characters"),
        ({**report(1, 5), "pod": "Trainer"}, "pod 'Trainer' is not a pod name"),
        ({**report(1, 5), "pod": "trainer..0"}, "is not a pod name"),
        ({**report(1, 5), "gpuShare": 1001}, "gpuShare must be a finite number from 0 to 1000"),
        ({**report(1, 5), "gpuUtilizationPercent": 140}, "gpuUtilizationPercent must be a finite number from 0 to 100"),
        ([report(1, 5)], "the report must be a JSON object"),
    ],
)
def test_bad_reports_are_refused_with_a_message_and_change_nothing(api: SpecClient, body: object, message: str) -> None:
    answer = api.as_(METER).post("/api/v1/reports", json=body)
    assert answer.status_code == 400 and message in answer.json["error"]
    assert api.get("/api/v1/budgets").json["items"] == []


@pytest.mark.parametrize(
    ("literal", "message"),
    [
        ("NaN", "NaN is not a finite number"),
        ("Infinity", "Infinity is not a finite number"),
        ("-Infinity", "-Infinity is not a finite number"),
        ("1e999", "1e999 is not a finite number"),
        ("9" * 400, "a number has more than 32 characters"),
        ("5, \"gpuSeconds\": 1e6", "the key 'gpuSeconds' appears twice in one object"),
    ],
)
def test_numbers_are_bounded_and_keys_unique_as_the_body_is_read(api: SpecClient, literal: str, message: str) -> None:
    body = json.dumps(report(1, 5)).replace('"gpuSeconds": 5', f'"gpuSeconds": {literal}')
    answer = api.as_(METER).post("/api/v1/reports", data=body, content_type="application/json")
    assert answer.status_code == 400 and message in answer.json["error"]
    for path in ("/api/v1/budgets/team-a", "/api/v1/budgets/team-a/top-ups"):
        number = literal.replace("gpuSeconds", "gpuMinutes")
        budget = json.dumps({"gpuMinutes": 5}).replace('"gpuMinutes": 5', f'"gpuMinutes": {number}')
        answer = api.request(
            "PUT" if path.endswith("team-a") else "POST", path, data=budget, content_type="application/json"
        )
        assert answer.status_code == 400 and message.replace("gpuSeconds", "gpuMinutes") in answer.json["error"]
    assert api.get("/api/v1/budgets").json["items"] == []


def test_a_body_that_is_not_json_is_refused(api: SpecClient) -> None:
    answer = api.as_(METER).post("/api/v1/reports", data="seq=1", content_type="application/json")
    assert answer.status_code == 400 and answer.json["error"].startswith("the body is not JSON: Expecting value")
    put = api.put("/api/v1/budgets/team-a", data="{", content_type="application/json")
    assert put.status_code == 400 and "the body is not JSON" in put.json["error"]
    form = api.as_(METER).post("/api/v1/reports", data=json.dumps(report(1, 5)), content_type="text/plain")
    assert form.status_code == 400 and form.json["error"] == "the body is not JSON (Content-Type: application/json)"
    deep = api.as_(METER).post("/api/v1/reports", data="[" * 10_000 + "]" * 10_000, content_type="application/json")
    assert deep.status_code == 400 and deep.json["error"] == "the body is nested more than 100 levels deep"
    large = api.as_(METER).post("/api/v1/reports", data="[" * 100_000 + "]" * 100_000, content_type="application/json")
    assert (
        large.status_code == 413
        and large.json["error"] == "the body is larger than the 65536 bytes the timekeeper reads"
    )


@pytest.mark.parametrize("namespace", ["ML-Team%20", "a%00", "-a", "a" * 64])
def test_every_endpoint_checks_namespaces_with_the_same_rule(api: SpecClient, namespace: str) -> None:
    for method, suffix, body in (("GET", "", None), ("PUT", "", {"gpuMinutes": 1}), ("DELETE", "", None),
                                 ("POST", "/top-ups", {"gpuMinutes": 1, "reason": "r"}), ("GET", "/changes", None)):
        answer = api.request(method, f"/api/v1/budgets/{namespace}{suffix}", json=body)
        assert answer.status_code == 400 and "is not a namespace name" in answer.json["error"], (method, suffix)
    listing = api.get(f"/api/v1/pods?namespace={namespace}")
    assert listing.status_code == 400 and "is not a namespace name" in listing.json["error"]


def test_a_pod_cannot_move_to_another_namespace(api: SpecClient) -> None:
    meter = api.as_(METER)
    meter.post("/api/v1/reports", json=report(1, 60))
    moved = meter.post("/api/v1/reports", json={**report(2, 120), "namespace": "team-b"})
    assert moved.status_code == 400 and "reports in namespace team-a, not team-b" in moved.json["error"]


def test_bad_budget_requests_get_400(api: SpecClient) -> None:
    bad = api.put("/api/v1/budgets/team-a", json={"gpuMinutes": -1})
    assert bad.status_code == 400 and "gpuMinutes must be a finite number" in bad.json["error"]
    unsafe = api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "admission": "unsafe"})
    assert (
        unsafe.status_code == 400
        and unsafe.json["error"] == "admission must be one of open, safe, strict, not 'unsafe'"
    )
    shortfall = api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "onShortfall": "wait"})
    assert (
        shortfall.status_code == 400
        and shortfall.json["error"] == "onShortfall must be one of demote, refuse, not 'wait'"
    )
    assert api.put("/api/v1/budgets/Not_A_Namespace", json={"gpuMinutes": 1}).status_code == 400
    assert api.get("/api/v1/budgets/team-a").json["gpuMinutes"] is None


@pytest.mark.parametrize(
    ("token", "method", "path", "body", "status"),
    [
        (None, "GET", "/api/v1/budgets", None, 401),
        ("wrong", "GET", "/api/v1/budgets", None, 401),
        (READER, "PUT", "/api/v1/budgets/team-a", {"gpuMinutes": 1}, 403),
        (METER, "PUT", "/api/v1/budgets/team-a", {"gpuMinutes": 1}, 403),
        (METER, "DELETE", "/api/v1/budgets/team-a", None, 403),
        (READER, "POST", "/api/v1/budgets/team-a/top-ups", {"gpuMinutes": 1, "reason": "x"}, 403),
        (READER, "POST", "/api/v1/reports", report(1, 5), 403),
        (None, "POST", "/api/v1/reports", report(1, 5), 401),
    ],
)
def test_static_roles(api: SpecClient, token: str | None, method: str, path: str, body: Any, status: int) -> None:
    answer = api.as_(token).request(method, path, json=body)
    assert answer.status_code == status and answer.json["error"]
    if status == 401:
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")


def test_pods_over_their_memory_request_are_listed(api: SpecClient, clock: Clock) -> None:
    meter = api.as_(METER)
    meter.post("/api/v1/reports", json=report(1, 10, pod="greedy", gpuMemoryUsedMiB=12000, gpuMemoryRequestedMiB=8192,
                                             gpuUtilizationPercent=97))
    meter.post("/api/v1/reports", json=report(1, 10, pod="modest", gpuMemoryUsedMiB=4000, gpuMemoryRequestedMiB=8192))
    meter.post("/api/v1/reports", json=report(1, 10, pod="blind"))  # no NVML in this pod
    meter.post(
        "/api/v1/reports", json=report(1, 10, pod="done", gpuMemoryUsedMiB=9000, gpuMemoryRequestedMiB=10, final=True)
    )
    over = api.as_(READER).get("/api/v1/pods?overMemory=true").json["items"]
    assert [(p["pod"], p["gpuMemoryOverRequestMiB"], p["gpuUtilizationPercent"]) for p in over] == [
        ("greedy", 3808.0, 97.0)
    ]
    everyone = api.get("/api/v1/pods?namespace=team-a").json["items"]
    assert [p["pod"] for p in everyone] == ["blind", "done", "greedy", "modest"]
    clock.advance(hours=1)  # a pod not heard from for long no longer holds the memory
    assert api.get("/api/v1/pods?overMemory=true").json["items"] == []


def test_a_pod_is_found_by_its_uid_as_a_preempted_pod_s_event_names_it(api: SpecClient) -> None:
    meter = api.as_(METER)
    for name in ("first", "second"):
        meter.post("/api/v1/reports", json=report(1, 10, pod=name))
    everyone = {p["pod"]: p["podUid"] for p in api.get("/api/v1/pods").json["items"]}
    found = api.get(f"/api/v1/pods?uid={everyone['second']}").json["items"]
    assert [(p["namespace"], p["pod"]) for p in found] == [("team-a", "second")]
    assert api.get("/api/v1/pods?uid=no-such-pod").json["items"] == []
    refused = api.get("/api/v1/pods?uid=a%20b")
    assert refused.status_code == 400 and "uid must be a pod's UID" in refused.json["error"]


def test_the_latest_readings_are_kept_and_stale_ones_ignored(api: SpecClient) -> None:
    meter = api.as_(METER)
    meter.post("/api/v1/reports", json=report(2, 20, gpuMemoryUsedMiB=9000, gpuMemoryRequestedMiB=8000))
    meter.post("/api/v1/reports", json=report(1, 10, gpuMemoryUsedMiB=100, gpuMemoryRequestedMiB=8000))  # late
    pod = api.get("/api/v1/pods").json["items"][0]
    assert (pod["seq"], pod["gpuSeconds"], pod["gpuMemoryUsedMiB"]) == (2, 20.0, 9000.0)


@pytest.mark.parametrize(
    "query", ["overMemory=yes", "limit=0", "limit=abc", "namespace=Bad_NS", "limit=%C2%B2", "limit=" + "9" * 5000]
)
def test_bad_pod_queries_get_400(api: SpecClient, query: str) -> None:
    assert api.get(f"/api/v1/pods?{query}").status_code == 400


def test_health(api: SpecClient) -> None:
    assert api.as_(None).get("/livez").json == {"status": "ok"}
    assert api.as_(None).get("/readyz").json == {"status": "ok"}


def test_metrics_show_budgets_reports_and_memory_overruns(app: Flask, api: SpecClient) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 2})
    api.as_(METER).post("/api/v1/reports", json=report(1, 180, gpuMemoryUsedMiB=2048, gpuMemoryRequestedMiB=1024))
    api.as_(METER).post("/api/v1/reports", json=report(1, 180))
    text = api.as_(None).get("/metrics").data.decode()
    for line in (
        'gpusharing_timekeeper_budget_gpu_seconds{namespace="team-a"} 120.0',
        'gpusharing_timekeeper_used_gpu_seconds{namespace="team-a"} 180.0',
        'gpusharing_timekeeper_remaining_gpu_seconds{namespace="team-a"} 0.0',
        'gpusharing_timekeeper_budget_state{namespace="team-a",state="over-budget"} 1.0',
        'gpusharing_timekeeper_budget_state{namespace="team-a",state="warning"} 0.0',
        'gpusharing_timekeeper_budget_info{kind="namespace",limited_by="team-a",namespace="team-a",parent=""} 1.0',
        'gpusharing_timekeeper_pod_gpu_seconds{namespace="team-a",pod="trainer"} 180.0',
        "gpusharing_timekeeper_meters_silent 0.0",
        'gpusharing_timekeeper_pod_gpu_memory_over_request_bytes{namespace="team-a",pod="trainer"} 1.073741824e+09',
        'gpusharing_timekeeper_reports_total{outcome="duplicate"}',
        "gpusharing_timekeeper_request_duration_seconds_bucket",
    ):
        assert line in text


def test_meters_gone_quiet_are_counted_and_let_go_after_an_hour(app: Flask, api: SpecClient, clock: Clock) -> None:
    meter = api.as_(METER)
    meter.post("/api/v1/reports", json=report(1, 30, pod="quiet"))
    meter.post("/api/v1/reports", json=report(1, 30, pod="done", final=True))

    def silent() -> str:
        return next(
            line
            for line in api.get("/metrics").data.decode().splitlines()
            if line.startswith("gpusharing_timekeeper_meters_silent ")
        )

    assert silent().endswith(" 0.0")
    clock.advance(seconds=fresh_for(DEFAULT_METER_INTERVAL_SECONDS))  # two meter intervals: not yet silent
    assert silent().endswith(" 0.0")
    clock.advance(seconds=1)
    assert silent().endswith(" 1.0")  # the finished pod is not silent, the other is
    clock.advance(minutes=60)
    assert silent().endswith(" 0.0")


def test_metrics_may_require_a_token(make_app: AppFactory) -> None:
    api = SpecClient(make_app(metrics_auth="token").test_client())
    refused = api.get("/metrics")
    assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Bearer")
    assert api.as_("wrong").get("/metrics").status_code == 401
    assert "gpusharing_timekeeper_reports_total" in api.as_(READER).get("/metrics").data.decode()


def test_unknown_paths_and_methods_answer_json_errors(api: SpecClient) -> None:
    missing = api.client.get("/api/v1/nothing")
    assert missing.status_code == 404 and missing.get_json()["error"]
    wrong = api.client.post("/api/v1/budgets/team-a")
    assert wrong.status_code == 405 and wrong.get_json()["error"]


def test_every_route_is_in_openapi_and_every_documented_operation_is_served(app: Flask) -> None:
    from tests.timekeeper.conftest import SPEC

    served = {
        (rule.rule.replace("<", "{").replace(">", "}"), method.lower())
        for rule in app.url_map.iter_rules()
        if rule.endpoint != "static"
        for method in rule.methods or ()
        if method not in ("HEAD", "OPTIONS")
    }
    documented = {(path, method) for path, item in SPEC["paths"].items() for method in item if method != "parameters"}
    assert served == documented


def test_a_report_the_database_refuses_fails_alone(app: Flask, api: SpecClient) -> None:
    queue: ReportQueue = app.extensions["reports"]
    record = queue.ledger.record

    def refuse_a_poisoned_batch(reports: Any) -> Any:
        if any(r.pod == "poison" for r, _ in reports):
            raise RuntimeError("the database refused the transaction")
        return record(reports)

    queue.ledger.record = refuse_a_poisoned_batch  # type: ignore[method-assign]
    good, bad = MeterReport.from_json(report(1, 30)), MeterReport.from_json(report(1, 30, pod="poison"))
    results = queue.account([(good, None), (bad, None)])
    assert isinstance(results[1], RuntimeError)
    assert not isinstance(results[0], BaseException) and results[0].charged_micro_gpu_seconds == 30 * MICROS_PER_SECOND
    assert api.get("/api/v1/budgets/team-a").json["usedGpuMinutes"] == 0.5


def test_a_report_whose_transaction_outlasts_the_wait_is_503_and_its_retry_is_not_counted_twice(
    app: Flask, api: SpecClient
) -> None:
    queue: ReportQueue = app.extensions["reports"]
    record, released = queue.ledger.record, threading.Event()

    def slow_transaction(reports: Any) -> Any:
        released.wait(10)
        return record(reports)

    queue.ledger.record = slow_transaction  # type: ignore[method-assign]
    queue.timeout = 0.05
    busy = api.as_(METER).post("/api/v1/reports", json=report(1, 30))
    assert busy.status_code == 503
    assert busy.json["error"] == "the ledger is busy, try again (a retried report is never counted twice)"
    released.set()
    queue.timeout = 10
    retried = api.as_(METER).post("/api/v1/reports", json=report(1, 30)).json
    assert retried["outcome"] == "duplicate" and retried["chargedGpuSeconds"] == 0.0
    assert api.get("/api/v1/budgets/team-a").json["usedGpuMinutes"] == 0.5
