"""Billing from the API server's record, on SQLite and PostgreSQL: each pod billed its share from its recorded start to
its recorded end, exactly once across processes; the meter's reports add only what the record cannot see; a pod's
finalizer comes off once its bill is closed; silent meters are flagged once."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from gpusharing.contract import ANNOTATION_GPU_SHARE, BILLING_FINALIZER, fresh_for
from gpusharing.gpu.request import GpuRequestSettings
from gpusharing.report import MeterReport
from tests.fakekube import FakeKube
from tests.timekeeper.conftest import Clock
from timekeeper.accounting.ledger import Observation
from timekeeper.accounting.record import recorded_pod
from timekeeper.accounting.reports import PodObservation, ReportLedger, ReportTerms
from timekeeper.budgets.store import BudgetStore
from timekeeper.cluster.billing import METER_SILENT, Biller
from timekeeper.cluster.kube import KubeApi
from timekeeper.database.connection import Database
from timekeeper.database.tables import pod_usage

UTC = dt.timezone.utc
START = dt.datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
MICROS = 1_000_000


def at(seconds: float) -> dt.datetime:
    return START + dt.timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


@pytest.fixture
def ledgers(database_url: str, clock: Clock) -> Iterator[list[ReportLedger]]:
    """Two timekeeper processes' ledgers on one database (two replicas)."""
    databases = [Database(database_url), Database(database_url)]
    yield [ReportLedger(BudgetStore(db, clock=clock)) for db in databases]
    for db in databases:
        db.dispose()


def observed(uid: str, until: float, share: float = 0.5, ended: bool = False) -> PodObservation:
    return PodObservation(uid, "ml", f"pod-{uid}", share, Observation(share, START, at(until), ended))


def billed(ledger: ReportLedger, uid: str) -> int:
    return next(pod.micro_gpu_seconds for pod in ledger.pods("ml") if pod.pod_uid == uid)


def test_two_replicas_observing_at_once_bill_share_times_recorded_time_exactly(ledgers: list[ReportLedger], clock: Clock) -> None:
    uids = [f"uid-{i}" for i in range(20)]
    ends = {uid: 60 + 7 * i for i, uid in enumerate(uids)}

    def replica(ledger: ReportLedger, offset: float) -> None:
        for until in range(10, 200, 10):
            ledger.observe([observed(uid, min(until + offset, ends[uid]), ended=until + offset >= ends[uid]) for uid in uids])

    threads = [threading.Thread(target=replica, args=(ledger, offset)) for ledger, offset in zip(ledgers, (0, 3))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for uid in uids:
        assert billed(ledgers[0], uid) == round(0.5 * ends[uid] * MICROS), uid
    used = ledgers[0].budgets.status("ml").used_micro_gpu_seconds
    assert used == sum(round(0.5 * end * MICROS) for end in ends.values())  # the namespace, charged once for each


def test_a_forged_final_does_not_stop_the_bill(ledgers: list[ReportLedger]) -> None:
    ledger = ledgers[0]
    terms = ReportTerms(0.5, None, started_at=START)
    ledger.observe([observed("uid-1", 10)])
    forged = MeterReport("uid-1", "ml", "pod-uid-1", 0.5, 2**62, 1.0, final=True)
    assert ledger.record([(forged, terms)])[0].outcome.value == "charged"
    ledger.observe([observed("uid-1", 44)])
    assert billed(ledger, "uid-1") == 22 * MICROS  # 0.5 GPU x 44 s, as the API server recorded it


def test_a_meter_may_fill_a_gap_but_not_claim_more_than_its_share_since_the_recorded_start(
    ledgers: list[ReportLedger], clock: Clock,
) -> None:
    ledger = ledgers[0]
    terms = ReportTerms(0.5, None, started_at=START)
    clock.at = at(100)
    ledger.record([(MeterReport("uid-1", "ml", "pod-uid-1", 0.5, 1, 40.0), terms)])
    assert billed(ledger, "uid-1") == 40 * MICROS  # nothing observed yet: the meter's word, within 0.5 x 100 s
    ledger.record([(MeterReport("uid-1", "ml", "pod-uid-1", 0.5, 2, 10**9), terms)])
    assert billed(ledger, "uid-1") == 50 * MICROS  # capped at 0.5 x 100 s
    ledger.observe([observed("uid-1", 120)])
    assert billed(ledger, "uid-1") == 60 * MICROS and ledger.budgets.status("ml").used_micro_gpu_seconds == 60 * MICROS


def idle_seconds(ledger: ReportLedger, uid: str) -> float:
    """The part of the pod's charges its meter's readings called idle, GPU-seconds."""
    query = select(func.coalesce(func.sum(pod_usage.c.idle_micro_gpu_seconds), 0)).where(pod_usage.c.pod_uid == uid)
    with ledger.db.read() as conn:
        return conn.execute(query).scalar_one() / MICROS


@pytest.mark.parametrize("interval", [10.0, 30.0])
def test_a_reading_tells_how_busy_an_observed_interval_was_for_two_meter_intervals(
    database_url: str, clock: Clock, interval: float,
) -> None:
    """gpusharing.contract.fresh_for: an observation the meter's last reading (idle) is two intervals old or less is
    billed idle; a moment later the reading is stale, and the observed time's utilisation unknown."""
    db = Database(database_url)
    ledger = ReportLedger(BudgetStore(db, clock=clock), meter_interval_seconds=interval)
    for uid, silence in (("uid-fresh", fresh_for(interval)), ("uid-stale", fresh_for(interval) + 1)):
        clock.now = at(interval)
        reading = MeterReport(uid, "ml", f"pod-{uid}", 0.5, 1, 0.5 * interval, gpu_utilization_percent=0.0)
        ledger.record([(reading, ReportTerms(0.5, None, started_at=START))])  # the interval it covers: idle
        clock.now = at(interval + silence)
        ledger.observe([observed(uid, interval + silence)])
    assert idle_seconds(ledger, "uid-fresh") == 0.5 * (interval + fresh_for(interval))
    assert idle_seconds(ledger, "uid-stale") == 0.5 * interval
    db.dispose()


def test_a_pod_lost_from_sight_is_listed_until_closed(ledgers: list[ReportLedger]) -> None:
    ledger = ledgers[0]
    ledger.observe([observed("uid-1", 30), observed("uid-2", 30)])
    assert sorted(uid for uid, _, _ in ledger.open_observed()) == ["uid-1", "uid-2"]
    ledger.observe([PodObservation("uid-2", "ml", "pod-uid-2", 0.0, None)])
    assert [uid for uid, _, _ in ledger.open_observed()] == ["uid-1"]
    assert billed(ledger, "uid-2") == 15 * MICROS


def test_silence_is_flagged_once_by_one_process_and_a_report_clears_it(ledgers: list[ReportLedger], clock: Clock) -> None:
    ledgers[0].observe([observed("uid-1", 30), observed("uid-2", 30)])
    ledgers[0].record([(MeterReport("uid-2", "ml", "pod-uid-2", 0.5, 1, 10.0), ReportTerms(0.5, None, started_at=START))])
    quiet_since = START - dt.timedelta(seconds=1)  # uid-2's meter reported since: not silent
    assert ledgers[0].claim_silent(["uid-1", "uid-2"], quiet_since, at(60)) == ["uid-1"]
    assert ledgers[1].claim_silent(["uid-1", "uid-2"], quiet_since, at(61)) == []
    ledgers[0].record([(MeterReport("uid-1", "ml", "pod-uid-1", 0.5, 1, 1.0), ReportTerms(0.5, None, started_at=START))])
    assert ledgers[0].silent_meters(120, 3600) == 0


# -- the controller's billing pass, against an HTTP fake of the API (the real one: tests/e2e/test_billing.py) ----------

def pod_object(fake: FakeKube, name: str, status: dict[str, Any], deleting: str | None = None) -> dict[str, Any]:
    pod = fake.add_pod("ml", name, share="0.5")
    pod["metadata"]["finalizers"] = [BILLING_FINALIZER]
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    pod["metadata"]["annotations"][ANNOTATION_GPU_SHARE] = "1"
    pod["status"] = {"startTime": "2026-11-25T10:00:00Z", **status}
    if deleting:
        pod["metadata"]["deletionTimestamp"] = deleting
    return pod


@pytest.fixture
def biller(ledgers: list[ReportLedger], fake_kube: FakeKube) -> Biller:
    return Biller(ledgers[0], KubeApi(fake_kube.api_client()), GpuRequestSettings(), interval_seconds=30,
                  meter_interval_seconds=30, monotonic=lambda: 0.0)


def watch(biller: Biller, *pods: dict[str, Any]) -> None:
    """What the watches would hold (the real watches are tested on the control plane)."""
    biller.pods.items = {(p["metadata"]["namespace"], p["metadata"]["name"]): recorded_pod(p, biller.settings) for p in pods}
    biller.claims.items = {}


def test_a_pass_bills_running_pods_and_closes_and_releases_the_ended_ones(biller: Biller, fake_kube: FakeKube) -> None:
    running = pod_object(fake_kube, "running", {"phase": "Running"})
    ended = pod_object(fake_kube, "ended", {"phase": "Succeeded", "containerStatuses": [
        {"name": "main", "state": {"terminated": {"finishedAt": "2026-11-25T10:00:40Z"}}}]})
    watch(biller, running, ended)
    done = biller.bill(at(90))
    assert done is not None and done.released == ["ml/ended"] and done.observed == 2
    assert fake_kube.pods["ml", "ended"]["metadata"]["finalizers"] == []
    assert fake_kube.pods["ml", "running"]["metadata"]["finalizers"] == [BILLING_FINALIZER]
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in (running, ended)}
    assert billed(biller.ledger, uids["running"]) == 90 * MICROS and billed(biller.ledger, uids["ended"]) == 40 * MICROS


def test_a_finalizer_is_not_released_while_the_bill_cannot_be_written(biller: Biller, fake_kube: FakeKube, database_url: str) -> None:
    ended = pod_object(fake_kube, "ended", {"phase": "Failed", "containerStatuses": [
        {"name": "main", "state": {"terminated": {"finishedAt": "2026-11-25T10:00:40Z"}}}]})
    watch(biller, ended)
    biller.ledger.db.dispose()
    biller.ledger.db = biller.ledger.budgets.db = Database("sqlite:////nonexistent/dir/db.sqlite")
    with pytest.raises(OperationalError):
        biller.bill(at(90))
    assert fake_kube.pods["ml", "ended"]["metadata"]["finalizers"] == [BILLING_FINALIZER]


def test_a_deleted_pod_is_billed_to_its_containers_end_then_let_go(biller: Biller, fake_kube: FakeKube) -> None:
    deleted = pod_object(fake_kube, "deleted", {"phase": "Running", "containerStatuses": [
        {"name": "main", "state": {"terminated": {"finishedAt": "2026-11-25T10:01:00Z"}}}]}, deleting="2026-11-25T10:01:30Z")
    watch(biller, deleted)
    biller.bill(at(3600))  # the timekeeper came back an hour later: billed to the end, not to its return
    assert billed(biller.ledger, deleted["metadata"]["uid"]) == 60 * MICROS
    assert fake_kube.pods["ml", "deleted"]["metadata"]["finalizers"] == []


def test_a_silent_meter_is_flagged_with_one_event_and_the_pod_still_billed(biller: Biller, fake_kube: FakeKube) -> None:
    silent = pod_object(fake_kube, "silent", {"phase": "Running"})
    watch(biller, silent)
    first = biller.bill(at(120))
    biller._last_full = None  # the next full pass
    second = biller.bill(at(150))
    assert first is not None and first.silent == ["ml/silent"] and second is not None and second.silent == []
    assert [e["reason"] for e in fake_kube.events] == [METER_SILENT]
    assert fake_kube.events[0]["involvedObject"]["uid"] == silent["metadata"]["uid"]
    assert billed(biller.ledger, silent["metadata"]["uid"]) == 150 * MICROS


def test_a_pod_deleted_without_the_finalizer_is_billed_to_its_end_as_the_watch_last_saw_it(biller: Biller, fake_kube: FakeKube) -> None:
    pod = pod_object(fake_kube, "unguarded", {"phase": "Running"})
    pod["metadata"]["finalizers"] = []
    watch(biller, pod)
    biller.bill(at(30))
    pod["status"] = {**pod["status"], "phase": "Succeeded", "containerStatuses": [
        {"name": "main", "state": {"terminated": {"finishedAt": "2026-11-25T10:00:50Z"}}}]}
    biller.pods.items = {}  # the watch's DELETED event: gone from the items, handed over as it last was
    biller._depart(recorded_pod(pod, biller.settings))  # type: ignore[arg-type]
    biller.bill(at(35))  # not a full pass: departures are billed on every pass
    assert billed(biller.ledger, pod["metadata"]["uid"]) == 50 * MICROS
    assert biller.ledger.open_observed() == []
