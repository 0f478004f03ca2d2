"""MeterReport: the report contract refuses anything that could add budget or is not what it claims to be."""

import math

import pytest

from gpusharing.report import MeterReport, ReportError

VALID = {"podUid": "4f1c", "namespace": "ml", "pod": "train-0", "gpuShare": 0.5, "seq": 3, "gpuSeconds": 90.0}


def test_round_trip() -> None:
    report = MeterReport.from_json(
        {**VALID, "final": True, "gpuMemoryUsedMiB": 1200, "gpuUtilizationPercent": 40, "gpuModel": "Tesla T4"}
    )
    assert report.final and report.gpu_memory_used_mib == 1200 and report.gpu_model == "Tesla T4"
    assert MeterReport.from_json(report.to_json()) == report


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpuSeconds": -1}, "gpuSeconds must be a finite number"),
        ({"gpuSeconds": math.nan}, "gpuSeconds must be a finite number"),
        ({"gpuSeconds": math.inf}, "gpuSeconds must be a finite number"),
        ({"gpuSeconds": 1e30}, "gpuSeconds must be a finite number"),
        ({"gpuSeconds": "90"}, "gpuSeconds must be a number"),
        ({"seq": 1.5}, "seq must be a whole number"),
        ({"seq": True}, "seq must be a whole number"),
        ({"podUid": ""}, "podUid must be a non-empty string"),
        ({"final": "yes"}, "final must be true or false"),
        ({"gpuUtilizationPercent": 120}, "gpuUtilizationPercent must be a finite number"),
        ({"bonusMinutes": 10}, "unknown field(s): bonusMinutes"),
        ({"gpuModel": ""}, "gpuModel must be the GPU's name as NVML gives it"),
        ({"gpuModel": "x" * 97}, "gpuModel must be the GPU's name as NVML gives it"),
        ({"gpuModel": "Tesla\nT4"}, "gpuModel must be the GPU's name as NVML gives it"),
        ({"gpuModel": 4}, "gpuModel must be the GPU's name as NVML gives it"),
    ],
)
def test_refused(change: dict, message: str) -> None:
    with pytest.raises(ReportError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MeterReport.from_json({**VALID, **change})


def test_missing_fields_are_named() -> None:
    with pytest.raises(ReportError, match="missing field\\(s\\): seq, gpuSeconds"):
        MeterReport.from_json({k: v for k, v in VALID.items() if k not in ("seq", "gpuSeconds")})


def test_not_an_object() -> None:
    with pytest.raises(ReportError, match="must be a JSON object"):
        MeterReport.from_json([VALID])
