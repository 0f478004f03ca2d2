"""A pod billed for the GPU it got: once bound, its share and GPU model are read on its node's model
(timekeeper/accounting/placement.py), one model for its life, on SQLite and PostgreSQL; a GPU node whose model the
catalogue does not know is flagged by one Event; safe admission's commitments are corrected up once bound."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from sqlalchemy import select

from demo.apiserver import example_pod
from demo.kubeapi import FakeKube
from gpusharing.contract import ANNOTATION_GPU_MODEL, ANNOTATION_GPU_SHARE
from gpusharing.gpu.capacity import node_gpus
from gpusharing.gpu.dra import no_claims
from gpusharing.gpu.request import GpuRequestSettings
from tests.timekeeper.conftest import ADMIN, AppFactory, Clock, ControllerFactory, SpecClient, run_controller
from timekeeper import metrics
from timekeeper.accounting.placement import placement
from timekeeper.accounting.record import recorded_pod
from timekeeper.budgets.commitments import CommittedPod, on_node
from timekeeper.cluster.billing import GPU_MODEL_UNKNOWN
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.manager import ControllerManager
from timekeeper.database.tables import committed_pods

UTC = dt.timezone.utc
START = dt.datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
SETTINGS = GpuRequestSettings()
CATALOGUE = SETTINGS.catalogue
A100, T4, H200 = "NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA H200"


def gpushare_pod(name: str = "infer", node: str | None = None, admitted: str = "0.0625",
                 product: str | None = None) -> dict[str, Any]:
    """docs' gpushare example (5 GiB), as the webhook admitted it naming no model (read on the default A100 80 GB)."""
    pod = example_pod("aliyun-gpu-mem.yaml")
    pod["metadata"].update(name=name, namespace="ml", uid=f"uid-{name}")
    pod["metadata"]["annotations"] = {ANNOTATION_GPU_SHARE: admitted, ANNOTATION_GPU_MODEL: A100}
    if node is not None:
        pod["spec"]["nodeName"] = node
    if product is not None:
        pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": product}
    pod["status"] = {"phase": "Running", "startTime": "2026-11-25T10:00:00Z"}
    return pod


def gpu_node(name: str, product: str | None, gpus: str = "4") -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": product} if product else {}
    return {"metadata": {"name": name, "uid": f"node-uid-{name}", "labels": labels},
            "status": {"allocatable": {"aliyun.com/gpu-count": gpus, "aliyun.com/gpu-mem": "64"}}}


NODES = {"t4-1": gpu_node("t4-1", "Tesla-T4"), "a100-1": gpu_node("a100-1", "NVIDIA-A100-SXM4-80GB"),
         "h200-1": gpu_node("h200-1", "NVIDIA-H200"), "bare-1": gpu_node("bare-1", None)}


def placed(pod: dict[str, Any]) -> tuple[float, str, str | None]:
    record = recorded_pod(pod, SETTINGS)
    assert record is not None
    node_name = pod["spec"].get("nodeName")
    node = node_gpus(NODES[node_name], CATALOGUE) if node_name in NODES else None
    found = placement(record, node, SETTINGS, no_claims)
    assert found is not None
    return round(found.share, 4), found.model.name, found.node


def test_before_it_is_bound_a_pod_is_read_as_admitted() -> None:
    assert placed(gpushare_pod()) == (0.0625, A100, None)


def test_once_bound_its_request_is_priced_on_its_node_s_model() -> None:
    assert placed(gpushare_pod(node="t4-1")) == (0.3333, T4, "t4-1")  # 5 GiB of a 15 GiB T4
    assert placed(gpushare_pod(node="a100-1")) == (0.0625, A100, "a100-1")


def test_never_below_what_was_admitted_however_large_its_node_s_gpus() -> None:
    assert placed(gpushare_pod(node="h200-1")) == (0.0625, H200, "h200-1")  # 5 GiB of 140 GiB is 0.036


def test_naming_a_model_it_does_not_run_on_lowers_nothing() -> None:
    # It names the H200 (a small share of it) and its node is a T4 (say, mislabelled by the tenant's own selector).
    pod = gpushare_pod(node="t4-1", admitted="0.0357", product="NVIDIA-H200")
    assert placed(pod) == (0.3333, T4, "t4-1")


def test_on_a_node_whose_model_is_unknown_the_default_is_billed() -> None:
    assert placed(gpushare_pod(node="bare-1")) == (0.0625, A100, "bare-1")
    assert placed(gpushare_pod(node="gone-1")) == (0.0625, A100, None)  # a node not cached: as admitted


def test_a_commitment_is_corrected_up_once_bound_never_down() -> None:
    admitted = CommittedPod("ml", 0.0625, 1000, 3600, None)
    assert on_node(admitted, 0.3334, 1000).share == 0.3334
    assert on_node(admitted, 0.036, 1000) is admitted
    assert on_node(admitted, 0.0625, 2000).weight == 2000  # a dearer model at the same share


# -- the controller on an HTTP fake of the API (the real one: tests/cluster/test_models.py) --------------------------

@pytest.fixture
def controller(make_controller: ControllerFactory, fake_kube: FakeKube) -> ControllerManager:
    fake_kube.custom["nodes"] = list(NODES.values())
    return make_controller(KubeApi(fake_kube.api_client()), meter_interval_seconds=30)


def run_at(controller: ControllerManager, clock: Clock, seconds: float) -> Any:
    clock.advance(seconds=seconds - (clock.at - START).total_seconds())
    return run_controller(controller)


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


def test_the_controller_bills_each_pod_on_its_node_s_model_and_flags_the_unknown_node_once(
    controller: ControllerManager, fake_kube: FakeKube, clock: Clock, make_app: AppFactory,
) -> None:
    for node in ("t4-1", "a100-1", "bare-1"):
        fake_kube.pods["ml", f"on-{node}"] = gpushare_pod(f"on-{node}", node)
    run_at(controller, clock, 60)
    second = run_at(controller, clock, 120)
    assert second.billing is not None and second.billing.observed == 3
    api = SpecClient(make_app().test_client(), ADMIN)
    pods = {p["pod"]: (p["gpuModel"], round(p["gpuShare"], 4), p["gpuSeconds"])
            for p in api.get("/api/v1/pods?namespace=ml").json["items"]}
    assert pods == {"on-t4-1": (T4, 0.3333, pytest.approx(120 * 5120 / 15360)),
                    "on-a100-1": (A100, 0.0625, pytest.approx(7.5)), "on-bare-1": (A100, 0.0625, pytest.approx(7.5))}
    unknown = [e for e in fake_kube.events if e["reason"] == GPU_MODEL_UNKNOWN]
    assert [e["involvedObject"]["name"] for e in unknown] == ["bare-1"]  # once, though two passes saw it
    assert "has no nvidia.com/gpu.product label" in unknown[0]["message"]
    assert metrics.GPU_NODES_UNKNOWN_MODEL._value.get() == 1  # type: ignore[attr-defined]


def test_a_pod_s_deadline_commits_what_it_holds_on_its_node_once_bound(
    controller: ControllerManager, fake_kube: FakeKube, clock: Clock,
) -> None:
    for name, node in (("waiting", None), ("on-t4", "t4-1"), ("on-h200", "h200-1")):
        pod = fake_kube.pods["ml", name] = gpushare_pod(name, node)
        pod["spec"]["activeDeadlineSeconds"] = 3600
    run_at(controller, clock, 10)
    with controller.commitments.db.read() as conn:
        shares = {row.name: round(row.share, 4) for row in conn.execute(select(committed_pods))}
    assert shares == {"waiting": 0.0625, "on-t4": 0.3333, "on-h200": 0.0625}


def test_a_meter_s_report_is_charged_on_its_node_s_model_whatever_model_the_meter_names(
    make_app: AppFactory, fake_kube: FakeKube,
) -> None:
    fake_kube.custom["nodes"] = list(NODES.values())
    api = SpecClient(make_app(kube=KubeApi(fake_kube.api_client()), auth="tokenreview").test_client(), ADMIN)
    pod = fake_kube.add_pod("ml", "metered", share="0.0625")
    pod["spec"]["nodeName"] = "t4-1"
    body = {"podUid": pod["metadata"]["uid"], "namespace": "ml", "pod": "metered", "gpuShare": 0.0625, "seq": 1,
            "gpuSeconds": 6.25, "gpuModel": "NVIDIA H200"}  # the tenant's meter says a dearer-by-memory H200
    answer = api.as_(fake_kube.pod_token(pod)).post("/api/v1/reports", json=body)
    assert answer.status_code == 200 and answer.json["chargedGpuSeconds"] == 6.25
    (row,) = api.get("/api/v1/pods?namespace=ml").json["items"]
    assert (row["gpuModel"], row["meterGpuModel"]) == (T4, H200)


def test_a_bound_hami_pod_is_priced_on_its_node_s_model_though_hami_refuses_pods_created_bound() -> None:
    pod = example_pod("hami-fraction.yaml")  # gpumem 3000, gpucores 30
    pod["metadata"].update(namespace="ml", uid="uid-hami", annotations={ANNOTATION_GPU_SHARE: "0.05"})
    for side in ("limits", "requests"):
        pod["spec"]["containers"][0]["resources"].get(side, {}).update({"nvidia.com/gpucores": 5})
    pod["spec"]["nodeName"] = "t4-1"
    pod["status"] = {"phase": "Running", "startTime": "2026-11-25T10:00:00Z"}
    assert placed(pod) == (0.1953, T4, "t4-1")  # 3000 MiB of a T4's 15360
