"""The one seam between the meter and the GPU: NVML through nvidia-ml-py (whose module is named `pynvml`).

The meter asks a GpuReader for a reading before each report: the pod's GPU memory, and how busy its GPUs were over the
interval since the last report (what idle GPU-minutes and idle policies are judged by). `open_reader` gives the NVML
one, or None (after one log line) when no driver or GPU is visible; GPUSHARING_METER_GPU_READER may name another
`module:function` with the same signature, which is how the tests put a fake GPU behind the seam.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpusharing.nvml import MIB, InstanceKey, Sampler, cgroup_of, text
from gpusharing.settings.env import load_code
from sidecar.config import GPU_READER

log = logging.getLogger(__name__)

__all__ = ["MIB", "GpuReader", "GpuReading", "NvmlReader", "load_reader", "open_reader"]


@dataclass(frozen=True)
class GpuReading:
    memory_used_mib: float  # device memory held by this pod's processes, all devices together
    # The busiest of the pod's devices over the interval since the last reading; 0 when none of its processes runs on
    # a GPU; None when a device's utilisation cannot be read (unknown, never idle).
    utilization_percent: float | None
    model: str | None = None  # NVIDIA's name of the first device this pod's processes run on; None when none runs


class GpuReader(Protocol):
    """What the meter reads of its pod's GPUs before each report (None: nothing it can attribute to the pod)."""

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
        self._sampler = Sampler(nvml)

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
                for key, handle, mig in self._sampler.instances(index, device):
                    ours = [p for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle) if self._in_pod(p.pid)]
                    if ours:
                        memory_bytes += sum(p.usedGpuMemory or 0 for p in ours)  # None: the driver will not say
                        utilizations.append(self._sampler.gpm_busy(key, device, handle) if mig else
                                            self._busy(key, handle, {p.pid for p in ours}))
                        models.append(text(nvml.nvmlDeviceGetName(device)))
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
            self._sees_processes = (
                own is not None and self._names_pod(own) and first is not None and not self._names_pod(first)
            )
            if not self._sees_processes:
                log.info("the meter cannot see this pod's GPU processes (it needs the host's PID namespace and cgroup "
                         "view): reports carry no GPU memory or utilisation, and the pod is never taken as idle")
        return self._sees_processes

    def _busy(self, key: InstanceKey, handle: Any, pids: set[int]) -> float | None:
        """The percent of the interval the pod's processes kept the device busy (summed over them), else the
        device's."""
        by_pid = self._sampler.process_busy(key, handle)
        if by_pid is None:
            return self._sampler.device_busy(key, handle)
        return float(min(100.0, sum(busy for pid, busy in by_pid.items() if pid in pids)))

    def _cgroup(self, pid: str) -> str | None:
        return cgroup_of(self._proc, pid)  # None: gone, or in a PID namespace the meter cannot see

    def _names_pod(self, cgroups: str) -> bool:
        return any(marker in cgroups for marker in self._markers)

    def _in_pod(self, pid: int) -> bool:
        cgroups = self._cgroup(str(pid))
        return cgroups is not None and self._names_pod(cgroups)


def open_reader(pod_uid: str) -> GpuReader | None:
    """The NVML reader of the pod's processes, or None (after one log line) when no driver or GPU is visible."""
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
