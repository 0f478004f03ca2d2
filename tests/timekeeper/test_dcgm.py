"""DCGM's series in Prometheus read into per-pod GPU utilisation: a device-wide figure is a pod's only where the pod
holds the device alone; on a shared GPU only the exporter's per-pod split counts; no data, NaN, a stale or foreign
name are unknown or dropped, never 0; answers beyond the bounds are refused whole. The query itself is run by
promtool on input series (dcgm_rules_test.yaml)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusharing.utilisation import PodUtilisation
from tests.timekeeper.prometheus import beside_python
from timekeeper.accounting.dcgm import (
    MAX_SERIES,
    METRIC_LABEL,
    RECORD,
    AnswerError,
    DcgmQuery,
    Series,
    pod_readings,
    read_answer,
    utilisation_query,
)
from timekeeper.accounting.record import RecordedPod

NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.timezone.utc)
HOUR_AGO = NOW - dt.timedelta(hours=1)
QUERY = DcgmQuery()
SPLIT = DcgmQuery(per_pod_metric="DCGM_FI_DEV_GPU_UTIL")
GR, UTIL = "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_GPU_UTIL"


def record(namespace: str, name: str, share: float | None = 1.0, started_at: dt.datetime | None = HOUR_AGO,
           running: bool = True, uid: str | None = None) -> RecordedPod:
    return RecordedPod(uid=uid or f"uid-{namespace}-{name}", namespace=namespace, name=name, share=share,
                       admitted=share or 1.0, model=None, labels=(), started_at=started_at, finished_at=None,
                       deleted_at=None, finalizer=None, running=running)


def pods(*records: RecordedPod) -> dict[tuple[str, str], RecordedPod]:
    return {(r.namespace, r.name): r for r in records}


def row(
    metric: str, pod: str, value: str, gpu: str = "GPU-1", namespace: str = "team-a", **labels: str
) -> dict[str, Any]:
    names = {METRIC_LABEL: metric, "exported_pod": pod, "exported_namespace": namespace, "UUID": gpu,
             "gpu": "0", "Hostname": "node-1", **labels}
    return {"metric": {k: v for k, v in names.items() if v != ""}, "value": [1764158400.0, value]}


def answer(*rows: dict[str, Any]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": list(rows)}}).encode()


def readings(
    body: bytes, known: dict[tuple[str, str], RecordedPod], query: DcgmQuery = QUERY
) -> dict[str, float | None]:
    return {
        f"{r.namespace}/{r.pod}": r.utilisation_percent
        for r in pod_readings(read_answer(body, query), known, query, NOW)
    }


def test_a_whole_gpu_reads_the_preferred_metric_and_falls_back_to_the_next() -> None:
    known = pods(record("team-a", "train"), record("team-a", "infer"))
    body = answer(row(GR, "train", "42", gpu="GPU-1"), row(UTIL, "train", "97", gpu="GPU-1"),
                  row(GR, "infer", "NaN", gpu="GPU-2"), row(UTIL, "infer", "3", gpu="GPU-2"))
    assert readings(body, known) == {"team-a/train": 42.0, "team-a/infer": 3.0}


def test_a_shared_gpus_device_wide_figure_is_given_to_none_of_its_pods() -> None:
    known = pods(record("team-a", "a"), record("team-b", "b"), record("team-a", "alone"))
    body = answer(row(GR, "a", "90"), row(GR, "b", "90", namespace="team-b"), row(UTIL, "a", "90"),
                  row(UTIL, "b", "90", namespace="team-b"), row(GR, "alone", "1", gpu="GPU-2"))
    assert readings(body, known) == {"team-a/a": None, "team-b/b": None, "team-a/alone": 1.0}


def test_a_shared_gpu_counts_pods_that_are_not_governed_and_gpus_are_told_apart_by_node_and_index_without_uuid() -> (
    None
):
    known = pods(record("team-a", "a"))
    assert readings(answer(row(GR, "a", "50"), row(GR, "intruder", "50", namespace="other")), known) == {
        "team-a/a": None
    }
    apart = answer(row(GR, "a", "50", gpu=""), row(GR, "other", "50", gpu="", Hostname="node-2"))
    assert readings(apart, known) == {"team-a/a": 50.0}


def test_the_exporters_per_pod_split_counts_on_a_shared_gpu_when_configured() -> None:
    known = pods(record("team-a", "a", uid="u-a"), record("team-b", "b", uid="u-b"))
    body = answer(
        row(GR, "a", "90"),
        row(GR, "b", "90", namespace="team-b"),  # device-wide, copied to each
        row(UTIL, "a", "85", pod_uid="u-a", vgpu="0"),
        row(UTIL, "b", "0", pod_uid="u-b", namespace="team-b", vgpu="1"),
    )
    assert readings(body, known, SPLIT) == {"team-a/a": 85.0, "team-b/b": 0.0}
    assert readings(body, known, QUERY) == {"team-a/a": None, "team-b/b": None}  # not configured: no split trusted
    # A split series without the pod's UID is no split (the exporter labels its per-pod series with pod_uid).
    assert readings(answer(row(UTIL, "a", "85"), row(UTIL, "b", "0", namespace="team-b")), known, SPLIT) == \
        {"team-a/a": None, "team-b/b": None}


def test_a_fractional_share_is_never_given_a_device_wide_figure_even_where_the_exporter_shows_it_alone() -> None:
    """Without KUBERNETES_VIRTUAL_GPUS, dcgm-exporter labels a time-sliced GPU with one of its pods: the webhook's
    record says the pod holds a fraction, so the figure is the device's, not its own."""
    known = pods(record("team-a", "half", share=0.5), record("team-a", "claimed", share=None))
    body = answer(row(GR, "half", "70"), row(GR, "claimed", "70", gpu="GPU-2"))
    assert readings(body, known) == {"team-a/half": None, "team-a/claimed": None}


def test_a_pod_on_several_gpus_reads_its_busiest_and_unknown_if_any_is_unknown() -> None:
    known = pods(record("team-a", "multi", share=2))
    assert readings(answer(row(GR, "multi", "10", gpu="GPU-1"), row(GR, "multi", "60", gpu="GPU-2")), known) == \
        {"team-a/multi": 60.0}
    shared = answer(
        row(GR, "multi", "10", gpu="GPU-1"), row(GR, "multi", "60", gpu="GPU-2"), row(GR, "x", "60", gpu="GPU-2")
    )
    assert readings(shared, known) == {"team-a/multi": None}


def test_series_of_pods_not_governed_not_running_or_by_a_stale_name_are_dropped_or_unknown() -> None:
    known = pods(
        record("team-a", "done", running=False),
        record("team-a", "new", started_at=NOW - dt.timedelta(seconds=30)),
        record("team-a", "by-uid", started_at=NOW - dt.timedelta(seconds=30), uid="u-new"),
    )
    body = answer(row(GR, "done", "50", gpu="GPU-1"), row(GR, "gone", "50", gpu="GPU-2"),
                  row(GR, "new", "50", gpu="GPU-3"),  # younger than the window: the name may be a predecessor's
                  row(GR, "by-uid", "50", gpu="GPU-4", pod_uid="u-new"),  # its UID says it is this pod
                  row(GR, "by-uid", "50", gpu="GPU-5", pod_uid="u-old"))  # a predecessor of that name: not governed
    assert readings(body, known) == {"team-a/new": None, "team-a/by-uid": 50.0}


def test_no_series_is_no_reading_and_nan_infinite_or_negative_values_are_unknown_not_zero() -> None:
    known = pods(record("team-a", "a"), record("team-a", "b"), record("team-a", "c"), record("team-a", "quiet"))
    body = answer(
        row(GR, "a", "NaN", gpu="GPU-1"), row(UTIL, "b", "+Inf", gpu="GPU-2"), row(UTIL, "c", "-1", gpu="GPU-3")
    )
    assert readings(body, known) == {"team-a/a": None, "team-a/b": None, "team-a/c": None}
    # summed processes: capped
    assert readings(answer(row(UTIL, "a", "250", gpu="GPU-1")), known) == {"team-a/a": 100.0}


def test_series_missing_labels_are_skipped_or_unknown() -> None:
    known = pods(record("team-a", "a"), record("default", "nameless-ns"))
    body = answer(row(GR, "", "50", gpu="GPU-1"),  # no pod: the device's own series
                  row(GR, "a", "50", gpu="", Hostname=""),  # no device to judge sharing by
                  row(GR, "nameless-ns", "50", gpu="GPU-3", namespace=""),
                  {"metric": {METRIC_LABEL: "DCGM_FI_DEV_POWER_USAGE", "exported_pod": "a"}, "value": [0, "1"]})
    assert readings(body, known) == {"team-a/a": None}


@pytest.mark.parametrize(
    ("body", "message"),
    # each body made when its test runs: the largest are tens of MiB, too much to hold from collection on
    [
        (lambda: b"<html>", "not JSON"),
        (
            lambda: json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}).encode(),
            "parse error at char 3",
        ),
        (
            lambda: json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}).encode(),
            "not an instant vector",
        ),
        (lambda: answer({"metric": {}, "value": "1"}), "not {metric, value}"),
        (lambda: answer(row(GR, "a", "lots")), "'lots' is not a number"),
        (lambda: answer(row(GR, "a", "1" * 100)), "is not [time, \"number\"]"),
        (
            lambda: answer(row(GR, "a", "1", extra="x" * 2000)),
            "more than 64 labels, or a label that is not a short string",
        ),
        (lambda: answer(*[row(GR, f"p{i}", "1") for i in range(MAX_SERIES + 1)]), f"more than {MAX_SERIES}"),
        (lambda: b" " * (33 * 1024 * 1024), "larger than 32 MiB"),
    ],
)
def test_an_answer_it_cannot_read_is_refused_whole_with_what_is_wrong(
    body: Callable[[], bytes], message: str
) -> None:
    with pytest.raises(AnswerError, match=None) as refused:
        read_answer(body(), QUERY)
    assert message in str(refused.value)


def test_the_query_names_the_configured_labels_and_metrics_and_the_window() -> None:
    query = DcgmQuery(namespace_label="namespace", pod_label="pod", pod_uid_label="", metrics=("DCGM_FI_DEV_GPU_UTIL",),
                      window_seconds=300, selector='job="dcgm", kubernetes_namespace=~"gpu-.*"')
    text = utilisation_query(query)
    assert text == ('max by (Hostname, UUID, gpu, GPU_I_ID, namespace, pod, gpusharing_metric) (label_replace(1 * '
                    'avg_over_time(DCGM_FI_DEV_GPU_UTIL{job="dcgm", kubernetes_namespace=~"gpu-.*", pod!=""}[300s]), '
                    '"gpusharing_metric", "DCGM_FI_DEV_GPU_UTIL", "", ""))')
    # By default only the GPU Operator's exporter's series: a tenant's own exporter cannot speak for other pods.
    assert utilisation_query(DcgmQuery()).count('{namespace="gpu-operator", exported_pod!=""}') == 2
    assert utilisation_query(SPLIT).count(" or ") == 1  # the split metric is one of the preferred: read once


# promtool runs the query, as the recording rule RECORD, on input series (tests/timekeeper/dcgm_rules_test.yaml).
def test_promtool_runs_the_query_on_dcgm_series_as_a_recording_rule(tmp_path: Path) -> None:
    promtool = beside_python("promtool")
    rules = {"groups": [{"name": "gpusharing-dcgm", "rules": [{"record": RECORD, "expr": utilisation_query(SPLIT)}]}]}
    (tmp_path / "dcgm_rules.yaml").write_text(yaml.safe_dump(rules))
    shutil.copy(Path(__file__).parent / "dcgm_rules_test.yaml", tmp_path)
    done = subprocess.run(
        [promtool, "test", "rules", "dcgm_rules_test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_readings_are_plain_pod_utilisation() -> None:
    series = [Series(GR, ("GPU-1", ""), "team-a", "a", None, 12.5)]
    assert pod_readings(series, pods(record("team-a", "a", uid="u")), QUERY, NOW) == [
        PodUtilisation("u", "team-a", "a", 12.5)
    ]


def test_the_query_operations_shows_is_the_one_the_controller_asks_with_the_defaults() -> None:
    operations = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    shown = operations.split("```promql\n", 1)[1].split("```", 1)[0]
    assert "".join(shown.split()) == "".join(utilisation_query(DcgmQuery()).split())
