"""The one seam between the meter and the GPU: NVML through nvidia-ml-py (whose module is named `pynvml`).

The meter asks a GpuReader for a reading before each report. `open_reader` gives the NVML one, or None
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
    utilization_percent: float  # busiest device this pod's processes run on; 0 when none runs
    model: str | None = None  # NVIDIA's name of the first device this pod's processes run on; None when none runs


class GpuReader(Protocol):
    def read(self) -> GpuReading | None: ...


class NvmlReader:
    """Attributes GPU processes to the pod by their cgroup, which names the pod uid under both cgroup drivers."""

    def __init__(self, nvml: Any, pod_uid: str, proc: Path = Path("/proc")) -> None:  # nvml: the pynvml module
        self._nvml = nvml
        self._proc = proc
        self._markers = (f"pod{pod_uid}", f"pod{pod_uid.replace('-', '_')}")
        self._last_error: str | None = None

    def read(self) -> GpuReading | None:
        nvml = self._nvml
        memory_bytes = 0
        utilizations: list[float] = []
        models: list[str] = []
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                device = nvml.nvmlDeviceGetHandleByIndex(index)
                ours = [p for p in nvml.nvmlDeviceGetComputeRunningProcesses(device) if self._in_pod(p.pid)]
                if ours:
                    memory_bytes += sum(p.usedGpuMemory or 0 for p in ours)  # None: the driver will not say
                    utilizations.append(float(nvml.nvmlDeviceGetUtilizationRates(device).gpu))
                    models.append(_text(nvml.nvmlDeviceGetName(device)))
        except nvml.NVMLError as exc:
            if str(exc) != self._last_error:  # one line per kind of failure, not one per report
                log.warning("cannot read the GPU through NVML (%s): this report carries no GPU figures", exc)
                self._last_error = str(exc)
            return None
        self._last_error = None
        return GpuReading(memory_bytes / MIB, max(utilizations, default=0.0), models[0] if models else None)

    def _in_pod(self, pid: int) -> bool:
        try:
            cgroups = (self._proc / str(pid) / "cgroup").read_text()
        except OSError:  # gone, or in a PID namespace the meter cannot see
            return False
        return any(marker in cgroups for marker in self._markers)


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
