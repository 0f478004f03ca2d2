"""The NVML seam: GPU figures for this pod's processes when a GPU is visible, none (and no crash) without one."""

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpusharing.settings.env import ConfigError
from sidecar.nvml import MIB, GpuReading, NvmlReader, load_reader, open_reader
from tests.sidecar import fake_gpu

UID = "0b8a3c1e-2f4d-4c55-9d0e-6a7b8c9d0e1f"


class FakeNvml:
    """The part of the pynvml module NvmlReader calls: two devices, each with processes (pid, bytes)."""

    class NVMLError(Exception):
        pass

    def __init__(self, devices: list[tuple[list[tuple[int, int | None]], int]]) -> None:
        self.devices = devices
        self.failure: str | None = None

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        if self.failure:
            raise self.NVMLError(self.failure)
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, device: int) -> list[SimpleNamespace]:  # noqa: N802
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.devices[device][0]]

    def nvmlDeviceGetUtilizationRates(self, device: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=self.devices[device][1], memory=0)

    def nvmlDeviceGetName(self, device: int) -> str | bytes:  # noqa: N802
        return ("NVIDIA H100 80GB HBM3", b"Tesla T4", "NVIDIA A10")[device]


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """A /proc where pids 10 and 11 are this pod's (systemd and cgroupfs drivers) and 20 is another pod's."""
    cgroups = {
        10: f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-a.scope\n",
        11: f"12:memory:/kubepods/besteffort/pod{UID}/c0ffee\n",
        20: "0::/kubepods.slice/kubepods-podffffffff_0000_0000_0000_000000000000.slice/cri-containerd-b.scope\n",
    }
    for pid, text in cgroups.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    return tmp_path


def test_counts_only_this_pods_processes(proc: Path) -> None:
    nvml = FakeNvml([([(10, 2048 * MIB), (20, 4096 * MIB)], 35), ([(11, 1024 * MIB), (99, 8192 * MIB)], 90), ([(20, MIB)], 100)])
    reading = NvmlReader(nvml, UID, proc).read()
    assert reading == GpuReading(memory_used_mib=3072.0, utilization_percent=90.0, model="NVIDIA H100 80GB HBM3")


def test_a_pod_without_gpu_processes_uses_nothing(proc: Path) -> None:
    nvml = FakeNvml([([(20, 4096 * MIB)], 100)])
    assert NvmlReader(nvml, UID, proc).read() == GpuReading(memory_used_mib=0.0, utilization_percent=0.0)


def test_memory_the_driver_does_not_disclose_counts_as_none(proc: Path) -> None:
    nvml = FakeNvml([([(10, None), (11, 512 * MIB)], 10)])
    assert NvmlReader(nvml, UID, proc).read() == GpuReading(memory_used_mib=512.0, utilization_percent=10.0, model="NVIDIA H100 80GB HBM3")


def test_the_model_is_the_first_device_the_pod_runs_on_as_nvml_names_it(proc: Path) -> None:
    nvml = FakeNvml([([(20, MIB)], 100), ([(11, MIB)], 40), ([(10, MIB)], 60)])
    assert NvmlReader(nvml, UID, proc).read() == GpuReading(memory_used_mib=2.0, utilization_percent=60.0, model="Tesla T4")


def test_an_nvml_failure_gives_no_reading_and_one_log_line(proc: Path, caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([([(10, MIB)], 50)])
    reader = NvmlReader(nvml, UID, proc)
    nvml.failure = "GPU is lost"
    with caplog.at_level(logging.WARNING):
        assert [reader.read(), reader.read(), reader.read()] == [None, None, None]
    assert caplog.text.count("GPU is lost") == 1
    nvml.failure = None
    assert reader.read() == GpuReading(memory_used_mib=1.0, utilization_percent=50.0, model="NVIDIA H100 80GB HBM3")


@pytest.mark.skipif(fake_gpu.nvidia_driver_present(), reason="an NVIDIA driver is present: see test_with_a_driver")
def test_without_a_driver_there_is_no_reader_and_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        assert open_reader(UID) is None
    assert len(caplog.records) == 1
    assert "no GPU visible to the meter" in caplog.text


@pytest.mark.skipif(not fake_gpu.nvidia_driver_present(), reason="no NVIDIA driver on this machine: see test_without_a_driver")
def test_with_a_driver_the_reader_reads() -> None:
    reader = open_reader(UID)
    assert reader is not None
    reading = reader.read()
    assert reading is not None and reading.memory_used_mib >= 0


def test_the_reader_is_chosen_by_module_and_function() -> None:
    reader = load_reader("tests.sidecar.fake_gpu:open_reader", UID)
    assert isinstance(reader, fake_gpu.FakeGpu)
    assert reader.read() == GpuReading(fake_gpu.MEMORY_USED_MIB, fake_gpu.UTILIZATION_PERCENT, fake_gpu.MODEL)


@pytest.mark.parametrize("path", ["tests.sidecar.no_such_module:open_reader", "tests.sidecar.fake_gpu:no_such_function"])
def test_a_reader_that_cannot_be_loaded_stops_the_meter_at_start(path: str) -> None:
    with pytest.raises(ConfigError, match=f"GPUSHARING_METER_GPU_READER='{path}' cannot be loaded"):
        load_reader(path, UID)
