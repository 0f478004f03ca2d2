"""What each GPU of the node did over the interval, read through NVML: per device (or MIG instance), by its UUID, the
SM utilisation of each process since the last reading (a cursor per device: the last sample's timestamp), the
device's own where the driver does not sample per process, a MIG instance's through GPM, and the device memory each
process holds. Plain data out; which pod a process belongs to is `nodeagent.pods`' business."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from gpusharing.nvml import Sampler, text
from gpusharing.report import MAX_GPU_MODEL
from gpusharing.settings.env import load_code
from nodeagent.config import NVML

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceWindow:
    """One device or MIG instance over the interval."""

    uuid: str  # GPU-… or MIG-…, as the device plugins name devices to the kubelet
    # Each process's SM utilisation (percent of the device), summed nowhere yet; a process absent ran nothing.
    # None: the driver does not sample per process (and for a MIG instance, which the driver does not sample so).
    busy_by_pid: dict[int, float] | None
    # The device's (or MIG instance's) own utilisation, read only where per-process samples are missing; None: unknown.
    device_busy: float | None
    processes: tuple[tuple[int, int | None], ...]  # (pid, bytes of device memory; None: the driver will not say)
    model: str | None = None  # NVML's name of the GPU (a MIG instance's: its GPU's); None: the driver will not say


class Gpus:
    """Every device of the node, read once per interval; `nvml` is the pynvml module, initialised."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._sampler = Sampler(nvml)
        self._failing: set[int] = set()  # the devices whose failure was logged, until they read again

    def read(self) -> dict[str, DeviceWindow]:
        """The node's devices by UUID; NVMLError when the driver cannot even count them. A device that fails alone is
        left out (its pods' readings unknown), logged once until it reads again."""
        nvml = self.nvml
        windows: dict[str, DeviceWindow] = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                device = nvml.nvmlDeviceGetHandleByIndex(index)
                for key, handle, mig in self._sampler.instances(index, device):
                    window = self._window(key, device, handle, mig)
                    windows[window.uuid] = window
            except nvml.NVMLError as exc:
                if index not in self._failing:
                    log.warning(
                        "cannot read GPU %d through NVML (%s): the pods on it are reported as unknown", index, exc
                    )
                    self._failing.add(index)
                continue
            self._failing.discard(index)
        return windows

    def _window(self, key: tuple[int, int], device: Any, handle: Any, mig: bool) -> DeviceWindow:
        nvml = self.nvml
        uuid = text(nvml.nvmlDeviceGetUUID(handle))
        processes = tuple((p.pid, p.usedGpuMemory) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        model = self._model(device)
        if mig:
            return DeviceWindow(uuid, None, _percent(self._sampler.gpm_busy(key, device, handle)), processes, model)
        by_pid = self._sampler.process_busy(key, handle)
        device_busy = _percent(self._sampler.device_busy(key, handle)) if by_pid is None else None
        return DeviceWindow(uuid, by_pid, device_busy, processes, model)

    def _model(self, device: Any) -> str | None:
        """The GPU's model as NVML names it: evidence of what its pods got, beside the node's label they are billed
        by."""
        try:
            return text(self.nvml.nvmlDeviceGetName(device))[:MAX_GPU_MODEL] or None
        except self.nvml.NVMLError:
            return None


def _percent(value: float | None) -> float | None:
    """A percent the driver computed (GPM's is a float): within 0-100, and unknown when it is no number at all."""
    return None if value is None or not math.isfinite(value) else min(100.0, max(0.0, value))


class NvmlUnavailable(Exception):
    """No NVML: the library, the driver or a GPU is missing."""


def open_nvml() -> Any:
    """The pynvml module, initialised with a GPU in sight; NvmlUnavailable otherwise."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            raise NvmlUnavailable("the driver sees no GPU")
    except NvmlUnavailable:
        raise
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise NvmlUnavailable(f"{type(exc).__name__}: {exc}") from None
    return pynvml


def load_nvml(path: str) -> Any:
    """The NVML module that `module:function` (GPUSHARING_NODE_AGENT_NVML) opens."""
    return load_code(NVML, path)()
