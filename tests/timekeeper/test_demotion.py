"""Namespaces over budget: an Event on the namespace, evictions through the Eviction API, promotion back. The
controller's tasks run through make_controller/run_controller against the HTTP fake; the web app beside it on the
same database and clock."""

from __future__ import annotations

import time
from typing import Any

import pytest
from flask import Flask

from demo.kubeapi import FakeKube
from gpusharing.gpu.request import GpuRequestSettings
from gpusharing.settings.env import ConfigError
from tests.timekeeper.conftest import METER, AppFactory, Clock, ControllerFactory, SpecClient, run_controller
from timekeeper.cluster.budgetsync import BudgetPass
from timekeeper.cluster.demotion import eviction_candidates
from timekeeper.cluster.informers import governed_pod
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.manager import ControllerManager
from timekeeper.config import TaskIntervals
from webhook.config import WebhookConfig


@pytest.fixture
def app(make_app: AppFactory, fake_kube: FakeKube) -> Flask:
    return make_app(kube=KubeApi(fake_kube.api_client()))


@pytest.fixture
def demoter(make_controller: ControllerFactory, fake_kube: FakeKube) -> ControllerManager:
    return make_controller(KubeApi(fake_kube.api_client()))


def run(demoter: ControllerManager) -> BudgetPass:
    """The controller's tasks once; what its `budgets` task did (it ran: the controller leads)."""
    done = run_controller(demoter)
    assert done.budgets is not None, "the controller does not lead"
    return done.budgets


def add_running(fake: FakeKube, namespace: str, name: str, **kwargs: Any) -> dict[str, Any]:
    """A pod of the fake; started, when it runs (the record's start: what makes it a running pod to the controller),
    at the clock's start: its meter is not due yet (no MeterSilent Event)."""
    pod = fake.add_pod(namespace, name, **kwargs)
    if pod["status"]["phase"] == "Running":
        pod["status"]["startTime"] = "2028-02-28T23:00:00Z"
    return pod


def spend(api: SpecClient, namespace: str, gpu_seconds: float, seq: int = 1) -> dict[str, Any]:
    body = {"podUid": f"uid-{namespace}", "namespace": namespace, "pod": "meter-owner", "gpuShare": 1.0, "seq": seq,
            "gpuSeconds": gpu_seconds}
    answer: dict[str, Any] = api.as_(METER).post("/api/v1/reports", json=body).json
    return answer


def test_crossing_records_one_event_on_the_namespace(
    api: SpecClient, demoter: ControllerManager, fake_kube: FakeKube
) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1})
    spend(api, "team-a", 30)
    assert run(demoter).events == []
    spend(api, "team-a", 61, seq=2)
    assert run(demoter).events == [("team-a", "GPUBudgetExhausted")]
    assert run(demoter).events == []
    (event,) = fake_kube.events
    # A Namespace is cluster-scoped: its Events live in `default` and name its uid (what `kubectl describe` selects).
    assert event["metadata"]["namespace"] == "default"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "name": "team-a",
        "uid": fake_kube.namespace_uid("team-a"),
    }
    assert event["type"] == "Warning" and event["reason"] == "GPUBudgetExhausted"
    assert "1.0 of 1 GPU-minutes used in the monthly period" in event["message"]
    assert fake_kube.evicted == []  # evictOnExhaustion is off


def test_running_in_budget_gpu_pods_are_evicted_and_the_rest_left_alone(
    api: SpecClient, demoter: ControllerManager, fake_kube: FakeKube
) -> None:
    for name in ("trainer-1", "trainer-2"):
        add_running(fake_kube, "team-a", name)
    add_running(fake_kube, "team-a", "demoted", priority_class="gpusharing-over-budget")
    add_running(fake_kube, "team-a", "cpu-only", share=None)
    add_running(fake_kube, "team-a", "pending", phase="Pending")
    add_running(fake_kube, "team-b", "elsewhere")
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "evictOnExhaustion": True})
    spend(api, "team-a", 60)
    done = run(demoter)
    assert done.evicted == ["team-a/trainer-1", "team-a/trainer-2"]
    assert sorted(fake_kube.evicted) == [("team-a", "trainer-1"), ("team-a", "trainer-2")]  # asked at once
    assert fake_kube.count("DELETE", "/api/v1") == 0  # evicted through the Eviction API, never deleted


def test_evictions_wait_until_every_webhook_process_holds_a_listing_that_shows_the_crossing(
    api: SpecClient, demoter: ControllerManager, fake_kube: FakeKube
) -> None:
    add_running(fake_kube, "team-a", "trainer")
    poll = "/api/v1/budgets?webhook={}&inForce={}&refreshSeconds=5"
    before = {name: api.get(poll.format(name, 0)).json["listedAt"] for name in ("replica-1", "replica-2")}
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "evictOnExhaustion": True})
    spend(api, "team-a", 90)
    for name, listed in before.items():  # both hold a listing from before the crossing
        api.get(poll.format(name, listed))
    assert run(demoter).waiting == ["team-a"] and fake_kube.evicted == []
    after = api.get(poll.format("replica-1", before["replica-1"])).json
    assert [i["state"] for i in after["items"]] == ["over-budget"]
    api.get(poll.format("replica-1", after["listedAt"]))  # replica-1 now holds it; replica-2 not yet
    assert run(demoter).waiting == ["team-a"] and fake_kube.evicted == []
    api.get(poll.format("replica-2", api.get(poll.format("replica-2", before["replica-2"])).json["listedAt"]))
    assert run(demoter).evicted == ["team-a/trainer"]


def test_a_poll_that_names_itself_wrongly_is_refused_with_the_rule(api: SpecClient) -> None:
    for query, rule in (
        ("webhook=a%20b", "webhook must be 1 to 253 letters"),
        ("webhook=w&inForce=nan", "inForce must be a number"),
        ("webhook=w&refreshSeconds=1e9", "refreshSeconds must be a number from 0.1 to 3600"),
    ):
        refused = api.get(f"/api/v1/budgets?{query}")
        assert refused.status_code == 400 and rule in refused.json["error"]


@pytest.mark.parametrize(("raw", "polls"), [("0.1", True), ("3600", True), ("0.09", False), ("3600.5", False)])
def test_a_webhook_polls_at_a_refresh_the_timekeeper_accepts_or_does_not_start(
    api: SpecClient, raw: str, polls: bool
) -> None:
    """The bounds of GPUSHARING_BUDGET_REFRESH_SECONDS are those of the poll's refreshSeconds (the contract's)."""
    try:
        refresh = str(WebhookConfig.from_env({"GPUSHARING_BUDGET_REFRESH_SECONDS": raw}).budget_refresh_seconds)
    except ConfigError:
        refresh = None
    answer = api.get(f"/api/v1/budgets?webhook=w&refreshSeconds={refresh or raw}")
    assert (refresh is not None) is polls is (answer.status_code == 200), answer.json


def test_an_eviction_a_disruption_budget_refuses_is_retried_later_never_forced(
    api: SpecClient, demoter: ControllerManager, fake_kube: FakeKube
) -> None:
    add_running(fake_kube, "team-a", "guarded")
    fake_kube.refuse_evictions.add(("team-a", "guarded"))
    demoter.evictions.retry_seconds = 0.0  # a 429 not asked again within a run (tests/timekeeper/test_evictions.py)
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "evictOnExhaustion": True})
    spend(api, "team-a", 90)
    assert run(demoter).refused == ["team-a/guarded"]
    assert run(demoter).refused == ["team-a/guarded"]
    assert fake_kube.evicted == [] and ("team-a", "guarded") in fake_kube.pods
    fake_kube.refuse_evictions.clear()  # the PodDisruptionBudget allows it now
    assert run(demoter).evicted == ["team-a/guarded"]
    assert fake_kube.count("DELETE", "/api/v1") == 0


def test_a_top_up_promotes_back_and_stops_evictions(
    api: SpecClient, demoter: ControllerManager, fake_kube: FakeKube
) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "evictOnExhaustion": True})
    spend(api, "team-a", 90)
    run(demoter)
    api.post("/api/v1/budgets/team-a/top-ups", json={"gpuMinutes": 10, "reason": "approved"})
    add_running(fake_kube, "team-a", "recreated")
    done = run(demoter)
    assert done.events == [("team-a", "GPUBudgetRestored")] and done.evicted == []
    assert fake_kube.events[-1]["type"] == "Normal"


def test_a_raised_budget_and_a_new_period_promote_back(api: SpecClient, clock: Clock) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "period": "daily"})
    assert spend(api, "team-a", 60)["state"] == "over-budget"
    assert api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 2, "period": "daily"}).json["state"] == "in-budget"
    assert api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "period": "daily"}).json["state"] == "over-budget"
    clock.advance(hours=1)
    assert api.get("/api/v1/budgets/team-a").json["state"] == "in-budget"


def test_lowering_a_budget_below_use_demotes(api: SpecClient, demoter: ControllerManager, fake_kube: FakeKube) -> None:
    spend(api, "team-a", 600)
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 5, "evictOnExhaustion": True})
    add_running(fake_kube, "team-a", "trainer")
    done = run(demoter)
    assert done.events == [("team-a", "GPUBudgetExhausted")] and done.evicted == ["team-a/trainer"]


def test_a_re_created_pod_is_never_free(api: SpecClient) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 10})
    meter = api.as_(METER)
    old = {
        "podUid": "old-uid",
        "namespace": "team-a",
        "pod": "trainer-x1",
        "gpuShare": 1.0,
        "seq": 5,
        "gpuSeconds": 300,
    }
    meter.post("/api/v1/reports", json=old)
    # Evicted and re-created by its controller: a new uid, a new ledger, and the old pod's time still counts.
    new = {**old, "podUid": "new-uid", "pod": "trainer-x2", "seq": 1, "gpuSeconds": 120}
    meter.post("/api/v1/reports", json=new)
    assert api.get("/api/v1/budgets/team-a").json["usedGpuMinutes"] == 7.0
    assert {p["podUid"] for p in api.get("/api/v1/pods").json["items"]} == {"old-uid", "new-uid"}


def test_a_started_controller_evicts_after_a_crossing_on_its_budgets_task(
    make_controller: ControllerFactory, api: SpecClient, fake_kube: FakeKube, clock: Clock,
) -> None:
    # New by design: the web no longer wakes the controller on a crossing (they are separate processes); the
    # controller notices on its `budgets` task, every TIMEKEEPER_DEMOTION_INTERVAL_SECONDS.
    long = 3600.0
    demoter = make_controller(KubeApi(fake_kube.api_client()), tasks=TaskIntervals(
        budgets=1.0, statuses=long, bills=long, ended=long, idle=long, silent_meters=long, events=long))
    add_running(fake_kube, "team-a", "trainer")
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1, "evictOnExhaustion": True})
    demoter.start()
    try:
        deadline = time.monotonic() + 20  # stops a broken test from hanging; not a speed check
        while not demoter.synced and time.monotonic() < deadline:
            time.sleep(0.01)
        spend(api, "team-a", 60)
        while not (fake_kube.evicted and fake_kube.events) and time.monotonic() < deadline:
            clock.advance(seconds=0.25)  # the tasks reckon by the Clock: as it moves, the budgets task comes due
            time.sleep(0.02)
    finally:
        demoter.stop()
    assert fake_kube.evicted == [("team-a", "trainer")]
    assert [e["reason"] for e in fake_kube.events] == ["GPUBudgetExhausted"]  # sent by the events task, once queued


def test_one_demoter_at_a_time(make_controller: ControllerFactory, fake_kube: FakeKube, api: SpecClient) -> None:
    first = make_controller(KubeApi(fake_kube.api_client()), identity="first")
    second = make_controller(KubeApi(fake_kube.api_client()), identity="second")
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 0})
    assert run_controller(first).budgets is not None
    done = run_controller(second)
    assert done.budgets is None and not done.leading  # the lease is the first's until it lapses
    assert len(fake_kube.events) == 1


def test_an_unreachable_api_server_leaves_the_event_for_a_later_run(
    api: SpecClient, demoter: ControllerManager, fake_kube: FakeKube
) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 0, "evictOnExhaustion": True})
    fake_kube.up = False
    done = demoter.run_all()  # (its caches cannot be listed either)
    assert done.budgets is None and not done.leading  # no API, no lease: no one leads
    fake_kube.up, fake_kube.events_up = True, False
    # New by design: Events go through the queue. The budgets task claims and queues the Event; the events task fails
    # to send it and gives the claim back, so a later run makes it again.
    assert run(demoter).events == [("team-a", "GPUBudgetExhausted")] and fake_kube.events == []
    fake_kube.events_up = True
    assert run(demoter).events == [("team-a", "GPUBudgetExhausted")]
    assert [e["reason"] for e in fake_kube.events] == ["GPUBudgetExhausted"]
    assert run(demoter).events == [] and len(fake_kube.events) == 1  # sent: not made again


def test_eviction_candidates_are_running_gpu_pods_admitted_in_budget_whatever_their_class() -> None:
    settings = GpuRequestSettings()

    def pod(
        name: str,
        cls: str = "gpusharing-in-budget",
        phase: str = "Running",
        gpu: bool = True,
        deleting: bool = False,
        **record: str,
    ) -> Any:
        annotations = (
            {
                "gpusharing.io/gpu-share": "0.25",
                **{f"gpusharing.io/{k.replace('_', '-')}": v for k, v in record.items()},
            }
            if gpu
            else {}
        )
        metadata = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": annotations,
                    **({"deletionTimestamp": "2028-01-01T00:00:00Z"} if deleting else {})}
        status: dict[str, Any] = {
            "phase": phase,
            **({"startTime": "2027-12-31T00:00:00Z"} if phase != "Pending" else {}),
        }
        if phase == "Succeeded":
            status["containerStatuses"] = [
                {"name": "main", "state": {"terminated": {"finishedAt": "2027-12-31T01:00:00Z"}}}
            ]
        obj = {
            "metadata": metadata,
            "spec": {"containers": [{"name": "main"}], "priorityClassName": cls},
            "status": status,
        }
        return governed_pod(obj, settings, settings.catalogue)

    pods = [
        pod("b", budget_state="in-budget"),
        pod("a"),
        pod("allowed-class", cls="research-high", budget_state="warning"),
        pod("demoted", cls="gpusharing-over-budget", budget_state="over-budget"),
        pod("short", cls="gpusharing-over-budget", budget_state="in-budget", safe_admission="demoted"),
        pod("cpu", gpu=False),
        pod("done", phase="Succeeded"),
        pod("going", deleting=True),
        pod("waiting", phase="Pending"),
    ]
    chosen = eviction_candidates([p for p in pods if p is not None])
    assert [(p.record.name, p.record.uid) for p in chosen] == [
        ("a", "uid-a"),
        ("allowed-class", "uid-allowed-class"),
        ("b", "uid-b"),
    ]


def test_a_namespace_deleted_before_its_event_gets_none_and_is_not_tried_again(
    api: SpecClient, demoter: ControllerManager, fake_kube: FakeKube
) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1})
    spend(api, "team-a", 61)
    fake_kube.deleted_namespaces.add("team-a")
    # New by design: the budgets task says what it queued; the events task finds nothing to record it on, which is
    # no failure: the claim stays, and nothing is queued again.
    assert run(demoter).events == [("team-a", "GPUBudgetExhausted")]
    assert run(demoter).events == []
    assert fake_kube.events == [] and fake_kube.count("GET", "/api/v1/namespaces/team-a") == 1


def test_a_resource_the_watch_delivers_during_a_pass_gets_its_status_from_the_next(
    demoter: ControllerManager, fake_kube: FakeKube,
) -> None:
    """Not Ready (Reconciled) with no figures: the budgets task applied the resources before the watch brought this
    one."""
    run_controller(demoter)
    late = {
        "apiVersion": "gpusharing.io/v1alpha1",
        "kind": "GPUBudget",
        "metadata": {"namespace": "team-a", "name": "budget", "generation": 1},
        "spec": {"gpuMinutes": 5},
    }
    fake_kube.custom["gpubudgets"] = [late]
    demoter.informers.list_now()  # the watch brings it after the budgets task ran, before the statuses task runs
    assert demoter.budget_sync.write_statuses() == []  # the statuses task
    assert fake_kube.count("PATCH", "/apis/gpusharing.io") == 0
    done = run_controller(demoter)  # the next run applies it, then writes its status
    assert done.budgets is not None and done.budgets.applied == ["team-a"] and done.statuses == ["team-a"]
    assert fake_kube.count("PATCH", "/apis/gpusharing.io") == 1


def test_an_edit_the_watch_delivers_during_a_pass_keeps_the_old_status_until_the_ledger_holds_it(
    demoter: ControllerManager, fake_kube: FakeKube,
) -> None:
    """The edited generation is never stamped on the figures of the spec before: the budgets task applies it first."""
    resource = {
        "apiVersion": "gpusharing.io/v1alpha1",
        "kind": "GPUBudget",
        "metadata": {"namespace": "team-a", "name": "budget", "generation": 1},
        "spec": {"gpuMinutes": 5},
    }
    fake_kube.custom["gpubudgets"] = [resource]
    demoter.informers.list_now()
    done = run_controller(demoter)
    assert done.statuses == ["team-a"]
    written = fake_kube.count("PATCH", "/apis/gpusharing.io")
    fake_kube.custom["gpubudgets"] = [
        {**resource, "metadata": {**resource["metadata"], "generation": 2}, "spec": {"gpuMinutes": 50}}
    ]
    demoter.informers.list_now()  # the edit arrives after the budgets task ran, before the statuses task runs
    assert demoter.budget_sync.write_statuses() == []
    assert fake_kube.count("PATCH", "/apis/gpusharing.io") == written
    done = run_controller(demoter)  # the next run applies the edit, then writes its status
    assert done.budgets is not None and done.budgets.applied == ["team-a"] and done.statuses == ["team-a"]
