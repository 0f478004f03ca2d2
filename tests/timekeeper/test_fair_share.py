"""Fair share wired into the timekeeper (docs/fair-share.md), on SQLite and PostgreSQL: off by default; decayed usage
grown with the ledger's charges, in their transaction, exactly once; the controller's `fairshare` task ranking the
budget hierarchy into bands the listing shows, and making room for a higher band that waits."""

from __future__ import annotations

import datetime as dt
import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from demo.kubeapi import FakeKube
from gpusharing.admin.explain import Preemptor, format_explanation, pod_record, preemptor
from gpusharing.contract import ANNOTATION_FAIR_SHARE_BAND, FAIR_SHARE_GATE, Period
from gpusharing.kube.owners import Owner
from gpusharing.listing import BudgetListing, ListedBudget
from gpusharing.report import MeterReport
from gpusharing.settings.env import ConfigError
from tests.timekeeper.conftest import ADMIN, AppFactory, Clock, ControllerFactory, SpecClient, run_controller
from timekeeper.accounting.ledger import Observation
from timekeeper.accounting.record import RecordedPod
from timekeeper.budgets.status import Budget
from timekeeper.cluster.fairshare import FAIR_SHARE_EVENT, held_gpus
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.resources import FairShareSpec, fair_share_spec, resource_status
from timekeeper.config import DEFAULT_BAND_CLASSES, FairShareSettings, TimekeeperConfig, fair_share_settings
from timekeeper.database.accounting.charging import PodObservation, ReportLedger
from timekeeper.database.accounting.fairshare import FairShareLedger
from timekeeper.database.budgets.store import BudgetStore
from timekeeper.database.connection import Database

UTC = dt.timezone.utc
START = dt.datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
HOUR = dt.timedelta(hours=1)
LIGHT, MIDDLE, HEAVY = DEFAULT_BAND_CLASSES
ON = FairShareSettings(enabled=True, half_life=HOUR)


def at(seconds: float) -> dt.datetime:
    return START + dt.timedelta(seconds=seconds)


def decayed(share: float, start: float, end: float, now: float, half_life: float = 3600.0) -> float:
    """share x the integral of 2^-((now - t)/h) dt over [start, end], numerically: what the ledger's decay must
    equal."""
    steps = 20_000
    width = (end - start) / steps
    return sum(share * width * 2 ** (-(now - (start + (i + 0.5) * width)) / half_life) for i in range(steps))


# -- settings ---------------------------------------------------------------------------------------------------------


def test_fair_share_is_off_by_default_and_its_settings_are_read_in_one_place() -> None:
    assert TimekeeperConfig.from_env({}).fair_share == FairShareSettings() and not FairShareSettings().enabled
    settings = fair_share_settings({"TIMEKEEPER_FAIRSHARE_ENABLED": "true", "TIMEKEEPER_FAIRSHARE_HALF_LIFE": "10m",
                                    "TIMEKEEPER_FAIRSHARE_CLASSES": "a,b", "TIMEKEEPER_FAIRSHARE_RATIO_BOUNDS": "1.5",
                                    "TIMEKEEPER_FAIRSHARE_GRACE": "30s", "TIMEKEEPER_FAIRSHARE_MIN_RUN_TIME": "0"})
    assert (
        settings.enabled
        and settings.half_life == dt.timedelta(minutes=10)
        and settings.grace == dt.timedelta(seconds=30)
    )
    assert (
        settings.bands.classes == ("a", "b")
        and settings.bands.ratio_bounds == (1.5,)
        and settings.min_run_time == dt.timedelta(0)
    )


@pytest.mark.parametrize(("environ", "named"), [
    ({"TIMEKEEPER_FAIRSHARE_RATIO_BOUNDS": "1.25,0.8"}, "TIMEKEEPER_FAIRSHARE_RATIO_BOUNDS"),
    ({"TIMEKEEPER_FAIRSHARE_RATIO_BOUNDS": "0.8"}, "TIMEKEEPER_FAIRSHARE_RATIO_BOUNDS"),
    ({"TIMEKEEPER_FAIRSHARE_CLASSES": "a,a"}, "TIMEKEEPER_FAIRSHARE_CLASSES"),
    ({"TIMEKEEPER_FAIRSHARE_HALF_LIFE": "0"}, "TIMEKEEPER_FAIRSHARE_HALF_LIFE"),
    ({"TIMEKEEPER_FAIRSHARE_HYSTERESIS": "1"}, "TIMEKEEPER_FAIRSHARE_HYSTERESIS"),
    ({"TIMEKEEPER_FAIRSHARE_ENABLED": "maybe"}, "TIMEKEEPER_FAIRSHARE_ENABLED"),
])
def test_a_bad_setting_is_refused_naming_it(environ: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        fair_share_settings(environ)


def test_a_budget_resource_s_fair_share_is_read_within_bounds() -> None:
    def spec(fair_share: object) -> FairShareSpec:
        return fair_share_spec(
            {"metadata": {"name": "budget", "namespace": "ml"}, "spec": {"gpuMinutes": 1, "fairShare": fair_share}}
        )

    assert spec({"weight": 3, "halfLife": "2h"}) == FairShareSpec(3.0, 7200.0)
    assert spec({"weight": -1, "halfLife": "forever"}) == spec({"weight": True}) == spec("heavy") == FairShareSpec()


# -- decayed usage from the ledger ------------------------------------------------------------------------------------


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


@pytest.fixture
def ledgers(database_url: str, clock: Clock) -> Iterator[list[ReportLedger]]:
    """Two timekeeper processes' ledgers on one database, with fair share on (a 1 h half-life)."""
    databases = [Database(database_url), Database(database_url)]
    yield [ReportLedger(BudgetStore(db, clock=clock), fair_share=FairShareLedger(db, HOUR)) for db in databases]
    for db in databases:
        db.dispose()


def observed(uid: str, until: float, share: float = 0.5, namespace: str = "ml", ended: bool = False) -> PodObservation:
    return PodObservation(uid, namespace, f"pod-{uid}", share, Observation(share, START, at(until), ended))


def usage_now(ledger: ReportLedger, namespace: str, now: dt.datetime) -> float:
    assert ledger.fair_share is not None
    return ledger.fair_share.records()[namespace].usage.at(now, HOUR).gpu_seconds


def test_decayed_usage_equals_the_integral_of_what_was_billed_whatever_the_passes(
    ledgers: list[ReportLedger], clock: Clock
) -> None:
    """Two replicas observe the same pods at once, at different times: each interval is charged once, so the decayed
    usage is each pod's share decayed over its recorded life, exactly."""
    ends = {f"uid-{i}": 600 + 300 * i for i in range(6)}

    def replica(ledger: ReportLedger, offset: float) -> None:
        for until in range(60, 2400, 60):
            ledger.observe(
                [observed(uid, min(until + offset, end), ended=until + offset >= end) for uid, end in ends.items()]
            )

    threads = [threading.Thread(target=replica, args=(ledger, offset)) for ledger, offset in zip(ledgers, (0, 17))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    now = at(7200)
    expected = sum(decayed(0.5, 0, end, 7200) for end in ends.values())
    assert usage_now(ledgers[0], "ml", now) == pytest.approx(expected, rel=1e-6)


def test_a_running_pod_counts_to_its_last_observation(ledgers: list[ReportLedger], clock: Clock) -> None:
    ledger = ledgers[0]
    ledger.observe([observed("a", 1800)])
    assert usage_now(ledger, "ml", at(1800)) == pytest.approx(decayed(0.5, 0, 1800, 1800), rel=1e-6)
    ledger.observe([observed("a", 3600)])  # its bill grows every pass, and so does its decayed usage
    assert usage_now(ledger, "ml", at(3600)) == pytest.approx(decayed(0.5, 0, 3600, 3600), rel=1e-6)


def test_meter_reports_count_once_each_over_the_time_they_cover(ledgers: list[ReportLedger], clock: Clock) -> None:
    """Off a cluster only meters tell: each report's charge counts over the time its share takes to make it; a
    report sent again counts nothing."""
    ledger = ledgers[0]
    for seq in (0, 1):
        clock.advance(seconds=120)
        report = MeterReport(
            pod_uid="m", namespace="ml", pod="pod-m", gpu_share=0.5, seq=seq, gpu_seconds=60.0 * (seq + 1)
        )
        ledger.record([(report, None)])
        ledger.record([(report, None)])
    assert usage_now(ledger, "ml", at(240)) == pytest.approx(decayed(0.5, 0, 240, 240), rel=1e-6)


def test_with_fair_share_off_no_decayed_usage_is_kept(database_url: str, clock: Clock) -> None:
    db = Database(database_url)
    try:
        ReportLedger(BudgetStore(db, clock=clock)).observe([observed("a", 600)])
        assert FairShareLedger(db, HOUR).records() == {}
    finally:
        db.dispose()


# -- the fairshare task -----------------------------------------------------------------------------------------------


def pod(fake: FakeKube, namespace: str, name: str, band: str | None, *, started: dt.datetime | None = START,
        owned: bool = True, share: str = "1", queued_at: dt.datetime | None = None) -> dict[str, Any]:
    obj = fake.add_pod(namespace, name, share=share, priority_class=band or "gpusharing-in-budget",
                       phase="Running" if started else "Pending")
    if band is not None:
        obj["metadata"]["annotations"][ANNOTATION_FAIR_SHARE_BAND] = band
    if owned:
        obj["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{name}-rs",
                                                "uid": f"rs-{namespace}-{name}", "controller": True}]
    if started:
        obj["status"]["startTime"] = started.strftime("%Y-%m-%dT%H:%M:%SZ")
        obj["spec"]["nodeName"] = "gpu-0"
    if queued_at:  # behind the webhook's gate since its creation
        obj["spec"]["schedulingGates"] = [{"name": FAIR_SHARE_GATE}]
        obj["metadata"]["creationTimestamp"] = queued_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    return obj


@pytest.fixture
def cluster(fake_kube: FakeKube, database_url: str, clock: Clock, make_controller: ControllerFactory) -> Iterator[Any]:
    """Two teams of equal budgets under one department, on a cluster of 8 GPUs; heavy used 4 GPU-hours in the hour
    before, light 6 GPU-minutes."""
    fake_kube.custom["nodes"] = [{"metadata": {"name": f"gpu-{i}"}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
                                 for i in range(2)]
    # counts nothing
    fake_kube.custom["nodes"].append({"metadata": {"name": "cordoned"}, "spec": {"unschedulable": True},
                                      "status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    db = Database(database_url)
    store = BudgetStore(db, clock=clock)
    store.set_budget(Budget("dept.research", None, Period.MONTHLY), "admin")
    for team in ("heavy", "light"):
        store.set_budget(Budget(team, 6000, Period.MONTHLY, parent="dept.research"), "admin")
    ledger = ReportLedger(store, fair_share=FairShareLedger(db, HOUR))
    ledger.observe([PodObservation(f"old-{i}", "heavy", f"old-{i}", 1.0, Observation(1.0, START - HOUR, START, True))
                    for i in range(4)])
    # light used a little (6 GPU-minutes): heavy's share of the usage then falls as its own decays at zero use.
    ledger.observe([PodObservation("old-light", "light", "old-light", 1.0,
                                   Observation(1.0, START - HOUR, START - HOUR + dt.timedelta(minutes=6), True))])
    controller = make_controller(KubeApi(fake_kube.api_client()), fair_share=FairShareSettings(
        enabled=True, half_life=HOUR, grace=dt.timedelta(minutes=2), min_run_time=dt.timedelta(minutes=5)))
    yield controller, ledger
    db.dispose()


def test_the_task_ranks_the_heavy_team_below_the_light_one_and_the_listing_shows_it(
    cluster: Any, fake_kube: FakeKube, make_app: AppFactory, clock: Clock,
) -> None:
    controller, _ = cluster
    done = run_controller(controller).fair_share
    assert done is not None and done.cluster_gpus == 8
    bands = {name: DEFAULT_BAND_CLASSES[s.state.band] for name, s in done.standings.items()}
    assert bands == {"heavy": HEAVY, "light": LIGHT}
    light = done.standings["light"]
    assert light.standing.share_of_cluster == pytest.approx(0.5) and light.standing.rank == 1
    assert "heavy used 2.0x its fair share among its siblings in dept.research" in done.standings["heavy"].reason
    api = SpecClient(make_app(fair_share=ON).test_client(), ADMIN)  # every answer as openapi.yaml documents it
    listing = api.get("/api/v1/budgets").get_json()
    assert listing["fairShare"] == {"classes": list(DEFAULT_BAND_CLASSES), "webhookProcesses": 1}  # none polled yet
    for process in ("webhook-a", "webhook-b", "webhook-a"):  # two live processes share the burst guard's room
        listing = api.get(f"/api/v1/budgets?webhook={process}&inForce=0&refreshSeconds=5").get_json()
    assert listing["fairShare"]["webhookProcesses"] == 2
    listed = {item["namespace"]: item.get("fairShare") for item in listing["items"]}
    assert listed["dept.research"] is None
    assert listed["light"]["band"] == LIGHT and listed["light"]["burstClass"] == MIDDLE
    assert (
        listed["light"]["shareGpus"] == 4
        and listed["heavy"]["band"] == HEAVY
        and listed["heavy"]["burstClass"] == HEAVY
    )
    assert "path" not in listed["light"]  # what the webhook polls stays small
    # Read alone, for `gpusharing explain`: its path down the tree, and when its band would rise at zero use.
    heavy = api.get("/api/v1/budgets/heavy").get_json()["fairShare"]
    assert [(level["node"], level["rank"], level["siblings"]) for level in heavy["path"]] == [
        ("dept.research", 1, 1),
        ("heavy", 2, 2),
    ]
    # 2 x heavy's part of the two teams' decayed usage
    assert heavy["path"][1]["share"] == 0.5 and heavy["path"][1]["ratio"] == pytest.approx(1.965, abs=1e-3)
    assert heavy["zeroUseChange"] is not None and heavy["zeroUseChange"] > heavy["asOf"]
    # Off, the listing says nothing of fair share.
    off = SpecClient(make_app().test_client(), ADMIN).get("/api/v1/budgets").get_json()
    assert "fairShare" not in off and all("fairShare" not in item for item in off["items"])


def test_a_ranked_listing_and_a_budget_read_alone_read_back_through_the_contract_as_answered(
    cluster: Any, make_app: AppFactory,
) -> None:
    """The bands, the path down the tree and fair share's classes are all the webhook and `gpusharing explain` read."""
    controller, _ = cluster
    run_controller(controller)
    api = SpecClient(make_app(fair_share=ON).test_client(), ADMIN)
    listing = api.get("/api/v1/budgets").get_json()
    assert BudgetListing.from_json(listing).to_json() == listing
    assert any("fairShare" in item for item in listing["items"])
    heavy = api.get("/api/v1/budgets/heavy").get_json()
    read = ListedBudget.from_json(heavy)
    assert read.to_json() == heavy and read.fair_share is not None and len(read.fair_share.path or ()) == 2


def test_the_statuses_show_band_ratio_rank_usage_and_reason(cluster: Any) -> None:
    controller, _ = cluster
    run_controller(controller)
    statuses = controller.fair_share.statuses()
    assert statuses["heavy"]["band"] == HEAVY and statuses["heavy"]["ratio"] == pytest.approx(1.965, abs=1e-3)
    # 4 GPUs for the hour before: 4 h x the mean of 2^-t over a half-life, in GPU-hours.
    assert statuses["heavy"]["usage"] == pytest.approx(2 / math.log(2), rel=1e-3)
    assert statuses["dept.research"]["rank"] == 1 and "band" not in statuses["dept.research"]
    obj = {"metadata": {"namespace": "heavy", "name": "budget", "generation": 1}, "spec": {"gpuMinutes": 6000}}
    assert resource_status(obj, None, None, [], START, fair_share=statuses["heavy"])["fairShare"] == statuses["heavy"]
    assert "fairShare" not in resource_status(obj, None, None, [], START)


def test_queued_pods_wait_for_room_and_past_the_grace_room_is_made_for_the_light_team_by_the_fewest_evictions(
    cluster: Any, fake_kube: FakeKube, clock: Clock,
) -> None:
    controller, _ = cluster
    clock.advance(minutes=10)
    for i in range(7):  # heavy holds the cluster's 8 GPUs
        pod(fake_kube, "heavy", f"h-{i}", MIDDLE)
    pod(fake_kube, "heavy", "young", MIDDLE, started=clock.now() - dt.timedelta(minutes=1))
    pod(fake_kube, "heavy", "more", HEAVY, started=None, queued_at=clock.now())
    for i in range(2):
        pod(fake_kube, "light", f"l-{i}", LIGHT, started=None, queued_at=clock.now())
    done = run_controller(controller).fair_share_queue
    # No room, and within the grace: nothing released, nobody evicted.
    assert done is not None and done.queued == 3 and done.released == [] and done.waiting == []
    assert fake_kube.evicted == []
    clock.advance(minutes=3)
    done = run_controller(controller).fair_share_queue
    assert done is not None and done.waiting == ["light/l-0", "light/l-1"]
    assert sorted(fake_kube.evicted) == [("heavy", "h-0"), ("heavy", "h-1")]  # never the young one
    controller.events.send()  # the events task, queued for after this run
    events = [e for e in fake_kube.events if e["reason"] == FAIR_SHARE_EVENT]
    assert {e["involvedObject"]["name"] for e in events} == {"h-0", "h-1"}
    assert all("pods of namespace light, below its fair share, waited in the fair-share queue for 3m" in e["message"]
               and e["related"] == {"apiVersion": "v1", "kind": "Namespace", "name": "light"} for e in events)
    # The room they leave is light's: its pods are released, heavy's waits.
    done = run_controller(controller).fair_share_queue
    assert done is not None and done.released == ["light/l-0", "light/l-1"]
    assert [p["spec"]["schedulingGates"] for p in fake_kube.pods.values() if p["metadata"]["namespace"] == "light"] \
        == [[], []]
    assert fake_kube.pods[("heavy", "more")]["spec"]["schedulingGates"] == [{"name": FAIR_SHARE_GATE}]


def test_with_fair_share_off_every_queued_pod_is_released(
    fake_kube: FakeKube, database_url: str, clock: Clock, make_controller: ControllerFactory,
) -> None:
    """Pods queued before fair share was turned off do not wait for ever."""
    pod(fake_kube, "a", "queued", MIDDLE, started=None, queued_at=clock.now())
    pod(fake_kube, "a", "running", MIDDLE)
    controller = make_controller(KubeApi(fake_kube.api_client()))
    assert run_controller(controller).fair_share is None
    assert fake_kube.pods[("a", "queued")]["spec"]["schedulingGates"] == []


def test_when_the_nodes_offer_no_gpu_the_controller_can_count_the_queue_holds_nobody_back(
    fake_kube: FakeKube, clock: Clock, make_controller: ControllerFactory,
) -> None:
    """A backend whose resources this version cannot read (DRA's devices, say) must not leave pods queued for ever."""
    fake_kube.custom["nodes"] = [{"metadata": {"name": "dra-0"}, "status": {"allocatable": {"cpu": "64"}}}]
    pod(fake_kube, "a", "queued", MIDDLE, started=None, queued_at=clock.now())
    controller = make_controller(KubeApi(fake_kube.api_client()), fair_share=ON)
    done = run_controller(controller).fair_share_queue
    assert done is not None and done.cluster_gpus == 0 and done.released == ["a/queued"]


def recorded(name: str, namespace: str, *, started: float | None = 0.0, queued: bool = False,
             finished: float | None = None, deleted: float | None = None, demoted: bool = False,
             share: float = 1.0) -> RecordedPod:
    return RecordedPod(
        f"uid-{name}", namespace, name, share, share, None, (), None if started is None else at(started),
        None if finished is None else at(finished), None if deleted is None else at(deleted), None,
        owner=Owner("apps/v1", "ReplicaSet", f"{name}-rs", f"rs-{name}"), demoted=demoted,
        running=started is not None and finished is None, gate=0 if queued else None,
    )


def test_a_namespace_holds_what_the_queue_released_never_what_waits() -> None:
    """Kueue's entry penalty counts what is admitted, not what waits: the queue's and the burst guard's count."""
    pods = [
        recorded("run", "a", share=0.5),
        recorded("released", "a", started=None),  # out of the queue, not yet placed: it is being given its GPU
        recorded("waits", "a", started=None, queued=True),
        recorded("done", "a", finished=20),
        recorded("going", "a", deleted=20),
        recorded("demoted", "a", demoted=True),
        recorded("b-waits", "b", started=None, queued=True),
    ]
    assert held_gpus(pods) == {"a": 1.5}


def test_explain_shows_the_pod_s_band_its_namespace_s_path_and_when_its_band_would_rise(
    cluster: Any, fake_kube: FakeKube, make_app: AppFactory,
) -> None:
    """`gpusharing explain POD` from what the pod records and its namespace's budget read alone (a tenant's own
    read)."""
    controller, _ = cluster
    run_controller(controller)
    status = SpecClient(make_app(fair_share=ON).test_client(), ADMIN).get("/api/v1/budgets/heavy").get_json()
    obj = pod(fake_kube, "heavy", "train-0", HEAVY)
    obj["metadata"]["annotations"]["gpusharing.io/fair-share-reason"] = "heavy used 2.0x its fair share"
    text = format_explanation({"pod": pod_record(obj), "namespace": status, "metering": None, "idle": None})
    flat = " ".join(text.split())
    assert "Fair-share band: gpusharing-in-budget-heavy: heavy used 2.0x its fair share" in flat
    assert (
        "Namespace's band: gpusharing-in-budget-heavy since" in flat
        and "new pods get gpusharing-in-budget-heavy" in flat
    )
    assert f"At zero use: its band would rise at {status['fairShare']['zeroUseChange']}" in flat
    assert "Fair-share queue" not in flat  # it runs
    queued_pod = pod(fake_kube, "heavy", "train-1", HEAVY, started=None, queued_at=START)
    waiting = format_explanation({"pod": pod_record(queued_pod), "namespace": status, "metering": None, "idle": None})
    assert ("Fair-share queue: waiting behind the gate gpusharing.io/fair-share: the controller releases it to "
            "kube-scheduler when GPUs come free, the lightest namespace's pods first") in " ".join(waiting.split())
    table = text.split("\n\n", 1)[1].splitlines()
    assert table[0].split() == ["LEVEL", "NODE", "SHARE", "USAGE", "RATIO", "RANK"]
    assert table[1].split() == ["1", "dept.research", "1.000", "1.000", "1.00", "1/1"]
    assert table[2].split() == ["2", "heavy", "0.500", "0.982", "1.96", "2/2"]


def test_explain_compares_the_pod_s_path_with_the_namespace_it_was_preempted_for_where_the_caller_may_read_it(
    cluster: Any, fake_kube: FakeKube, make_app: AppFactory,
) -> None:
    controller, _ = cluster
    run_controller(controller)
    api = SpecClient(make_app(fair_share=ON).test_client(), ADMIN)
    heavy, light = (api.get(f"/api/v1/budgets/{name}").get_json() for name in ("heavy", "light"))
    # kube-scheduler's Preempted Event names the preemptor's UID (as the API server shows it, no related object);
    # the fairshare task's names the namespace whose pods waited. The last one counts.
    events = [
        {
            "reason": "Preempted",
            "lastTimestamp": "2026-11-25T10:00:00Z",
            "related": None,
            "message": "Preempted by pod c61e1961-9dc8-4ab2-b3f8-0c0e1f585289 on node sim-fair-1-0000",
        },
        {
            "reason": FAIR_SHARE_EVENT,
            "lastTimestamp": "2026-11-25T10:05:00Z",
            "related": {"kind": "Namespace", "name": "other"},
        },
        {"reason": "Scheduled", "lastTimestamp": "2026-11-25T10:09:00Z", "message": "Successfully assigned"},
    ]
    assert preemptor(events) == Preemptor(namespace="other")
    assert preemptor(events[:1]) == Preemptor(pod_uid="c61e1961-9dc8-4ab2-b3f8-0c0e1f585289")
    assert preemptor(events[2:]) is None
    obj = pod(fake_kube, "heavy", "train-0", HEAVY)
    explained = {"pod": pod_record(obj), "namespace": heavy, "metering": None, "idle": None,
                 "preemptedFor": {"namespace": "light", "status": light}}
    text = " ".join(format_explanation(explained).split())
    assert "Preempted for: pods of namespace light, whose path is:" in text
    assert ("Where they part: level 2, among the children of dept.research: heavy at 1.96x its share, rank 2/2; "
            "light at 0.04x, rank 1/2 (lower ratio first)") in text
    # A tenant reads its own namespace's figures only: the other's name, and no more.
    refused = {
        **explained,
        "preemptedFor": {"namespace": "light", "status": None, "refused": "the timekeeper refused (403)"},
    }
    text = " ".join(format_explanation(refused).split())
    assert "Preempted for: pods of namespace light: its figures are not yours to read" in text and "0.04" not in text
    unknown = {**explained, "preemptedFor": {"namespace": None, "podUid": "c61e1961", "status": None}}
    assert "Preempted for: pod c61e1961, of a namespace whose figures are not yours to read" in " ".join(
        format_explanation(unknown).split()
    )
