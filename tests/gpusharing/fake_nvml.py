"""What the meter's and the node agent's fake drivers share (tests/sidecar/fake_nvml.py, tests/nodeagent/fake_nvml.py),
as `gpusharing/nvml.py` reads it of pynvml: NVML's errors and constants, MIG instances, and GPM samples of them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    def __init__(self, value: int, text: str = "") -> None:
        super().__init__(text or f"NVML error {value}")
        self.value = value


class FakeMigDriver:
    """A device's `mig` (a list of instances, or None for MIG mode off: Not Supported) with one slot left empty, and
    each instance's `gpm` (False: a driver or GPU without GPM). A GPM sample carries what `instance_busy` says of the
    instance when it is taken; the metric between two samples is the later one's."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NOT_FOUND = 6
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_GPU_UTILIZATION_SAMPLES = 1
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2

    def __init__(self) -> None:
        self.freed: list[Any] = []

    def instance_busy(self, instance: Any) -> float | None:
        raise NotImplementedError

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        if device.mig is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        return [self.NVML_DEVICE_MIG_ENABLE, self.NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        assert device.mig is not None
        return len(device.mig) + 1  # one slot empty

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        assert device.mig is not None
        if index >= len(device.mig):
            raise NVMLError(self.NVML_ERROR_NOT_FOUND, "Not Found")
        return device.mig[index]

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> Any:
        return handle  # stands for the instance's id

    def nvmlGpmSampleAlloc(self) -> SimpleNamespace:
        return SimpleNamespace(instance=None, busy=None)

    def nvmlGpmMigSampleGet(self, device: Any, instance: Any, sample: SimpleNamespace) -> SimpleNamespace:
        if not instance.gpm:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        sample.instance, sample.busy = instance, self.instance_busy(instance)
        return sample

    def c_nvmlGpmMetricsGet_t(self) -> SimpleNamespace:
        return SimpleNamespace(
            version=0, numMetrics=0, sample1=None, sample2=None, metrics=[SimpleNamespace(metricId=0, value=0.0)]
        )

    def nvmlGpmMetricsGet(self, metrics: SimpleNamespace) -> SimpleNamespace:
        assert (
            metrics.version == self.NVML_GPM_METRICS_GET_VERSION
            and metrics.metrics[0].metricId == self.NVML_GPM_METRIC_SM_UTIL
        )
        metrics.metrics[0].value = metrics.sample2.busy  # the instance's SM activity between the two samples
        return metrics

    def nvmlGpmSampleFree(self, sample: SimpleNamespace) -> None:
        self.freed.append(sample)
