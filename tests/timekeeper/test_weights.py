"""GPU-model billing weights: charged when made, never retroactively, audited; exact to the micro-GPU-second."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from demo.kubeapi import FakeKube
from gpusharing.contract import ANNOTATION_GPU_MODEL
from gpusharing.gpu.catalogue import GpuCatalogue, load_catalogue
from tests.timekeeper.conftest import ADMIN, METER, AppFactory, Clock, SpecClient
from tests.timekeeper.test_api import report
from tests.timekeeper.test_auth import cluster  # noqa: F401 (a fixture)
from tests.timekeeper.test_usage import micros

H100, T4, L4 = "NVIDIA H100 80GB HBM3", "Tesla T4", "NVIDIA L4"


def catalogue(tmp_path: Path, h100_weight: float = 4) -> tuple[GpuCatalogue, str]:
    path = tmp_path / f"gpu-models-{h100_weight}.yaml"
    path.write_text(
        f"default: {T4}\nmodels:\n- name: {T4}\n  memoryMiB: 15360\n"
        f"- name: {H100}\n  memoryMiB: 81559\n  billingWeight: {h100_weight}\n"
        f"- name: {L4}\n  memoryMiB: 23034\n  billingWeight: 1.375\n"
    )
    return load_catalogue(path), str(path)


@pytest.fixture
def api(make_app: AppFactory, tmp_path: Path) -> SpecClient:
    models, source = catalogue(tmp_path)
    return SpecClient(make_app(catalogue=models, catalogue_source=source).test_client(), ADMIN)


def charge(api: SpecClient, body: dict[str, Any]) -> dict[str, Any]:
    answer = api.as_(METER).post("/api/v1/reports", json=body)
    assert answer.status_code == 200 and answer.json["outcome"] == "charged", answer.json
    return answer.json  # type: ignore[no-any-return]


def usage(api: SpecClient, query: str) -> dict[tuple[str, ...], tuple[int, int]]:
    """(group values) -> (raw, weighted) micro-GPU-seconds."""
    body = api.get(f"/api/v1/usage?{query}").json
    return {tuple(item[f] for f in body["fields"]): (micros(item["gpuSeconds"]), micros(item["billedGpuSeconds"]))
            for item in body["items"]}


def test_each_charge_is_weighted_by_its_model_exactly_across_models_and_period_boundaries(
    api: SpecClient, clock: Clock
) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 60, "period": "monthly"})
    # 2028-02-28 23:00: an H100 (weight 4) and an L4 (weight 1.375).
    assert charge(api, report(1, 10.000001, gpuModel=H100))["billedGpuSeconds"] == 40.000004
    charge(api, report(1, 0.000007, pod="small", gpuModel=L4))  # 9.625 micro-GPU-seconds: 9, rounded down
    clock.advance(minutes=59, seconds=59, microseconds=999_999)
    charge(api, report(2, 20.000003, gpuModel=H100))  # +10.000002 at 4, the last micro-second of the day
    clock.advance(microseconds=1)  # 2028-02-29 00:00
    charge(api, report(1, 0.000003, pod="no-nvml"))  # NVML gone: the default model, a T4 (weight 1)
    charge(api, report(1, 0.499997, pod="b200", gpuModel="NVIDIA B200"))  # a model the catalogue lacks: the default
    clock.advance(days=1)  # 2028-03-01: a new day, a new month, a new budget period
    charge(api, report(3, 21.000003, gpuModel=H100))

    assert usage(api, "from=2028-02-28&to=2028-03-02&groupBy=day,model") == {
        ("2028-02-28", H100): (20_000_003, 80_000_012),
        ("2028-02-28", L4): (7, 9),
        ("2028-02-29", T4): (3 + 499_997, 3 + 499_997),
        ("2028-03-01", H100): (1_000_000, 4_000_000),
    }
    assert api.get("/api/v1/budgets/team-a").json["usedGpuMinutes"] * 60 == pytest.approx(4.0)
    clock.advance(days=-1)  # February's budget counted February's weighted charges, to the micro-GPU-second
    assert micros(api.get("/api/v1/budgets/team-a").json["usedGpuMinutes"] * 60) == 80_000_012 + 9 + 500_000
    # Grouped any way, the same integers.
    assert usage(api, "from=2028-02-01&to=2028-04-01&groupBy=namespace") == {
        ("team-a",): (20_000_003 + 7 + 500_000 + 1_000_000, 84_500_021)
    }


def test_a_pod_is_billed_on_one_model_for_its_life_and_its_meter_s_other_word_is_kept_as_evidence(
    api: SpecClient,
) -> None:
    charge(api, report(1, 10, gpuModel=H100))
    charge(api, report(2, 20, gpuModel=L4))  # the device seems to have changed: a pod does not move
    charge(api, report(3, 30))
    assert usage(api, "from=2028-02-28&to=2028-03-01&groupBy=model") == {(H100,): (30 * 10**6, 120 * 10**6)}
    (pod,) = api.get("/api/v1/pods?namespace=team-a").json["items"]
    assert (pod["gpuModel"], pod["meterGpuModel"]) == (H100, None)  # the last report named none
    charge(api, report(4, 31, gpuModel="NVIDIA B200"))
    (pod,) = api.get("/api/v1/pods?namespace=team-a").json["items"]
    assert (pod["gpuModel"], pod["meterGpuModel"]) == (H100, "NVIDIA B200")  # a name the catalogue lacks, as said
    text = api.as_(None).get("/metrics").data.decode()
    assert "gpusharing_timekeeper_meter_model_disagreements 1.0" in text


def test_budgets_count_weighted_minutes(api: SpecClient) -> None:
    api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1})
    # 59.6 weighted GPU-seconds: past the 95 % threshold
    assert charge(api, report(1, 14.9, gpuModel=H100))["state"] == "warning"
    answer = charge(api, report(2, 15, gpuModel=H100))
    assert (answer["state"], answer["chargedGpuSeconds"], answer["billedGpuSeconds"]) == (
        "over-budget",
        pytest.approx(0.1),
        pytest.approx(0.4),
    )


def test_a_weight_change_applies_from_then_on_never_before_and_is_audited(
    make_app: AppFactory, api: SpecClient, clock: Clock, tmp_path: Path
) -> None:
    charge(api, report(1, 60, gpuModel=H100))  # at 4: 240
    first = api.get("/api/v1/gpu-models").json
    assert first["default"] == T4
    assert [(m["name"], m["billingWeight"]) for m in first["items"]] == [(T4, 1.0), (H100, 4.0), (L4, 1.375)]
    assert [(c["model"], c["billingWeight"], c["changedAt"]) for c in first["changes"]] == [
        (L4, 1.375, "2028-02-28T23:00:00Z"), (H100, 4.0, "2028-02-28T23:00:00Z"), (T4, 1.0, "2028-02-28T23:00:00Z")]

    clock.advance(minutes=10)  # the ConfigMap changes and the timekeeper restarts with it: H100 at 2.5
    models, source = catalogue(tmp_path, h100_weight=2.5)
    restarted = SpecClient(make_app(catalogue=models, catalogue_source=source).test_client(), ADMIN)
    charge(restarted, report(2, 120, gpuModel=H100))  # 60 more, at 2.5: 150
    assert usage(restarted, "from=2028-02-28&to=2028-02-29&groupBy=model") == {(H100,): (120_000_000, 390_000_000)}
    changes = restarted.get("/api/v1/gpu-models").json["changes"]
    assert len(changes) == 4 and changes[0] == {
        "model": H100, "billingWeight": 2.5, "changedAt": "2028-02-28T23:10:00Z", "source": source}
    # Another worker or replica starting with the same file records nothing more.
    again = SpecClient(make_app(catalogue=models, catalogue_source=source).test_client(), ADMIN)
    charge(again, report(3, 121, gpuModel=H100))
    assert len(again.get("/api/v1/gpu-models").json["changes"]) == 4


def test_without_nvml_the_model_the_webhook_recorded_is_billed(
    make_app: AppFactory, fake_kube: FakeKube, tmp_path: Path
) -> None:
    from timekeeper.cluster.kube import KubeApi

    models, source = catalogue(tmp_path)
    api = SpecClient(make_app(kube=KubeApi(fake_kube.api_client()), auth="tokenreview", catalogue=models,
                              catalogue_source=source).test_client(), ADMIN)
    for name, recorded in (("h", H100), ("odd", "x" * 200), ("unknown", "NVIDIA B200")):
        pod = fake_kube.add_pod("team-a", name, share="0.5")
        pod["metadata"]["annotations"][ANNOTATION_GPU_MODEL] = recorded
        body = {
            "podUid": pod["metadata"]["uid"],
            "namespace": "team-a",
            "pod": name,
            "gpuShare": 0.5,
            "seq": 1,
            "gpuSeconds": 60,
        }
        assert api.as_(fake_kube.pod_token(pod)).post("/api/v1/reports", json=body).status_code == 200
    got = api.get("/api/v1/usage?from=2028-02-28&to=2028-02-29&groupBy=pod,model").json["items"]
    assert {(item["pod"], item["model"], item["billedGpuSeconds"]) for item in got} == {
        ("h", H100, 240.0), ("odd", T4, 60.0), ("unknown", T4, 60.0)}


def test_metrics_show_each_running_pods_weighted_minutes(api: SpecClient) -> None:
    charge(api, report(1, 90, gpuModel=H100))
    text = api.as_(None).get("/metrics").data.decode()
    assert (
        'gpusharing_timekeeper_pod_billed_gpu_seconds_total{namespace="team-a",pod="trainer",uid="uid-team-a-trainer"} '
        '360.0'
        in text
    )
