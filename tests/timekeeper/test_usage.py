"""Usage reports (GET /api/v1/usage, `gpusharing usage`), per-pod billing metrics, idle GPU-minutes; both databases."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest
from flask import Flask

from demo.kubeapi import FakeKube
from gpusharing.usage_report import MAX_RECORDED_LABELS, recorded_labels
from tests.timekeeper.conftest import ADMIN, METER, READER, Clock, SpecClient, served
from tests.timekeeper.test_api import report
from tests.timekeeper.test_auth import cluster  # noqa: F401 (a fixture)
from tests.timekeeper.test_cli import run
from timekeeper.database.accounting.usage import PodCharge, pod_charge

MICROS = 1_000_000


def send(api: SpecClient, *reports: dict[str, Any]) -> None:
    for body in reports:
        assert api.as_(METER).post("/api/v1/reports", json=body).json["outcome"] == "charged"


def micros(gpu_seconds: float) -> int:
    return round(gpu_seconds * MICROS)


def test_a_meters_charges_without_a_recorded_start_fall_on_the_day_received_exact_to_the_micro_gpu_second(
        api: SpecClient, clock: Clock) -> None:
    # The clock starts at 2028-02-28 23:00 UTC: the last hour of a day, and a leap day follows.
    send(api, report(1, 10.000001), report(1, 0.000003, pod="eval", namespace="team-b"))
    clock.advance(minutes=59, seconds=59, microseconds=999_999)
    send(api, report(2, 20.000002))  # 2028-02-28 23:59:59.999999
    clock.advance(microseconds=1)
    send(api, report(3, 20.000005), report(2, 1.5, pod="eval", namespace="team-b"))  # 2028-02-29 00:00:00
    clock.advance(days=1)
    send(api, report(4, 3600.25))  # 2028-03-01: another day, another month

    answer = api.get("/api/v1/usage?from=2028-02-28&to=2028-03-02&groupBy=namespace,day")
    assert answer.status_code == 200
    body = answer.json
    got = {(item["namespace"], item["day"]): micros(item["gpuSeconds"]) for item in body["items"]}
    assert got == {
        ("team-a", "2028-02-28"): 20_000_002,
        ("team-a", "2028-02-29"): 3,
        ("team-a", "2028-03-01"): 3_600_250_000 - 20_000_005,
        ("team-b", "2028-02-28"): 3,
        ("team-b", "2028-02-29"): 1_500_000 - 3,
    }
    assert [(item["namespace"], item["day"]) for item in body["items"]] == sorted(got)
    assert body["fields"] == ["namespace", "day"] and body["groupBy"] == ["namespace", "day"]
    assert micros(body["total"]["gpuSeconds"]) == 3_600_250_000 + 1_500_000
    # `to` is the first day not counted; a pod's usage in February is what the monthly budget counted then.
    february = api.get("/api/v1/usage?from=2028-02-01&to=2028-03-01&groupBy=pod&namespace=team-a").json
    assert [
        (item["namespace"], item["pod"], item["podUid"], micros(item["gpuSeconds"])) for item in february["items"]
    ] == [("team-a", "trainer", "uid-team-a-trainer", 20_000_005)]
    clock.advance(days=-1)
    assert micros(api.get("/api/v1/budgets/team-a").json["usedGpuMinutes"] * 60) == 20_000_005


def test_idle_gpu_minutes_are_reported_beside_the_bill_where_utilisation_is_read(api: SpecClient) -> None:
    send(
        api,
        report(1, 60, gpuUtilizationPercent=25),  # 60 GPU-seconds, 45 of them idle
        report(2, 120, gpuUtilizationPercent=100),  # 60 more, none idle
        report(3, 180),  # 60 more, utilisation unknown: not metered
        report(1, 60, pod="blind", namespace="team-b"),
    )
    items = api.get("/api/v1/usage?from=2028-02-28&to=2028-02-29").json["items"]
    assert items == [
        {
            "namespace": "team-a",
            "gpuSeconds": 180.0,
            "gpuMinutes": 3.0,
            "billedGpuSeconds": 180.0,
            "billedGpuMinutes": 3.0,
            "meteredGpuMinutes": 2.0,
            "idleGpuMinutes": 0.75,
            "idleBilledGpuMinutes": 0.75,
        },
        {
            "namespace": "team-b",
            "gpuSeconds": 60.0,
            "gpuMinutes": 1.0,
            "billedGpuSeconds": 60.0,
            "billedGpuMinutes": 1.0,
            "meteredGpuMinutes": 0.0,
            "idleGpuMinutes": None,
            "idleBilledGpuMinutes": None,
        },
    ]


def test_the_idle_part_is_integer_arithmetic() -> None:
    # 875,000.875 rounded down
    assert pod_charge(1_000_001, 1000, 12.5) == PodCharge(1_000_001, 1_000_001, 1_000_001, 875_000, 875_000)
    # a thousandth of a percent: 33.334
    assert pod_charge(100_000, 1000, 33.3335) == PodCharge(100_000, 100_000, 100_000, 66_666, 66_666)
    assert pod_charge(7, 2500, None) == PodCharge(7, 17)  # 17.5 rounded down
    big = 3 * 10**17
    assert pod_charge(big, 1000, 0.001) == PodCharge(big, big, big, big - 3 * 10**12, big - 3 * 10**12)
    # The idle part's cost is weighted as the charge was: an H100 minute idle costs 2.5 T4 minutes.
    assert pod_charge(1_000_000, 2500, 40) == PodCharge(1_000_000, 2_500_000, 1_000_000, 600_000, 1_500_000)


def test_the_csv_reads_back_as_the_json(api: SpecClient) -> None:
    send(api, report(1, 12.345678, gpuUtilizationPercent=50), report(1, 0.000001, pod="tiny"),
         report(1, 7, pod="eval", namespace="team-b"))
    query = "/api/v1/usage?from=2028-02-28&to=2028-02-29&groupBy=pod,day"
    as_csv = api.get(query, headers={"Accept": "text/csv"})
    assert as_csv.status_code == 200 and as_csv.content_type.startswith("text/csv")
    assert as_csv.headers["Content-Disposition"] == 'attachment; filename="gpu-usage-2028-02-28-2028-02-29.csv"'
    rows = list(csv.DictReader(io.StringIO(as_csv.data.decode())))
    items = api.get(query).json["items"]
    assert len(rows) == len(items) == 3
    for row, item in zip(rows, items):
        assert {key: row[key] for key in ("namespace", "pod", "podUid", "day")} == {
            key: item[key] for key in ("namespace", "pod", "podUid", "day")}
        assert micros(float(row["gpuSeconds"])) == micros(item["gpuSeconds"])
        assert float(row["gpuMinutes"]) == item["gpuMinutes"]
        assert (None if row["idleGpuMinutes"] == "" else float(row["idleGpuMinutes"])) == item["idleGpuMinutes"]
    assert sorted(micros(float(row["gpuSeconds"])) for row in rows) == [1, 7_000_000, 12_345_678]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("to=2028-03-01", "from is required"),
        ("from=2028-02-01", "to is required"),
        ("from=2028-13-01&to=2028-14-01", "from must be a UTC day"),
        ("from=2028-02-01T00:00&to=2028-03-01", "from must be a UTC day"),
        ("from=%EF%BC%92028-02-01&to=2028-03-01", "from must be a UTC day"),
        ("from=2028-03-01&to=2028-03-01", "must be after from"),
        ("from=2000-01-01&to=2028-03-01", "at most 3660 days"),
        ("from=2028-02-01&to=2028-03-01&groupBy=gpu", "groupBy keys are"),
        ("from=2028-02-01&to=2028-03-01&groupBy=", "groupBy keys are"),
        ("from=2028-02-01&to=2028-03-01&groupBy=label:Bad%20Key", "groupBy keys are"),
        ("from=2028-02-01&to=2028-03-01&groupBy=label:" + "a" * 64, "groupBy keys are"),
        ("from=2028-02-01&to=2028-03-01&groupBy=namespace,day,pod,label:a,label:b", "at most 4 keys"),
        ("from=2028-02-01&to=2028-03-01&groupBy=day,day", "names a key twice"),
        ("from=2028-02-01&to=2028-03-01&groupBy=" + "namespace," * 10_000, "at most 4 keys"),
        ("from=2028-02-01&to=2028-03-01&namespace=Bad_NS", "not a namespace name"),
    ],
)
def test_bad_usage_queries_get_400_and_say_why(api: SpecClient, query: str, message: str) -> None:
    answer = api.get(f"/api/v1/usage?{query}")
    assert answer.status_code == 400 and message in answer.json["error"], answer.json


def test_usage_needs_a_token(api: SpecClient) -> None:
    assert api.as_(None).get("/api/v1/usage?from=2028-02-01&to=2028-03-01").status_code == 401
    assert api.as_(READER).get("/api/v1/usage?from=2028-02-01&to=2028-03-01").json["items"] == []


def labelled_report(kube: FakeKube, api: SpecClient, name: str, labels: dict[str, str], gpu_seconds: float) -> None:
    pod = kube.add_pod("team-a", name, share="0.5")
    pod["metadata"]["labels"] = labels
    metadata = pod["metadata"]
    body = {
        "podUid": metadata["uid"],
        "namespace": "team-a",
        "pod": name,
        "gpuShare": 0.5,
        "seq": 1,
        "gpuSeconds": gpu_seconds,
    }
    assert api.as_(kube.pod_token(pod)).post("/api/v1/reports", json=body).json["outcome"] == "charged"


def test_usage_is_grouped_by_the_labels_pods_had_at_their_first_report(
    cluster: tuple[SpecClient, FakeKube],  # noqa: F811
) -> None:
    api, kube = cluster
    api = api.as_(ADMIN)
    labelled_report(kube, api, "a", {"team": "vision", "example.com/project": "p1"}, 60)
    labelled_report(kube, api, "b", {"team": "vision"}, 30)
    labelled_report(kube, api, "c", {"team": "speech", "example.com/project": "p1"}, 6)
    labelled_report(kube, api, "d", {}, 3)
    query = "/api/v1/usage?from=2028-02-28&to=2028-02-29&groupBy=label:team,label:example.com/project"
    items = api.get(query).json["items"]
    got = [(item["label:team"], item["label:example.com/project"], item["gpuSeconds"]) for item in items]
    # absent last
    assert got == [("speech", "p1", 6.0), ("vision", "p1", 60.0), ("vision", None, 30.0), (None, None, 3.0)]
    rows = list(csv.DictReader(io.StringIO(api.get(query, headers={"Accept": "text/csv"}).data.decode())))
    assert {(row["label:team"], row["label:example.com/project"], row["gpuSeconds"]) for row in rows} == {
        ("speech", "p1", "6.0"), ("vision", "p1", "60.0"), ("vision", "", "30.0"), ("", "", "3.0")}


def test_a_pods_labels_are_recorded_within_bounds() -> None:
    many = {f"k{index:03d}": "v" for index in range(1000)}
    hostile = {
        "team": "=HYPERLINK(\"http://evil\")",  # not a label value: never recorded, never a formula in a spreadsheet
        "x" * 64: "too-long-a-name",
        "ok": "y" * 64,
        "Example.com/key": "upper-case prefix",
        "example.com/fine": "fine",
        "": "empty",
    }
    assert recorded_labels(many) == tuple((f"k{index:03d}", "v") for index in range(MAX_RECORDED_LABELS))
    assert recorded_labels(hostile) == (("example.com/fine", "fine"),)
    assert recorded_labels(None) == () and recorded_labels({"n": 1}) == ()


def test_a_pod_with_hostile_labels_is_recorded_within_bounds(
    cluster: tuple[SpecClient, FakeKube],  # noqa: F811
) -> None:
    api, kube = cluster
    api = api.as_(ADMIN)
    labels = {f"key-{index:04d}": "v" * 63 for index in range(2000)}
    labelled_report(kube, api, "many", labels, 60)
    items = api.get("/api/v1/usage?from=2028-02-28&to=2028-02-29&groupBy=label:key-0015,label:key-0016").json["items"]
    assert [(item["label:key-0015"], item["label:key-0016"]) for item in items] == [("v" * 63, None)]


def test_metrics_show_each_running_pods_billed_share_and_minutes_by_namespace_pod_and_uid(api: SpecClient) -> None:
    send(api, report(1, 90), report(1, 30, pod="done", final=True))
    text = api.as_(None).get("/metrics").data.decode()
    assert (
        'gpusharing_timekeeper_pod_billed_gpu_share{namespace="team-a",pod="trainer",uid="uid-team-a-trainer"} 0.5'
        in text
    )
    assert (
        'gpusharing_timekeeper_pod_billed_gpu_seconds_total{namespace="team-a",pod="trainer",uid="uid-team-a-trainer"} '
        '90.0'
        in text
    )
    assert 'pod="done"' not in text  # an ended pod is no longer billed for a share


def test_gpusharing_usage_prints_a_table_csv_or_json(
    app: Flask, api: SpecClient, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUSHARING_LOG_LEVEL", "warning")
    send(api, report(1, 120, gpuUtilizationPercent=50), report(1, 60, pod="eval", namespace="team-b"))
    with served(app) as url:
        days = ("--from", "2028-02-01", "--to", "2028-03-01", "--timekeeper", url, "--token", READER)
        code, out, err = run(capsys, "usage", *days)
        assert code == 0, err
        assert out.splitlines() == [
            "NAMESPACE  GPU-MINUTES  BILLED GPU-MINUTES  IDLE GPU-MINUTES  IDLE BILLED GPU-MINUTES",
            "team-a     2.0          2.0                 1.0               1.0",
            "team-b     1.0          1.0                 -                 -",
            "TOTAL      3.0          3.0                 1.0               1.0",
        ]
        code, out, _ = run(capsys, "usage", *days, "--by", "namespace,day", "-o", "csv")
        assert code == 0
        assert [(row["namespace"], row["day"], row["gpuMinutes"]) for row in csv.DictReader(io.StringIO(out))] == [
            ("team-a", "2028-02-28", "2.0"), ("team-b", "2028-02-28", "1.0")]
        code, out, _ = run(capsys, "usage", *days, "--namespace", "team-b", "-o", "json")
        assert code == 0 and json.loads(out)["items"] == [
            {
                "namespace": "team-b",
                "gpuSeconds": 60.0,
                "gpuMinutes": 1.0,
                "billedGpuSeconds": 60.0,
                "billedGpuMinutes": 1.0,
                "meteredGpuMinutes": 0.0,
                "idleGpuMinutes": None,
                "idleBilledGpuMinutes": None,
            }
        ]
        code, out, err = run(capsys, "usage", *days, "--by", "gpu")
        assert code == 2 and out == "" and "groupBy keys are namespace, day, model, pod or label:KEY" in err
        code, out, err = run(capsys, "budget", "ls", "--timekeeper", url, "--token", READER, "-o", "csv")
        assert code == 2 and out == "" and "-o csv is for reports" in err
