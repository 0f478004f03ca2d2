"""The controller's `capacity` task (timekeeper/cluster/capacity.py), on SQLite and PostgreSQL, against an HTTP fake of
the API: the GPU nodes of the shared nodes cache recorded into the capacity ledger every pass, a node's NotReady time
as down, a deleted node gone; nothing while the cache is unlisted or its watch broken; and a pod the controller bills
on a node read as that node's allocated time."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from demo.kubeapi import FakeKube
from gpusharing.contract import ANNOTATION_GPU_SHARE, BILLING_FINALIZER
from tests.timekeeper.conftest import Clock, ControllerFactory, run_controller
from timekeeper import metrics
from timekeeper.chargeback.capacity import GONE_AFTER, CapacityFigures
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.manager import ControllerManager, ControllerPass

UTC = dt.timezone.utc
START = dt.datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
HOUR = dt.timedelta(hours=1)
SECOND = 1_000_000
MINUTE = 60 * SECOND


def stamp(seconds: float) -> str:
    return (START + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu_node(name: str, gpus: str, created: float, ready: bool = True, changed: float = -3600) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": stamp(created)},
            "status": {"allocatable": {"nvidia.com/gpu": gpus}, "conditions": [
                {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": stamp(changed)}]}}


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


@pytest.fixture
def controller(make_controller: ControllerFactory, fake_kube: FakeKube) -> ControllerManager:
    fake_kube.custom["nodes"] = [gpu_node("gpu-1", "4", created=-600), gpu_node("cpu-1", "0", created=-600)]
    return make_controller(KubeApi(fake_kube.api_client()), meter_interval_seconds=30)


def run_at(controller: ControllerManager, clock: Clock, seconds: float) -> ControllerPass:
    clock.advance(seconds=seconds - (clock.at - START).total_seconds())
    return run_controller(controller)


def test_each_pass_records_the_gpu_nodes_time_down_while_not_ready_and_a_deleted_node_gone(
    controller: ControllerManager, fake_kube: FakeKube, clock: Clock,
) -> None:
    first = run_at(controller, clock, 0).capacity
    assert first is not None and first.started == ["gpu-1"]  # from its creation, 10 minutes before
    fake_kube.custom["nodes"][0] = gpu_node("gpu-1", "4", created=-600, ready=False, changed=30)
    run_at(controller, clock, 90)
    assert (metrics.GPU_CAPACITY._value.get(), metrics.GPUS_DOWN._value.get()) == (4, 4)  # type: ignore[attr-defined]
    fake_kube.custom["nodes"].pop(0)
    run_at(controller, clock, 100)  # absent for less than GONE_AFTER: not yet gone
    gone = run_at(controller, clock, 90 + GONE_AFTER.total_seconds()).capacity
    assert gone is not None and gone.gone == ["gpu-1"]
    before = START - HOUR
    lines = controller.capacity.ledger.node_hours(before, START + HOUR)
    gone_after = int(GONE_AFTER.total_seconds()) * SECOND
    assert {(line.node, line.hour): line.figures for line in lines} == {
        ("gpu-1", before): CapacityFigures(4 * 10 * MINUTE, unallocated=4 * 10 * MINUTE),
        # Ready for 30 s, NotReady from 30 s to 90 s, then absent from the cache and gone: down from 30 s on.
        ("gpu-1", START): CapacityFigures(4 * (90 * SECOND + gone_after), unallocated=4 * 30 * SECOND,
                                          down=4 * (60 * SECOND + gone_after)),
    }


def test_nothing_is_recorded_until_the_nodes_are_listed_or_while_their_watch_is_broken(
    controller: ControllerManager, clock: Clock,
) -> None:
    assert controller.capacity.run(clock.now()) is None  # not listed yet
    controller.informers.nodes.list_now()
    controller.informers.nodes.broken_since = 1.0  # its watch failed: the cache may be stale
    assert controller.capacity.run(clock.now()) is None
    controller.informers.nodes.broken_since = None
    done = controller.capacity.run(clock.now())
    assert done is not None and done.started == ["gpu-1"]


def test_a_pod_the_controller_bills_on_a_node_is_that_node_s_allocated_time(
    controller: ControllerManager, fake_kube: FakeKube, clock: Clock,
) -> None:
    pod = fake_kube.add_pod("ml", "train", share="1")
    pod["metadata"]["finalizers"] = [BILLING_FINALIZER]
    pod["metadata"]["annotations"][ANNOTATION_GPU_SHARE] = "1"
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    pod["spec"]["nodeName"] = "gpu-1"
    pod["status"] = {"phase": "Running", "startTime": stamp(0)}
    run_at(controller, clock, 0)
    run_at(controller, clock, 600)
    utilisation = controller.capacity.ledger.utilization(START, START + dt.timedelta(hours=1))
    assert utilisation.cluster == CapacityFigures(4 * 10 * MINUTE, 10 * MINUTE, 0, 3 * 10 * MINUTE, 0, 0)
