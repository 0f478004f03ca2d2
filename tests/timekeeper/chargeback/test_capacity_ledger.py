"""The GPU capacity ledger as stored (timekeeper/database/chargeback/capacity.py), on SQLite and PostgreSQL: each GPU
node's time recorded by the hour exactly once, whoever observes and however often (the same observation twice, an
older one, two controllers at once); nodes first seen, gone and re-created; cordoned and HAMi nodes counted by their
GPUs; and each node-hour read beside what the pods bound to it were billed, its identity exact."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from gpusharing.gpu.capacity import NodeGpus, node_gpus
from gpusharing.gpu.catalogue import shipped_catalogue
from tests.timekeeper.conftest import Clock
from timekeeper.accounting.ledger import Observation
from timekeeper.chargeback.capacity import GONE_AFTER, CapacityFigures, NodeTime, Stretch, node_time, summed
from timekeeper.database.accounting.charging import PodObservation, ReportLedger
from timekeeper.database.budgets.store import BudgetStore
from timekeeper.database.chargeback.capacity import CapacityLedger
from timekeeper.database.connection import Database
from timekeeper.database.tables import node_capacity, node_hours

UTC = dt.timezone.utc
CATALOGUE = shipped_catalogue()
H = dt.datetime(2026, 11, 25, 10, tzinfo=UTC)
MICRO = 1_000_000
H100 = "NVIDIA H100 80GB HBM3"


def at(minutes: float) -> dt.datetime:
    return H + dt.timedelta(minutes=minutes)


def stamp(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


LONG_AGO = at(-120)


def node(name: str, allocatable: dict[str, str], uid: str | None = None, ready: bool = True,
         changed: dt.datetime = LONG_AGO, created: dt.datetime = LONG_AGO, cordoned: bool = False,
         annotations: dict[str, str] | None = None) -> NodeGpus:
    """A Node as the API server serves it, read as the nodes cache reads it."""
    return node_gpus({
        "metadata": {"name": name, "uid": uid or f"uid-{name}", "creationTimestamp": stamp(created),
                     "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, "annotations": annotations or {}},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {"allocatable": {"cpu": "64", **allocatable}, "conditions": [
            {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": stamp(changed)}]},
    }, CATALOGUE)


def gpus(count: int, **kwargs: Any) -> NodeGpus:
    return node("gpu-1", {"nvidia.com/gpu": str(count)}, **kwargs)


@pytest.fixture
def databases(database_url: str) -> Iterator[list[Database]]:
    """Two controllers' connections to one database."""
    dbs = [Database(database_url), Database(database_url)]
    yield dbs
    for db in dbs:
        db.dispose()


@pytest.fixture
def ledger(databases: list[Database]) -> CapacityLedger:
    return CapacityLedger(databases[0])


def recorded(ledger: CapacityLedger) -> dict[tuple[str, dt.datetime], NodeTime]:
    with ledger.db.read() as conn:
        return {(row.node, row.hour): NodeTime(row.capacity_micro_gpu_seconds, row.down_micro_gpu_seconds)
                for row in conn.execute(select(node_hours))}


def cursors(ledger: CapacityLedger) -> dict[str, tuple[str, dt.datetime, dt.datetime | None]]:
    with ledger.db.read() as conn:
        return {row.node: (row.uid, row.observed_until, row.gone_at) for row in conn.execute(select(node_capacity))}


def expected(name: str, micro: int, *spans: Stretch) -> dict[tuple[str, dt.datetime], NodeTime]:
    return {(name, hour): time for hour, time in node_time(micro, list(spans)).items()}


def test_a_node_s_time_is_recorded_by_the_hour_from_its_creation_its_down_time_split_where_it_changed(
    ledger: CapacityLedger,
) -> None:
    ledger.observe({"gpu-1": gpus(8, created=at(-20), changed=at(-18))}, at(-10))  # Ready 2 minutes after creation
    ledger.observe({"gpu-1": gpus(8, created=at(-20), changed=at(-18))}, at(40))
    done = ledger.observe({"gpu-1": gpus(8, ready=False, created=at(-20), changed=at(55))}, at(70))  # NotReady at 55
    assert done.advanced == ["gpu-1"] and done.started == [] and done.gone == []
    assert recorded(ledger) == {
        ("gpu-1", at(-60)): NodeTime(8 * 20 * 60 * MICRO, 8 * 2 * 60 * MICRO),
        ("gpu-1", at(0)): NodeTime(8 * 3600 * MICRO, 8 * 5 * 60 * MICRO),
        ("gpu-1", at(60)): NodeTime(8 * 600 * MICRO, 8 * 600 * MICRO),
    }
    assert cursors(ledger) == {"gpu-1": ("uid-gpu-1", at(70), None)}


def test_the_same_observation_twice_or_an_older_one_adds_nothing(ledger: CapacityLedger) -> None:
    ledger.observe({"gpu-1": gpus(8)}, at(0))
    first = ledger.observe({"gpu-1": gpus(8)}, at(5))
    assert first.added == NodeTime(8 * 300 * MICRO)
    assert ledger.observe({"gpu-1": gpus(8)}, at(5)).added == NodeTime(0)
    late = ledger.observe({"gpu-1": gpus(4)}, at(3))  # another controller's, from before
    assert late.advanced == [] and late.added == NodeTime(0)
    assert recorded(ledger) == {("gpu-1", at(0)): NodeTime(8 * 300 * MICRO)}
    assert cursors(ledger)["gpu-1"][1] == at(5)


def test_two_controllers_observing_at_once_record_each_second_once(databases: list[Database]) -> None:
    """Two leaders for a moment (or a deposed one's last pass): every node's cursor, locked, moves once per instant;
    each node is started by one of them, and the hours add up to its GPUs × the time from its creation exactly."""
    ledgers = [CapacityLedger(db) for db in databases]
    nodes = {f"gpu-{i}": node(f"gpu-{i}", {"nvidia.com/mig-1g.10gb": str(i + 1)}, created=at(-30)) for i in range(6)}

    def controller(ledger: CapacityLedger, offset: float) -> None:
        for step in range(40):
            ledger.observe(nodes, at(-30 + step * 2.5 + offset))

    threads = [threading.Thread(target=controller, args=(ledger, offset)) for ledger, offset in zip(ledgers, (0, 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    last = at(-30 + 39 * 2.5 + 1)
    truth: dict[tuple[str, dt.datetime], NodeTime] = {}
    for name, read in nodes.items():
        micro = round(read.installed * MICRO)  # 1/7 of an A100 80 GB per slice: no whole micro-GPU-seconds a second
        truth.update(expected(name, micro, Stretch(at(-30), last, False)))
    assert recorded(ledgers[0]) == truth
    assert {until for _, until, _ in cursors(ledgers[0]).values()} == {last}


def test_a_gone_node_counts_down_from_its_last_observation_and_is_recorded_no_more(ledger: CapacityLedger) -> None:
    ledger.observe({"gpu-1": gpus(8), "gpu-2": gpus(8, uid="uid-2")}, at(0))
    ledger.observe({"gpu-2": gpus(8, uid="uid-2")}, at(1))  # gpu-1 missing from the cache: not gone yet
    gone_at = at(0) + GONE_AFTER
    done = ledger.observe({"gpu-2": gpus(8, uid="uid-2")}, gone_at)
    assert done.gone == ["gpu-1"]
    assert ledger.observe({"gpu-1": gpus(8), "gpu-2": gpus(8, uid="uid-2")}, at(10)).advanced == ["gpu-2"]  # stale
    hours = recorded(ledger)
    assert hours[("gpu-1", at(0))] == NodeTime(8 * int(GONE_AFTER.total_seconds()) * MICRO,
                                               8 * int(GONE_AFTER.total_seconds()) * MICRO)
    assert cursors(ledger)["gpu-1"] == ("uid-gpu-1", gone_at, gone_at)
    # Re-created under its name: a new node, from its creation.
    again = ledger.observe({"gpu-1": gpus(4, uid="uid-new", created=at(12)), "gpu-2": gpus(8, uid="uid-2")}, at(15))
    assert again.advanced == ["gpu-1", "gpu-2"]
    assert recorded(ledger)[("gpu-1", at(0))] == NodeTime(8 * int(GONE_AFTER.total_seconds()) * MICRO + 4 * 180 * MICRO,
                                                          8 * int(GONE_AFTER.total_seconds()) * MICRO)
    assert cursors(ledger)["gpu-1"] == ("uid-new", at(15), None)


def test_a_node_re_created_while_observed_closes_the_old_one_down_until_the_new_one_was_created(
    ledger: CapacityLedger,
) -> None:
    ledger.observe({"gpu-1": gpus(8)}, at(0))
    ledger.observe({"gpu-1": gpus(2, uid="uid-new", created=at(1))}, at(3))
    assert recorded(ledger) == {("gpu-1", at(0)): NodeTime(8 * 60 * MICRO + 2 * 120 * MICRO, 8 * 60 * MICRO)}


def test_cordoned_and_hami_nodes_count_their_gpus_and_a_node_without_any_is_not_recorded(
    ledger: CapacityLedger,
) -> None:
    register = "".join(f"GPU-{i},10,81559,100,NVIDIA-NVIDIA H100 80GB HBM3,0,true:" for i in range(4))
    nodes = {
        "cordoned": node("cordoned", {"nvidia.com/gpu": "8"}, cordoned=True),
        "hami": node("hami", {"nvidia.com/gpu": "40", "nvidia.com/gpumem": "326236"},
                     annotations={"hami.io/node-nvidia-register": register}),  # 4 devices of 10 vGPU slots
        "hami-sim": node("hami-sim", {"nvidia.com/gpu": "80", "nvidia.com/gpucores": "800"}),
        "cpu": node("cpu", {}),
    }
    ledger.observe(nodes, at(0))
    ledger.observe(nodes, at(1))
    minute = 60 * MICRO
    assert recorded(ledger) == {("cordoned", at(0)): NodeTime(8 * minute), ("hami", at(0)): NodeTime(4 * minute),
                                ("hami-sim", at(0)): NodeTime(8 * minute)}
    assert "cpu" not in cursors(ledger)


def pod(uid: str, node_name: str | None, share: float, start: float, until: float, model: str = H100) -> PodObservation:
    return PodObservation(uid, "ml", f"pod-{uid}", share, Observation(share, at(start), at(until), True), (), model,
                          node_name)


def test_each_node_hour_is_read_beside_what_its_pods_were_billed_in_it(
    ledger: CapacityLedger, databases: list[Database], clock: Clock,
) -> None:
    ledger.observe({"gpu-1": gpus(2, created=at(-30)), "gpu-2": gpus(1, ready=False, changed=at(30))}, at(-30))
    ledger.observe({"gpu-1": gpus(2, created=at(-30)), "gpu-2": gpus(1, ready=False, changed=at(30))}, at(60))
    clock.at = at(90)
    bills = ReportLedger(BudgetStore(databases[1], clock=clock))
    bills.observe([pod("a", "gpu-1", 1.0, -30, 30), pod("b", "gpu-1", 0.5, 0, 60),
                   pod("c", "gpu-2", 1.0, 0, 45),  # billed from the record while its node went NotReady at 30
                   pod("d", "gpu-3", 0.25, 0, 60),  # a node whose capacity was not recorded
                   pod("e", None, 1.0, 0, 12),  # never bound
                   pod("f", "gpu-1", 0.5, 0, 20, model="Tesla T4")])  # on its node, whatever its model
    lines = {(line.node, line.hour): line.figures for line in ledger.node_hours(at(-60), at(60))}
    minute = 60 * MICRO
    assert lines == {
        ("gpu-1", at(-60)): CapacityFigures(2 * 30 * minute, 30 * minute, 0, 30 * minute, 0, 0),
        ("gpu-1", at(0)): CapacityFigures(2 * 60 * minute, 30 * minute + 30 * minute + 10 * minute, 0, 50 * minute, 0,
                                          0),
        ("gpu-2", at(-60)): CapacityFigures(30 * minute, 0, 0, 30 * minute, 0, 0),  # first seen at -30: from then
        ("gpu-2", at(0)): CapacityFigures(60 * minute, 45 * minute, 0, 0, 15 * minute, 0),
        ("gpu-3", at(0)): CapacityFigures(0, 15 * minute, 0, 0, 0, 15 * minute),
        (None, at(0)): CapacityFigures(0, 12 * minute, 0, 0, 0, 12 * minute),
    }
    totals = ledger.utilization(at(-60), at(60))
    assert totals.cluster == summed(lines.values())
    assert list(totals.models) == [H100]  # the nodes' model; the lines of pods on no node or unrecorded nodes, theirs
    cluster = totals.cluster
    assert cluster.allocated - cluster.over + cluster.unallocated + cluster.down == cluster.capacity
