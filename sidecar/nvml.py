"""The one seam between the meter and the GPU: NVML through nvidia-ml-py (whose module is named `pynvml`).

The meter asks a GpuReader for a reading before each report: the pod's GPU memory, and how busy its GPUs were over
the interval since the last report (what idle GPU-minutes and idle policies are judged by). `open_reader` gives the NVML one, or None
(after one log line) when no driver or GPU is visible; GPUSHARING_METER_GPU_READER may name another
`module:function` with the same signature, which is how the tests put a fake GPU behind the seam.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpusharing.settings.env import load_code
from sidecar.config import GPU_READER

log = logging.getLogger(__name__)

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuReading:
    memory_used_mib: float  # device memory held by this pod's processes, all devices together
    # The busiest of the pod's devices over the interval since the last reading; 0 when none of its processes runs on
    # a GPU; None when a device's utilisation cannot be read (unknown, never idle).
    utilization_percent: float | None
    model: str | None = None  # NVIDIA's name of the first device this pod's processes run on; None when none runs


class GpuReader(Protocol):
    def read(self) -> GpuReading | None: ...


class NvmlReader:
    """Attributes GPU processes to the pod by their cgroup, which names the pod uid under both cgroup drivers, and
    reads the utilisation of each device they run on over the interval since the last reading: the pod's own
    processes' where the driver samples them per process, the device's otherwise (on a shared GPU, its other tenants'
    work counts too: never idle by mistake), a MIG instance's through GPM where the driver has it.

    NVML names processes by the host's PIDs, so attribution needs the meter to see them: in the host's PID namespace
    (PID 1 not one of this pod's) and with the host's view of cgroups (its own cgroup naming this pod). Elsewhere it
    cannot tell a pod that runs nothing on its GPU from one whose processes it cannot see, and reads nothing.
    """

    def __init__(self, nvml: Any, pod_uid: str, proc: Path = Path("/proc")) -> None:  # nvml: the pynvml module
        self._nvml = nvml
        self._proc = proc
        self._markers = (f"pod{pod_uid}", f"pod{pod_uid.replace('-', '_')}")
        self._last_error: str | None = None
        self._sees_processes: bool | None = None
        self._seen: dict[tuple[int, int], int] = {}  # per device or MIG instance: its last sample's timestamp (µs)
        self._gpm: dict[tuple[int, int], Any] = {}  # per MIG instance: its last GPM sample
        self._gpm_missing = False  # said once

    def read(self) -> GpuReading | None:
        if not self._attributable():
            return None
        nvml = self._nvml
        memory_bytes = 0
        utilizations: list[float | None] = []
        models: list[str] = []
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                device = nvml.nvmlDeviceGetHandleByIndex(index)
                for key, handle, mig in self._instances(index, device):
                    ours = [p for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle) if self._in_pod(p.pid)]
                    if ours:
                        memory_bytes += sum(p.usedGpuMemory or 0 for p in ours)  # None: the driver will not say
                        utilizations.append(self._gpm_busy(key, device, handle) if mig else
                                            self._busy(key, handle, {p.pid for p in ours}))
                        models.append(_text(nvml.nvmlDeviceGetName(device)))
        except nvml.NVMLError as exc:
            if str(exc) != self._last_error:  # one line per kind of failure, not one per report
                log.warning("cannot read the GPU through NVML (%s): this report carries no GPU figures", exc)
                self._last_error = str(exc)
            return None
        self._last_error = None
        known = [u for u in utilizations if u is not None]
        utilization = max(known, default=0.0) if len(known) == len(utilizations) else None
        return GpuReading(memory_bytes / MIB, utilization, models[0] if models else None)

    def _attributable(self) -> bool:
        if self._sees_processes is None:
            own, first = self._cgroup("self"), self._cgroup("1")
            self._sees_processes = own is not None and self._names_pod(own) and first is not None and not self._names_pod(first)
            if not self._sees_processes:
                log.info("the meter cannot see this pod's GPU processes (it needs the host's PID namespace and cgroup "
                         "view): reports carry no GPU memory or utilisation, and the pod is never taken as idle")
        return self._sees_processes

    def _instances(self, index: int, device: Any) -> list[tuple[tuple[int, int], Any, bool]]:
        """The device, or its MIG instances when MIG is enabled: (key, handle, is a MIG instance)."""
        nvml = self._nvml
        try:
            mig = nvml.nvmlDeviceGetMigMode(device)[0] == nvml.NVML_DEVICE_MIG_ENABLE
        except nvml.NVMLError:  # not a MIG-capable GPU
            mig = False
        if not mig:
            return [((index, -1), device, False)]
        instances = []
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(device)):
            try:
                instances.append(((index, slot), nvml.nvmlDeviceGetMigDeviceHandleByIndex(device, slot), True))
            except nvml.NVMLError as exc:
                if exc.value != nvml.NVML_ERROR_NOT_FOUND:  # an empty slot
                    raise
        return instances

    def _busy(self, key: tuple[int, int], handle: Any, pids: set[int]) -> float | None:
        """The percent of the interval the pod's processes kept the device busy (summed over them), else the device's."""
        nvml = self._nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, self._seen.get(key, 0))
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_NOT_FOUND:  # the driver samples only processes that ran: none did
                return 0.0
            if exc.value != nvml.NVML_ERROR_NOT_SUPPORTED:
                raise
            return self._device_busy(key, handle)
        self._seen[key] = max((s.timeStamp for s in samples), default=self._seen.get(key, 0))
        by_pid: dict[int, list[int]] = {}
        for sample in samples:
            if sample.pid in pids:
                by_pid.setdefault(sample.pid, []).append(sample.smUtil)
        return float(min(100.0, sum(sum(values) / len(values) for values in by_pid.values())))

    def _device_busy(self, key: tuple[int, int], handle: Any) -> float | None:
        """The device's utilisation: its samples' mean since the last reading, else its last sample alone (None: the
        driver gives neither, as for a vGPU or an older driver)."""
        nvml = self._nvml
        try:
            _, samples = nvml.nvmlDeviceGetSamples(handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, self._seen.get(key, 0))
        except nvml.NVMLError as exc:
            if exc.value not in (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_NOT_SUPPORTED):
                raise
            samples = []
        if samples:
            self._seen[key] = max(s.timeStamp for s in samples)
            return sum(s.sampleValue.uiVal for s in samples) / len(samples)
        try:
            return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml.NVMLError as exc:
            if exc.value != nvml.NVML_ERROR_NOT_SUPPORTED:
                raise
            return None

    def _gpm_busy(self, key: tuple[int, int], device: Any, handle: Any) -> float | None:
        """A MIG instance's SM utilisation between this reading's GPM sample and the last (None: the first, or a
        driver or GPU without GPM, before Hopper)."""
        nvml = self._nvml
        try:
            sample = nvml.nvmlGpmMigSampleGet(device, nvml.nvmlDeviceGetGpuInstanceId(handle), nvml.nvmlGpmSampleAlloc())
        except (nvml.NVMLError, AttributeError) as exc:  # AttributeError: bindings older than GPM
            if not self._gpm_missing:
                log.warning("cannot read the utilisation of a MIG instance (%s): reports carry no utilisation, and the "
                            "pod is never taken as idle", exc)
                self._gpm_missing = True
            return None
        previous, self._gpm[key] = self._gpm.get(key), sample
        if previous is None:
            return None
        metrics = nvml.c_nvmlGpmMetricsGet_t()
        metrics.version, metrics.numMetrics, metrics.sample1, metrics.sample2 = nvml.NVML_GPM_METRICS_GET_VERSION, 1, previous, sample
        metrics.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        try:
            nvml.nvmlGpmMetricsGet(metrics)
        finally:
            nvml.nvmlGpmSampleFree(previous)
        return float(metrics.metrics[0].value)

    def _cgroup(self, pid: str) -> str | None:
        try:
            return (self._proc / pid / "cgroup").read_text()
        except OSError:  # gone, or in a PID namespace the meter cannot see
            return None

    def _names_pod(self, cgroups: str) -> bool:
        return any(marker in cgroups for marker in self._markers)

    def _in_pod(self, pid: int) -> bool:
        cgroups = self._cgroup(str(pid))
        return cgroups is not None and self._names_pod(cgroups)


def _text(name: str | bytes) -> str:
    return name.decode(errors="replace") if isinstance(name, bytes) else name  # bytes from nvidia-ml-py before 11.515


def open_reader(pod_uid: str) -> GpuReader | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            raise RuntimeError("the driver sees no GPU")
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...: all mean no GPU figures
        log.info("no GPU visible to the meter (%s): reports carry no GPU memory or utilization", exc)
        return None
    return NvmlReader(pynvml, pod_uid)


def load_reader(path: str, pod_uid: str) -> GpuReader | None:
    """The reader that `module:function` (GPUSHARING_METER_GPU_READER) opens for this pod."""
    reader: GpuReader | None = load_code(GPU_READER, path)(pod_uid)
    return reader
