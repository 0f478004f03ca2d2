"""NVML's samples as both GPU readers take them, the meter (inside a pod, its own processes) and the node agent (on
the node, every pod's), and which pod a process belongs to, from its cgroup. One `Sampler` per process keeps a cursor
per device or MIG instance, so that each reading sees only the samples taken since the last one.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MIB = 1024 * 1024

InstanceKey = tuple[int, int]  # (device index, MIG slot; -1 for the device itself)

_POD_IN_CGROUP = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?(?:/|$)"
)


def pod_uid_in_cgroup(cgroups: str) -> str | None:
    """The pod uid a /proc/<pid>/cgroup text names (the first line that names one), else None.

    The kubelet names the pod uid in the path under both cgroup drivers (systemd:
    `kubepods-burstable-pod<uid with underscores>.slice`; cgroupfs: `/kubepods/burstable/pod<uid>/`), under cgroup v1
    and v2 alike, and seen from another cgroup namespace the path keeps that part (`/../../kubepods…`).
    """
    for line in cgroups.splitlines():
        match = _POD_IN_CGROUP.search(line.rpartition(":")[2])
        if match:
            return match.group(1).replace("_", "-")
    return None


def cgroup_of(proc: Path, pid: str) -> str | None:
    """/proc/<pid>/cgroup's text under `proc`, None when the process is gone or out of sight."""
    try:
        return (proc / pid / "cgroup").read_text()
    except OSError:
        return None


class Sampler:
    """Reads, per device or MIG instance, what happened since the last reading of it. `nvml` is the pynvml module
    (nvidia-ml-py), or a fake of it."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._seen: dict[InstanceKey, int] = {}  # per device or MIG instance: its last sample's timestamp (µs)
        self._gpm: dict[InstanceKey, Any] = {}  # per MIG instance: its last GPM sample
        self._gpm_missing = False  # said once

    def instances(self, index: int, device: Any) -> list[tuple[InstanceKey, Any, bool]]:
        """The device, or its MIG instances when MIG is enabled: (key, handle, is a MIG instance)."""
        nvml = self.nvml
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

    def process_busy(self, key: InstanceKey, handle: Any) -> dict[int, float] | None:
        """Each process's SM utilisation (percent of the device) since the last reading, the mean of its samples; a
        process the driver took no sample of ran nothing (the driver samples only processes that ran). None: the
        driver does not sample per process."""
        nvml = self.nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, self._seen.get(key, 0))
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_NOT_FOUND:  # no sample in the window: no process ran
                return {}
            if exc.value != nvml.NVML_ERROR_NOT_SUPPORTED:
                raise
            return None
        self._seen[key] = max((s.timeStamp for s in samples), default=self._seen.get(key, 0))
        by_pid: dict[int, list[int]] = {}
        for sample in samples:
            by_pid.setdefault(sample.pid, []).append(sample.smUtil)
        return {pid: sum(values) / len(values) for pid, values in by_pid.items()}

    def device_busy(self, key: InstanceKey, handle: Any) -> float | None:
        """The device's utilisation: its samples' mean since the last reading, else its last sample alone (None: the
        driver gives neither, as for a vGPU or an older driver)."""
        nvml = self.nvml
        try:
            _, samples = nvml.nvmlDeviceGetSamples(handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, self._seen.get(key, 0))
        except nvml.NVMLError as exc:
            if exc.value not in (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_NOT_SUPPORTED):
                raise
            samples = []
        if samples:
            self._seen[key] = max(s.timeStamp for s in samples)
            return float(sum(s.sampleValue.uiVal for s in samples) / len(samples))
        try:
            return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml.NVMLError as exc:
            if exc.value != nvml.NVML_ERROR_NOT_SUPPORTED:
                raise
            return None

    def gpm_busy(self, key: InstanceKey, device: Any, handle: Any) -> float | None:
        """A MIG instance's SM utilisation between this reading's GPM sample and the last (None: the first, or a
        driver or GPU without GPM, before Hopper)."""
        nvml = self.nvml
        try:
            sample = nvml.nvmlGpmMigSampleGet(
                device, nvml.nvmlDeviceGetGpuInstanceId(handle), nvml.nvmlGpmSampleAlloc()
            )
        except (nvml.NVMLError, AttributeError) as exc:  # AttributeError: bindings older than GPM
            if not self._gpm_missing:
                log.warning(
                    "cannot read the utilisation of a MIG instance (%s): its readings carry no utilisation, and "
                    "its pod is never taken as idle",
                    exc,
                )
                self._gpm_missing = True
            return None
        previous, self._gpm[key] = self._gpm.get(key), sample
        if previous is None:
            return None
        metrics = nvml.c_nvmlGpmMetricsGet_t()
        metrics.version, metrics.numMetrics, metrics.sample1, metrics.sample2 = (
            nvml.NVML_GPM_METRICS_GET_VERSION,
            1,
            previous,
            sample,
        )
        metrics.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        try:
            nvml.nvmlGpmMetricsGet(metrics)
        finally:
            nvml.nvmlGpmSampleFree(previous)
        return float(metrics.metrics[0].value)


def text(name: str | bytes) -> str:
    """A name NVML gives: bytes from nvidia-ml-py before 11.515."""
    return name.decode(errors="replace") if isinstance(name, bytes) else name
