"""A fake of the part of pynvml the meter's NvmlReader calls, playing a utilisation trace: each reading of the GPU is
one interval, and the pod's processes kept each device as busy as its trace says for that interval (the trace's last
value holds after its end). MIG instances, GPM, per-process and per-device sampling, and the errors drivers raise
where they lack one, are each faked the way NVML answers.

`open_reader` (GPUSHARING_METER_GPU_READER=tests.sidecar.fake_nvml:open_reader) puts a real NvmlReader over it for a
meter process, on a /proc made for the pod, with the trace of GPUSHARING_FAKE_NVML_TRACE (JSON: a list of percents,
`null` for a driver that cannot say).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from sidecar.nvml import MIB, NvmlReader
from tests.gpusharing.fake_nvml import FakeMigDriver, NVMLError

TRACE_ENV = "GPUSHARING_FAKE_NVML_TRACE"
POD_PID, OTHER_PID = 10, 20


@dataclass
class FakeDevice:
    name: str
    processes: list[tuple[int, int | None]]  # (pid, bytes of device memory, None: the driver will not say)
    trace: list[float | None] = field(default_factory=lambda: [0.0])  # processes[0]'s utilisation per interval
    others: float = 0.0  # the utilisation of the other processes on it (another pod's, on a shared GPU)
    per_process: bool = True  # the driver samples utilisation per process
    device_samples: bool = True  # ... and per device
    mig: list["FakeDevice"] | None = None  # MIG instances: MIG mode enabled
    gpm: bool = True  # GPM (Hopper and later): MIG instances' utilisation

    def busy(self, reading: int) -> float | None:
        return self.trace[min(reading, len(self.trace) - 1)]


class FakeNvml(FakeMigDriver):
    def __init__(self, devices: list[FakeDevice]) -> None:
        super().__init__()
        self.devices = devices
        self.reading = -1  # advanced by each reading of the GPU (nvmlDeviceGetCount begins one)
        self.failure: str | None = None

    def _timestamp(self) -> int:
        return (self.reading + 1) * 1_000_000  # µs, as NVML's samples carry them

    def _traced(self, device: FakeDevice) -> float:
        busy = device.busy(self.reading)
        if busy is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        return busy

    def nvmlDeviceGetCount(self) -> int:
        if self.failure:
            raise NVMLError(999, self.failure)
        self.reading += 1
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        return self.devices[index]

    def nvmlDeviceGetName(self, device: FakeDevice) -> str | bytes:
        # bytes, as bindings before 11.515 gave
        return device.name.encode() if device.name == "Tesla T4" else device.name

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDevice) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.processes]

    def nvmlDeviceGetProcessUtilization(self, handle: FakeDevice, last_seen: int) -> list[SimpleNamespace]:
        if not handle.per_process:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        busy = [(pid, self._traced(handle) if i == 0 else handle.others) for i, (pid, _) in enumerate(handle.processes)]
        samples = [
            SimpleNamespace(pid=pid, timeStamp=self._timestamp(), smUtil=round(util)) for pid, util in busy if util > 0
        ]
        if self._timestamp() <= last_seen or not samples:  # NVML samples only the processes that ran
            raise NVMLError(self.NVML_ERROR_NOT_FOUND, "Not Found")
        return samples

    def nvmlDeviceGetSamples(self, handle: FakeDevice, kind: int, last_seen: int) -> tuple[int, list[SimpleNamespace]]:
        assert kind == self.NVML_GPU_UTILIZATION_SAMPLES
        if not handle.device_samples:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED, "Not Supported")
        if self._timestamp() <= last_seen:
            raise NVMLError(self.NVML_ERROR_NOT_FOUND, "Not Found")
        value = round(min(100.0, self._traced(handle) + handle.others))
        # Two samples in the interval: the busier second half and the idler first, whose mean is the interval's.
        first, second = value // 2, value - value // 2
        return kind, [
            SimpleNamespace(timeStamp=self._timestamp() - 500_000, sampleValue=SimpleNamespace(uiVal=2 * first)),
            SimpleNamespace(timeStamp=self._timestamp(), sampleValue=SimpleNamespace(uiVal=2 * second)),
        ]

    def nvmlDeviceGetUtilizationRates(self, handle: FakeDevice) -> SimpleNamespace:
        return SimpleNamespace(gpu=round(min(100.0, self._traced(handle) + handle.others)), memory=0)

    def instance_busy(self, instance: FakeDevice) -> float | None:
        return instance.busy(self.reading)  # what its GPM sample carries: its trace's value for this reading


def pod_proc(directory: Path, pod_uid: str, host_view: bool = True) -> Path:
    """A /proc as a meter sees it: pids 10 and 11 are the pod's (systemd and cgroupfs drivers), 20 another pod's;
    `host_view`: the meter in the host's PID namespace with the host's cgroup view, else in the pod's own."""
    slice_uid = pod_uid.replace("-", "_")
    cgroups = {
        "10": f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice/"
        "cri-containerd-a.scope\n",
        "11": f"12:memory:/kubepods/besteffort/pod{pod_uid}/c0ffee\n",
        "20": "0::/kubepods.slice/kubepods-podffffffff_0000_0000_0000_000000000000.slice/cri-containerd-b.scope\n",
        "self": f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice/"
        "cri-containerd-m.scope\n"
        if host_view
        else "0::/\n",
        "1": "0::/init.scope\n"
        if host_view
        else f"0::/kubepods.slice/kubepods-pod{pod_uid.replace('-', '_')}.slice/pause.scope\n",
    }
    for pid, text in cgroups.items():
        (directory / pid).mkdir(parents=True, exist_ok=True)
        (directory / pid / "cgroup").write_text(text)
    return directory


def open_reader(pod_uid: str) -> NvmlReader:
    """A real NvmlReader over one faked H100 that plays GPUSHARING_FAKE_NVML_TRACE for this pod's process."""
    trace = json.loads(os.environ.get(TRACE_ENV, "[0]"))
    proc = pod_proc(Path(tempfile.mkdtemp(prefix="fake-proc-")), pod_uid)
    device = FakeDevice("NVIDIA H100 80GB HBM3", [(POD_PID, 1024 * MIB)], trace)
    return NvmlReader(FakeNvml([device]), pod_uid, proc)
