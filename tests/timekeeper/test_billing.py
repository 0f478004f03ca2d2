"""Billing from the API server's record, on SQLite and PostgreSQL: each pod billed its share from its recorded start to
its recorded end, exactly once across processes; the meter's reports add only what the record cannot see; a pod's
finalizer comes off once its bill is closed; silent meters are flagged once."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from demo.kubeapi import FakeKube
from gpusharing.contract import ANNOTATION_GPU_SHARE, BILLING_FINALIZER, fresh_for
from gpusharing.report import MeterReport
from tests.timekeeper.conftest import Clock, ControllerFactory, run_controller
from timekeeper.accounting.ledger import Observation
from timekeeper.cluster.billing import METER_SILENT
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.manager import ControllerManager
from timekeeper.database.accounting.charging import PodObservation, ReportLedger, ReportTerms
from timekeeper.database.budgets.store import BudgetStore
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


def test_two_replicas_observing_at_once_bill_share_times_recorded_time_exactly(
    ledgers: list[ReportLedger], clock: Clock
) -> None:
    uids = [f"uid-{i}" for i in range(20)]
    ends = {uid: 60 + 7 * i for i, uid in enumerate(uids)}

    def replica(ledger: ReportLedger, offset: float) -> None:
        for until in range(10, 200, 10):
            ledger.observe(
                [observed(uid, min(until + offset, ends[uid]), ended=until + offset >= ends[uid]) for uid in uids]
            )

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
        clock.at = at(interval)
        reading = MeterReport(uid, "ml", f"pod-{uid}", 0.5, 1, 0.5 * interval, gpu_utilization_percent=0.0)
        ledger.record([(reading, ReportTerms(0.5, None, started_at=START))])  # the interval it covers: idle
        clock.at = at(interval + silence)
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


def test_silence_is_flagged_once_by_one_process_and_a_report_clears_it(
    ledgers: list[ReportLedger], clock: Clock
) -> None:
    ledgers[0].observe([observed("uid-1", 30), observed("uid-2", 30)])
    ledgers[0].record(
        [(MeterReport("uid-2", "ml", "pod-uid-2", 0.5, 1, 10.0), ReportTerms(0.5, None, started_at=START))]
    )
    quiet_since = START - dt.timedelta(seconds=1)  # uid-2's meter reported since: not silent
    assert ledgers[0].claim_silent(["uid-1", "uid-2"], quiet_since, at(60)) == ["uid-1"]
    assert ledgers[1].claim_silent(["uid-1", "uid-2"], quiet_since, at(61)) == []
    ledgers[0].record(
        [(MeterReport("uid-1", "ml", "pod-uid-1", 0.5, 1, 1.0), ReportTerms(0.5, None, started_at=START))]
    )
    assert ledgers[0].silent_meters(120, 3600) == 0


# -- the controller's billing tasks, against an HTTP fake of the API (the real one: tests/e2e/test_billing.py)
# ----------

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
def controller(make_controller: ControllerFactory, fake_kube: FakeKube) -> ControllerManager:
    return make_controller(KubeApi(fake_kube.api_client()), meter_interval_seconds=30)


def run_at(controller: ControllerManager, clock: Clock, seconds: float) -> Any:
    """The controller's tasks once, at START + `seconds`, on what the fake API holds."""
    clock.advance(seconds=seconds - (clock.at - START).total_seconds())
    return run_controller(controller)


def test_a_pass_bills_running_pods_and_closes_and_releases_the_ended_ones(
    controller: ControllerManager, fake_kube: FakeKube, ledgers: list[ReportLedger], clock: Clock,
) -> None:
    running = pod_object(fake_kube, "running", {"phase": "Running"})
    ended = pod_object(fake_kube, "ended", {"phase": "Succeeded", "containerStatuses": [
        {"name": "main", "state": {"terminated": {"finishedAt": "2026-11-25T10:00:40Z"}}}]})
    done = run_at(controller, clock, 90).billing
    assert done is not None and done.released == ["ml/ended"] and done.observed == 2
    assert fake_kube.pods["ml", "ended"]["metadata"]["finalizers"] == []
    assert fake_kube.pods["ml", "running"]["metadata"]["finalizers"] == [BILLING_FINALIZER]
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in (running, ended)}
    assert billed(ledgers[0], uids["running"]) == 90 * MICROS and billed(ledgers[0], uids["ended"]) == 40 * MICROS


def test_a_finalizer_is_not_released_while_the_bill_cannot_be_written(
    controller: ControllerManager, fake_kube: FakeKube, clock: Clock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    ended = pod_object(fake_kube, "ended", {"phase": "Failed", "containerStatuses": [
        {"name": "main", "state": {"terminated": {"finishedAt": "2026-11-25T10:00:40Z"}}}]})

    def unwritable(observations: Any) -> None:
        raise OperationalError("INSERT INTO pod_ledgers", {}, Exception("disk I/O error"))

    monkeypatch.setattr(controller.biller.ledger, "observe", unwritable)  # the database refuses the bill's transaction
    done = run_at(controller, clock, 90)
    # The tasks failed (logged; they run again at their next time): no bill closed, no finalizer released.
    assert done.billing is None and done.ended is None
    assert fake_kube.pods["ml", "ended"]["metadata"]["finalizers"] == [BILLING_FINALIZER]
    assert ended["metadata"]["finalizers"] == [BILLING_FINALIZER]
    monkeypatch.undo()  # the database is back: the next run closes the bill, then lets the pod go
    assert run_at(controller, clock, 95).billing.released == ["ml/ended"]  # type: ignore[union-attr]


def test_a_deleted_pod_is_billed_to_its_containers_end_then_let_go(
    controller: ControllerManager, fake_kube: FakeKube, ledgers: list[ReportLedger], clock: Clock,
) -> None:
    deleted = pod_object(
        fake_kube,
        "deleted",
        {
            "phase": "Running",
            "containerStatuses": [{"name": "main", "state": {"terminated": {"finishedAt": "2026-11-25T10:01:00Z"}}}],
        },
        deleting="2026-11-25T10:01:30Z",
    )
    run_at(controller, clock, 3600)  # the timekeeper came back an hour later: billed to the end, not to its return
    assert billed(ledgers[0], deleted["metadata"]["uid"]) == 60 * MICROS
    assert fake_kube.pods["ml", "deleted"]["metadata"]["finalizers"] == []


def test_a_silent_meter_is_flagged_with_one_event_and_the_pod_still_billed(
    controller: ControllerManager, fake_kube: FakeKube, ledgers: list[ReportLedger], clock: Clock,
) -> None:
    silent = pod_object(fake_kube, "silent", {"phase": "Running"})
    first = run_at(controller, clock, 120)
    second = run_at(controller, clock, 150)  # every task runs again: the silent-meters task does not flag it twice
    assert first.silent == ["ml/silent"] and second.silent == []
    assert [e["reason"] for e in fake_kube.events] == [METER_SILENT]
    assert fake_kube.events[0]["involvedObject"]["uid"] == silent["metadata"]["uid"]
    assert billed(ledgers[0], silent["metadata"]["uid"]) == 150 * MICROS


def test_a_pod_deleted_without_the_finalizer_is_billed_to_its_end_as_the_watch_last_saw_it(
    controller: ControllerManager, fake_kube: FakeKube, ledgers: list[ReportLedger], clock: Clock,
) -> None:
    pod = pod_object(fake_kube, "unguarded", {"phase": "Running"})
    pod["metadata"]["finalizers"] = []
    run_at(controller, clock, 30)
    pod["status"] = {**pod["status"], "phase": "Succeeded", "containerStatuses": [
        {"name": "main", "state": {"terminated": {"finishedAt": "2026-11-25T10:00:50Z"}}}]}
    # Gone at once (no finalizer): only the pod watch's DELETED event carries how it ended.
    pods, asked = controller.informers.pods, fake_kube.count("GET", "/api/v1/pods")
    pods.start()
    try:
        deadline = time.monotonic() + 10  # stops a broken test from hanging; not a speed check
        while fake_kube.count("GET", "/api/v1/pods") < asked + 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # listed, and watching
        fake_kube.delete_pod("ml", "unguarded")
        while pods.items and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pods.items == {}
    finally:
        pods.stop()
    done = run_at(controller, clock, 35)  # the cache, stopped, is listed again: the pod is no longer there
    assert done.billing is not None and done.billing.observed == 1
    assert billed(ledgers[0], pod["metadata"]["uid"]) == 50 * MICROS
    assert ledgers[0].open_observed() == []


def test_a_pod_billed_past_its_recorded_end_is_billed_to_its_end_once_the_end_arrives(
    controller: ControllerManager, fake_kube: FakeKube, ledgers: list[ReportLedger], clock: Clock,
) -> None:
    # The bills pass at 90 s still saw it running; its kubelet then wrote that its containers had finished at 85 s.
    pod = pod_object(fake_kube, "tail", {"phase": "Running"})
    run_at(controller, clock, 90)
    uid = pod["metadata"]["uid"]
    assert billed(ledgers[0], uid) == 90 * MICROS
    pod["status"] = {"phase": "Succeeded", "startTime": "2026-11-25T10:00:00Z", "containerStatuses": [
        {"name": "main", "state": {"terminated": {"finishedAt": "2026-11-25T10:01:25Z"}}}]}
    run_at(controller, clock, 95)
    assert billed(ledgers[0], uid) == 85 * MICROS  # 1 GPU from its start to its finishedAt, not a second past it
    with ledgers[0].db.read() as conn:
        charged = conn.execute(select(func.sum(pod_usage.c.micro_gpu_seconds)).where(pod_usage.c.pod_uid == uid))
        assert charged.scalar_one() == 85 * MICROS  # the usage the reports sum, corrected alike
    assert ledgers[0].budgets.status("ml").used_micro_gpu_seconds == 85 * MICROS
