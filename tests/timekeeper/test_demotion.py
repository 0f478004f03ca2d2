"""Namespaces over budget: an Event on the namespace, evictions through the Eviction API, promotion back."""

from __future__ import annotations

import time
from typing import Any

import pytest
from flask import Flask

from gpusharing.settings.env import ConfigError
from tests.fakekube import FakeKube
from tests.timekeeper.conftest import METER, AppFactory, Clock, SpecClient
from timekeeper.cluster.controller import Controller, ControllerPass
from timekeeper.cluster.demotion import eviction_candidates
from timekeeper.cluster.kube import KubeApi
from webhook.config import WebhookConfig


@pytest.fixture
def app(make_app: AppFactory, fake_kube: FakeKube) -> Flask:
    return make_app(kube=KubeApi(fake_kube.api_client()))


@pytest.fixture
def demoter(app: Flask) -> Controller:
    controller: Controller = app.extensions["controller"]
    return controller


def spend(api: SpecClient, namespace: str, gpu_seconds: float, seq: int = 1) -> dict[str, Any]:
    body = {"podUid": f"uid-{namespace}", "namespace": namespace, "pod": "meter-owner", "gpuShare": 1.0, "seq": seq,
            "gpuSeconds": gpu_seconds}
    answer: dict[str, Any] = api.as_(METER).post("/api/v1/reports", json=body).json
    return answer


def test_crossing_records_one_event_on_the_namespace(api: SpecClient, demoter: Controller, fake_kube: FakeKube) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1})
    spend(api, "team-a", 30)
    assert demoter.run_once().events == []  # type: ignore[union-attr]
    spend(api, "team-a", 61, seq=2)
    assert demoter.run_once().events == [("team-a", "GPUBudgetExhausted")]  # type: ignore[union-attr]
    assert demoter.run_once().events == []  # type: ignore[union-attr]
    (event,) = fake_kube.events
    # A Namespace is cluster-scoped: its Events live in `default` and name its uid (what `kubectl describe` selects).
    assert event["metadata"]["namespace"] == "default"
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Namespace", "name": "team-a", "uid": fake_kube.namespace_uid("team-a")}
    assert event["type"] == "Warning" and event["reason"] == "GPUBudgetExhausted"
    assert "1.0 of 1 GPU-minutes used in the monthly period" in event["message"]
    assert fake_kube.evicted == []  # evictOnExhaustion is off


def test_running_in_budget_gpu_pods_are_evicted_and_the_rest_left_alone(
    api: SpecClient, demoter: Controller, fake_kube: FakeKube
) -> None:
    for name in ("trainer-1", "trainer-2"):
        fake_kube.add_pod("team-a", name)
    fake_kube.add_pod("team-a", "demoted", priority_class="gpusharing-over-budget")
    fake_kube.add_pod("team-a", "cpu-only", share=None)
    fake_kube.add_pod("team-a", "pending", phase="Pending")
    fake_kube.add_pod("team-b", "elsewhere")
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "evictOnExhaustion": True})
    spend(api, "team-a", 60)
    done = demoter.run_once()
    assert done is not None and done.evicted == ["team-a/trainer-1", "team-a/trainer-2"]
    assert fake_kube.evicted == [("team-a", "trainer-1"), ("team-a", "trainer-2")]
    assert fake_kube.count("DELETE", "/api/v1") == 0  # evicted through the Eviction API, never deleted


def test_evictions_wait_until_every_webhook_process_holds_a_listing_that_shows_the_crossing(
    api: SpecClient, demoter: Controller, fake_kube: FakeKube
) -> None:
    fake_kube.add_pod("team-a", "trainer")
    poll = "/api/v1/budgets?webhook={}&inForce={}&refreshSeconds=5"
    before = {name: api.get(poll.format(name, 0)).json["listedAt"] for name in ("replica-1", "replica-2")}
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "evictOnExhaustion": True})
    spend(api, "team-a", 90)
    for name, listed in before.items():  # both hold a listing from before the crossing
        api.get(poll.format(name, listed))
    assert demoter.run_once().waiting == ["team-a"] and fake_kube.evicted == []  # type: ignore[union-attr]
    after = api.get(poll.format("replica-1", before["replica-1"])).json
    assert [i["state"] for i in after["items"]] == ["over-budget"]
    api.get(poll.format("replica-1", after["listedAt"]))  # replica-1 now holds it; replica-2 not yet
    assert demoter.run_once().waiting == ["team-a"] and fake_kube.evicted == []  # type: ignore[union-attr]
    api.get(poll.format("replica-2", api.get(poll.format("replica-2", before["replica-2"])).json["listedAt"]))
    assert demoter.run_once().evicted == ["team-a/trainer"]  # type: ignore[union-attr]


def test_a_poll_that_names_itself_wrongly_is_refused_with_the_rule(api: SpecClient) -> None:
    for query, rule in (("webhook=a%20b", "webhook must be 1 to 253 letters"), ("webhook=w&inForce=nan", "inForce must be a number"),
                        ("webhook=w&refreshSeconds=1e9", "refreshSeconds must be a number from 0.1 to 3600")):
        refused = api.get(f"/api/v1/budgets?{query}")
        assert refused.status_code == 400 and rule in refused.json["error"]


@pytest.mark.parametrize(("raw", "polls"), [("0.1", True), ("3600", True), ("0.09", False), ("3600.5", False)])
def test_a_webhook_polls_at_a_refresh_the_timekeeper_accepts_or_does_not_start(api: SpecClient, raw: str, polls: bool) -> None:
    """The bounds of GPUSHARING_BUDGET_REFRESH_SECONDS are those of the poll's refreshSeconds (the contract's)."""
    try:
        refresh = str(WebhookConfig.from_env({"GPUSHARING_BUDGET_REFRESH_SECONDS": raw}).budget_refresh_seconds)
    except ConfigError:
        refresh = None
    answer = api.get(f"/api/v1/budgets?webhook=w&refreshSeconds={refresh or raw}")
    assert (refresh is not None) is polls is (answer.status_code == 200), answer.json


def test_an_eviction_a_disruption_budget_refuses_is_retried_later_never_forced(
    api: SpecClient, demoter: Controller, fake_kube: FakeKube
) -> None:
    fake_kube.add_pod("team-a", "guarded")
    fake_kube.refuse_evictions.add(("team-a", "guarded"))
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "evictOnExhaustion": True})
    spend(api, "team-a", 90)
    assert demoter.run_once().refused == ["team-a/guarded"]  # type: ignore[union-attr]
    assert demoter.run_once().refused == ["team-a/guarded"]  # type: ignore[union-attr]
    assert fake_kube.evicted == [] and ("team-a", "guarded") in fake_kube.pods
    fake_kube.refuse_evictions.clear()  # the PodDisruptionBudget allows it now
    assert demoter.run_once().evicted == ["team-a/guarded"]  # type: ignore[union-attr]
    assert fake_kube.count("DELETE", "/api/v1") == 0


def test_a_top_up_promotes_back_and_stops_evictions(api: SpecClient, demoter: Controller, fake_kube: FakeKube) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "evictOnExhaustion": True})
    spend(api, "team-a", 90)
    demoter.run_once()
    api.post("/api/v1/budgets/team-a/top-ups", json={"gpuMinutes": 10, "reason": "approved"})
    fake_kube.add_pod("team-a", "recreated")
    done = demoter.run_once()
    assert done is not None and done.events == [("team-a", "GPUBudgetRestored")] and done.evicted == []
    assert fake_kube.events[-1]["type"] == "Normal"


def test_a_raised_budget_and_a_new_period_promote_back(api: SpecClient, clock: Clock) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "period": "daily"})
    assert spend(api, "team-a", 60)["state"] == "over-budget"
    assert api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 2, "period": "daily"}).json["state"] == "in-budget"
    assert api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "period": "daily"}).json["state"] == "over-budget"
    clock.advance(hours=1)
    assert api.get("/api/v1/budgets/team-a").json["state"] == "in-budget"


def test_lowering_a_budget_below_use_demotes(api: SpecClient, demoter: Controller, fake_kube: FakeKube) -> None:
    spend(api, "team-a", 600)
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 5, "evictOnExhaustion": True})
    fake_kube.add_pod("team-a", "trainer")
    done = demoter.run_once()
    assert done is not None and done.events == [("team-a", "GPUBudgetExhausted")] and done.evicted == ["team-a/trainer"]


def test_a_re_created_pod_is_never_free(api: SpecClient) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 10})
    meter = api.as_(METER)
    old = {"podUid": "old-uid", "namespace": "team-a", "pod": "trainer-x1", "gpuShare": 1.0, "seq": 5, "gpuSeconds": 300}
    meter.post("/api/v1/reports", json=old)
    # Evicted and re-created by its controller: a new uid, a new ledger, and the old pod's time still counts.
    new = {**old, "podUid": "new-uid", "pod": "trainer-x2", "seq": 1, "gpuSeconds": 120}
    meter.post("/api/v1/reports", json=new)
    assert api.get("/api/v1/budgets/team-a").json["usedGpuMinutes"] == 7.0
    assert {p["podUid"] for p in api.get("/api/v1/pods").json["items"]} == {"old-uid", "new-uid"}


def test_the_background_demoter_acts_as_soon_as_a_report_crosses(app: Flask, api: SpecClient, fake_kube: FakeKube) -> None:
    demoter: Controller = app.extensions["controller"]
    demoter.interval = 3600.0  # only the wake-up can explain a prompt pass
    fake_kube.add_pod("team-a", "trainer")
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "evictOnExhaustion": True})
    demoter.start()
    try:
        spend(api, "team-a", 60)
        deadline = time.monotonic() + 10  # stops a broken test from hanging; not a speed check
        while not fake_kube.evicted and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        demoter.stop()
    assert fake_kube.evicted == [("team-a", "trainer")]
    assert [e["reason"] for e in fake_kube.events] == ["GPUBudgetExhausted"]


def test_one_demoter_at_a_time(make_app: AppFactory, fake_kube: FakeKube, api: SpecClient) -> None:
    first: Controller = make_app(kube=KubeApi(fake_kube.api_client())).extensions["controller"]
    second: Controller = make_app(kube=KubeApi(fake_kube.api_client())).extensions["controller"]
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 0})
    assert first.run_once() is not None
    assert second.run_once() is None  # the lease is the first's until it lapses
    assert len(fake_kube.events) == 1


def test_an_unreachable_api_server_leaves_the_event_for_the_next_pass(
    api: SpecClient, demoter: Controller, fake_kube: FakeKube
) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 0, "evictOnExhaustion": True})
    fake_kube.up = False
    assert demoter.run_once() is None  # no API, no lease: no one leads
    fake_kube.up, fake_kube.events_up = True, False
    assert demoter.run_once().events == []  # type: ignore[union-attr]
    fake_kube.events_up = True
    assert demoter.run_once().events == [("team-a", "GPUBudgetExhausted")]  # type: ignore[union-attr]


def test_eviction_candidates_are_running_gpu_pods_admitted_in_budget_whatever_their_class() -> None:
    from kubernetes.client import V1ObjectMeta, V1Pod, V1PodSpec, V1PodStatus

    def pod(name: str, cls: str = "gpusharing-in-budget", phase: str = "Running", gpu: bool = True, deleting: bool = False,
            **record: str) -> V1Pod:
        annotations = {"gpusharing.io/gpu-share": "0.25", **{f"gpusharing.io/{k.replace('_', '-')}": v for k, v in record.items()}} if gpu else {}
        metadata = V1ObjectMeta(name=name, uid=f"uid-{name}", annotations=annotations,
                                deletion_timestamp="2028-01-01T00:00:00Z" if deleting else None)
        return V1Pod(metadata=metadata, spec=V1PodSpec(containers=[], priority_class_name=cls), status=V1PodStatus(phase=phase))

    pods = [pod("b", budget_state="in-budget"), pod("a"), pod("allowed-class", cls="research-high", budget_state="warning"),
            pod("demoted", cls="gpusharing-over-budget", budget_state="over-budget"),
            pod("short", cls="gpusharing-over-budget", budget_state="in-budget", safe_admission="demoted"),
            pod("cpu", gpu=False), pod("done", phase="Succeeded"), pod("going", deleting=True)]
    assert eviction_candidates(pods) == [("a", "uid-a"), ("allowed-class", "uid-allowed-class"), ("b", "uid-b")]


def test_a_namespace_deleted_before_its_event_gets_none_and_is_not_tried_again(
    api: SpecClient, demoter: Controller, fake_kube: FakeKube
) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1})
    spend(api, "team-a", 61)
    fake_kube.deleted_namespaces.add("team-a")
    assert demoter.run_once().events == []  # type: ignore[union-attr]
    assert demoter.run_once().events == []  # type: ignore[union-attr]
    assert fake_kube.events == [] and fake_kube.count("GET", "/api/v1/namespaces/team-a") == 1


def test_a_resource_the_watch_delivers_during_a_pass_gets_its_status_from_the_next(
    demoter: Controller, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not Ready (Reconciled) with no figures: the pass applied the resources before the watch brought this one."""
    written: list[str] = []
    monkeypatch.setattr(demoter.kube, "patch_custom_status", lambda resource, namespace, name, body: written.append(name))
    late = {"apiVersion": "gpusharing.io/v1alpha1", "kind": "GPUBudget", "metadata": {"namespace": "team-a", "name": "budget",
                                                                                     "generation": 1}, "spec": {"gpuMinutes": 5}}
    demoter.watches[0].objects = {("team-a", "budget"): late}
    done = ControllerPass()
    demoter._write_statuses({}, {}, done, {})
    assert written == [] and done.statuses_written == []
