"""The report contract between the meter and the timekeeper (``POST /api/v1/reports``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpusharing.names import NAMESPACE, POD_NAME, UID
from gpusharing.units.share import MAX_GPU_SHARE

# Nothing a pod does can be worth more than this many GPU-seconds in one report: 1,000 GPUs for ten years.
MAX_GPU_SECONDS = 1000 * 10 * 365 * 24 * 3600
MAX_SEQ = 2**62
MAX_GPU_MEMORY_MIB = 10**9
MAX_GPU_MODEL = 96  # NVIDIA's model names are a few dozen characters


class ReportError(ValueError):
    """A report that must be refused; the message says why."""


@dataclass(frozen=True)
class MeterReport:
    """One meter report: the pod's cumulative billed GPU-seconds under a rising sequence number, and what NVML read."""

    pod_uid: str
    namespace: str
    pod: str
    gpu_share: float
    seq: int
    gpu_seconds: float  # cumulative billed GPU-seconds since the pod's workload started
    final: bool = False
    gpu_memory_used_mib: float | None = None  # NVML, when a GPU is visible to the meter
    gpu_utilization_percent: float | None = None
    gpu_memory_requested_mib: float | None = None  # what the webhook recorded the pod asked for
    gpu_model: str | None = None  # NVML's name of the device; the timekeeper bills by it when its catalogue has it

    _FIELDS = {
        "podUid": "pod_uid",
        "namespace": "namespace",
        "pod": "pod",
        "gpuShare": "gpu_share",
        "seq": "seq",
        "gpuSeconds": "gpu_seconds",
        "final": "final",
        "gpuMemoryUsedMiB": "gpu_memory_used_mib",
        "gpuUtilizationPercent": "gpu_utilization_percent",
        "gpuMemoryRequestedMiB": "gpu_memory_requested_mib",
        "gpuModel": "gpu_model",
    }
    _OPTIONAL = frozenset({"final", "gpuMemoryUsedMiB", "gpuUtilizationPercent", "gpuMemoryRequestedMiB", "gpuModel"})

    def to_json(self) -> dict[str, Any]:
        body = {key: getattr(self, attr) for key, attr in self._FIELDS.items()}
        return {key: value for key, value in body.items() if value is not None}

    @classmethod
    def from_json(cls, body: object) -> "MeterReport":
        """A report from its JSON body; raises ReportError (InvalidName for a name) naming the first thing wrong with
        it."""
        if not isinstance(body, dict):
            raise ReportError("the report must be a JSON object")
        unknown = sorted(set(body) - set(cls._FIELDS))
        if unknown:
            raise ReportError(f"unknown field(s): {', '.join(unknown)}")
        missing = [key for key in cls._FIELDS if key not in cls._OPTIONAL and key not in body]
        if missing:
            raise ReportError(f"missing field(s): {', '.join(missing)}")
        return cls(
            pod_uid=UID.check(text_field(body, "podUid"), "podUid"),
            namespace=NAMESPACE.check(text_field(body, "namespace"), "namespace"),
            pod=POD_NAME.check(text_field(body, "pod"), "pod"),
            gpu_share=number_field(body, "gpuShare", 0, MAX_GPU_SHARE),
            seq=_integer(body, "seq", 0, MAX_SEQ),
            gpu_seconds=number_field(body, "gpuSeconds", 0, MAX_GPU_SECONDS),
            final=_flag(body, "final"),
            gpu_memory_used_mib=optional_number_field(body, "gpuMemoryUsedMiB", 0, MAX_GPU_MEMORY_MIB),
            gpu_utilization_percent=optional_number_field(body, "gpuUtilizationPercent", 0, 100),
            gpu_memory_requested_mib=optional_number_field(body, "gpuMemoryRequestedMiB", 0, MAX_GPU_MEMORY_MIB),
            gpu_model=gpu_model_field(body.get("gpuModel")),
        )


def text_field(body: dict[str, Any], key: str) -> str:
    value = body[key]
    if not isinstance(value, str) or not value:
        raise ReportError(f"{key} must be a non-empty string")
    return value


def number_field(body: dict[str, Any], key: str, low: float, high: float) -> float:
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReportError(f"{key} must be a number")
    if not low <= value <= high:  # false for NaN too
        raise ReportError(f"{key} must be a finite number from {low} to {high:g}, not {value}")
    return float(value)


def optional_number_field(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    return None if body.get(key) is None else number_field(body, key, low, high)


def _integer(body: dict[str, Any], key: str, low: int, high: int) -> int:
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ReportError(f"{key} must be a whole number from {low} to {high}")
    return value


def gpu_model_field(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_GPU_MODEL or not value.isprintable():
        raise ReportError(
            f"gpuModel must be the GPU's name as NVML gives it: printable, 1 to {MAX_GPU_MODEL} characters"
        )
    return value


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise ReportError(f"{key} must be true or false")
    return value
