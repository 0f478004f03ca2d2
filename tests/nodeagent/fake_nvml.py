"""A fake of the part of pynvml the node agent calls, playing per-process traces on a clock: each GPU holds the samples
its driver would have taken (time, pid, SM utilisation), given explicitly or made every `period` seconds from each
process's steady `busy` percent, and answers nvmlDeviceGetProcessUtilization with those after the caller's cursor and
up to now, Not Found when there are none, as NVML does. MIG instances answer through GPM; a driver without
per-process samples, without GPM, or failing, is faked the way NVML answers.

`open_nvml` (GPUSHARING_NODE_AGENT_NVML=tests.nodeagent.fake_nvml:open_nvml) plays the trace in the JSON file named
by GPUSHARING_FAKE_NODE_TRACE (`{"gpus": [{"uuid": …, "name": NVML's, "processes": {"pid": bytes}, "busy": {"pid":
percent}}]}`;
`"perProcess": false, "utilisation": null` for a GPU whose driver gives neither per-process samples nor its own) on
the process's monotonic clock, read again when the file changes, for an agent process or the cluster tier's
simulated nodes (tests/cluster/nodeagents.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.gpusharing.fake_nvml import FakeMigDriver, NVMLError

TRACE_ENV = "GPUSHARING_FAKE_NODE_TRACE"
MIB = 1024 * 1024


@dataclass
class FakeGpu:
    uuid: str
    processes: dict[int, int | None] = field(default_factory=dict)  # pid: bytes of device memory (None: not said)
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (seconds, pid, SM %): what the driver sampled
    busy: dict[int, int] = field(default_factory=dict)  # pid: a steady SM %, sampled every `period` seconds
    period: float = 1.0
    per_process: bool = True  # the driver samples per process
    utilisation: float | None = 0.0  # the device's own (nvmlDeviceGetUtilizationRates); None: Not Supported
    mig: list["FakeGpu"] | None = None  # MIG instances: MIG mode enabled
    gpm: bool = True  # GPM (Hopper and later): a MIG instance's utilisation; `utilisation` is its SM activity
    failing: bool = False  # the driver fails on it (a GPU fallen off the bus)
    name: str | None = None  # NVML's name of it; None: the driver will not say


class FakeNvml(FakeMigDriver):
    NVML_ERROR_GPU_IS_LOST = 15

    def __init__(self, gpus: list[FakeGpu], clock: Callable[[], float] | None = None) -> None:
        super().__init__()
        self.gpus = gpus
        self.now = 0.0
        self._clock = clock or (lambda: self.now)  # seconds
        self.failure: str | None = None  # the driver fails on everything
        self.cursors: list[int] = []  # every lastSeenTimeStamp asked with, in order

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def _sampled(self, gpu: FakeGpu, after: float, upto: float) -> list[tuple[float, int, int]]:
        taken = [s for s in gpu.samples if after < s[0] <= upto]
        first = int(after // gpu.period) + 1
        for tick in range(first, int(upto // gpu.period) + 1):
            taken.extend((tick * gpu.period, pid, busy) for pid, busy in gpu.busy.items() if busy > 0)
        return taken

    def _check(self, gpu: FakeGpu) -> None:
        if gpu.failing:
            raise NVMLError(self.NVML_ERROR_GPU_IS_LOST, "GPU is lost")

    def nvmlDeviceGetCount(self) -> int:
        if self.failure:
            raise NVMLError(999, self.failure)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check(self.gpus[index])
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        if handle.name is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        return handle.name

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        self._check(handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.processes.items()]

    def nvmlDeviceGetProcessUtilization(self, handle: FakeGpu, last_seen: int) -> list[SimpleNamespace]:
        self._check(handle)
        if not handle.per_process:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        self.cursors.append(last_seen)
        samples = self._sampled(handle, last_seen / 1e6, self._clock())
        if not samples:
            raise NVMLError(self.NVML_ERROR_NOT_FOUND, "Not Found")
        return [SimpleNamespace(pid=pid, timeStamp=round(at * 1e6), smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
                for at, pid, sm in samples]

    def nvmlDeviceGetSamples(self, handle: FakeGpu, kind: int, last_seen: int) -> tuple[int, list[SimpleNamespace]]:
        raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED, "Not Supported")  # the device's last sample alone, below

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        if handle.utilisation is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        return SimpleNamespace(gpu=round(handle.utilisation), memory=0)

    def instance_busy(self, instance: FakeGpu) -> float | None:
        return instance.utilisation  # a MIG instance's SM activity, as its GPM sample carries it


def gpus_from_trace(trace: dict[str, Any]) -> list[FakeGpu]:
    """The GPUs of a JSON trace (see the module's docstring)."""
    return [FakeGpu(uuid=gpu["uuid"], processes={int(pid): used for pid, used in gpu.get("processes", {}).items()},
                    busy={int(pid): busy for pid, busy in gpu.get("busy", {}).items()}, period=gpu.get("period", 0.1),
                    per_process=gpu.get("perProcess", True), utilisation=gpu.get("utilisation", 0.0),
                    name=gpu.get("name"))
            for gpu in trace["gpus"]]


def write_trace(path: Path, gpus: list[dict[str, Any]]) -> Path:
    """Writes a trace for `open_nvml` at once (a reader never sees half of it): each GPU {"uuid", "processes":
    {pid: bytes}, "busy": {pid: percent}}."""
    partial = path.with_name(path.name + ".new")
    partial.write_text(json.dumps({"gpus": gpus}))
    partial.replace(path)
    return path


class TracedNvml(FakeNvml):
    """A fake driver playing a trace file, read again whenever it changes (a simulated node's pods come and go): each
    reading of the node (nvmlDeviceGetCount begins one) sees the processes and steady percents the file says now."""

    def __init__(self, trace: Path) -> None:
        start = time.monotonic()
        super().__init__([], clock=lambda: time.monotonic() - start)
        self.trace = trace
        self._read: float | None = None

    def nvmlDeviceGetCount(self) -> int:
        modified = self.trace.stat().st_mtime_ns
        if modified != self._read:
            self.gpus, self._read = gpus_from_trace(json.loads(self.trace.read_text())), modified
        return super().nvmlDeviceGetCount()


def open_nvml() -> FakeNvml:
    """The seam's function: the trace of GPUSHARING_FAKE_NODE_TRACE, played from now on the monotonic clock."""
    return TracedNvml(Path(os.environ[TRACE_ENV]))
