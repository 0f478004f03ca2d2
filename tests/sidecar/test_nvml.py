"""The NVML seam: GPU figures for this pod's processes when a GPU is visible, none (and no crash) without one; how
busy the pod's GPUs were over each interval, played by a fake NVML from a trace; unknown, never idle, where the
meter cannot tell."""

import logging
from pathlib import Path

import pytest

from gpusharing.settings.env import ConfigError
from sidecar.nvml import MIB, GpuReading, NvmlReader, load_reader, open_reader
from tests.sidecar import fake_gpu
from tests.sidecar.fake_nvml import FakeDevice, FakeNvml, pod_proc

UID = "0b8a3c1e-2f4d-4c55-9d0e-6a7b8c9d0e1f"


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """A /proc as the meter sees it in the host's PID namespace: pids 10 and 11 are this pod's, 20 another pod's."""
    return pod_proc(tmp_path, UID)


H100, T4, A10 = "NVIDIA H100 80GB HBM3", "Tesla T4", "NVIDIA A10"


def test_counts_only_this_pods_processes(proc: Path) -> None:
    nvml = FakeNvml([FakeDevice(H100, [(10, 2048 * MIB), (20, 4096 * MIB)], [35], others=60),
                     FakeDevice(T4, [(11, 1024 * MIB), (99, 8192 * MIB)], [90]), FakeDevice(A10, [(20, MIB)], [100])])
    reading = NvmlReader(nvml, UID, proc).read()
    assert reading == GpuReading(memory_used_mib=3072.0, utilization_percent=90.0, model=H100)


def test_the_utilisation_is_the_pods_own_over_each_interval_as_the_trace_plays(proc: Path) -> None:
    trace = [0, 0, 35, 0, 100, 0.4]
    nvml = FakeNvml([FakeDevice(H100, [(10, MIB), (20, MIB)], trace, others=80)])  # another pod keeps the GPU busy
    reader = NvmlReader(nvml, UID, proc)
    assert [reader.read().utilization_percent for _ in trace] == [0.0, 0.0, 35.0, 0.0, 100.0, 0.0]


def test_without_per_process_samples_the_device_is_read_and_a_shared_gpus_other_tenants_count(proc: Path) -> None:
    shared = FakeDevice(H100, [(10, MIB), (20, MIB)], [0, 0, 30], others=50, per_process=False)
    reader = NvmlReader(FakeNvml([shared]), UID, proc)
    assert [reader.read().utilization_percent for _ in range(3)] == [50.0, 50.0, 80.0]  # type: ignore[union-attr]
    alone = FakeDevice(T4, [(10, MIB)], [0, 12], per_process=False, device_samples=False)  # the last sample alone
    reader = NvmlReader(FakeNvml([alone]), UID, proc)
    assert [reader.read().utilization_percent for _ in range(2)] == [0.0, 12.0]  # type: ignore[union-attr]


def test_a_device_whose_utilisation_the_driver_cannot_give_is_unknown_never_idle(proc: Path) -> None:
    nvml = FakeNvml([FakeDevice(H100, [(10, 512 * MIB)], [None], per_process=False), FakeDevice(T4, [(11, MIB)], [0])])
    assert NvmlReader(nvml, UID, proc).read() == GpuReading(memory_used_mib=513.0, utilization_percent=None, model=H100)


def test_mig_instances_are_read_through_gpm_from_their_second_reading(proc: Path) -> None:
    ours = FakeDevice("MIG 1g.10gb", [(10, 2 * MIB)], [0, 0, 45])
    theirs = FakeDevice("MIG 3g.40gb", [(20, 8 * MIB)], [100])
    nvml = FakeNvml([FakeDevice(H100, [], mig=[theirs, ours])])
    reader = NvmlReader(nvml, UID, proc)
    readings = [reader.read() for _ in range(3)]
    # one sample: unknown yet
    assert readings[0] == GpuReading(memory_used_mib=2.0, utilization_percent=None, model=H100)
    assert [r.utilization_percent for r in readings[1:]] == [0.0, 45.0]  # type: ignore[union-attr]
    assert len(nvml.freed) == 2  # each sample freed once its successor is read


def test_mig_without_gpm_is_unknown_and_said_once(proc: Path, caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([FakeDevice(H100, [], mig=[FakeDevice("MIG 1g.10gb", [(10, MIB)], [0], gpm=False)])])
    reader = NvmlReader(nvml, UID, proc)
    with caplog.at_level(logging.WARNING):
        assert [reader.read() for _ in range(3)] == [
            GpuReading(memory_used_mib=1.0, utilization_percent=None, model=H100)
        ] * 3
    assert caplog.text.count("cannot read the utilisation of a MIG instance") == 1


def test_a_pod_without_gpu_processes_uses_nothing(proc: Path) -> None:
    nvml = FakeNvml([FakeDevice(H100, [(20, 4096 * MIB)], [100])])
    assert NvmlReader(nvml, UID, proc).read() == GpuReading(memory_used_mib=0.0, utilization_percent=0.0)


@pytest.mark.parametrize("seen_from", ["the pod's PID namespace", "a cgroup namespace of its own"])
def test_a_meter_that_cannot_see_the_pods_processes_reads_nothing(
    tmp_path: Path, seen_from: str, caplog: pytest.LogCaptureFixture,
) -> None:
    proc = pod_proc(tmp_path, UID, host_view=False)
    if seen_from == "a cgroup namespace of its own":  # host PIDs, but every cgroup path relative to its own
        (proc / "1" / "cgroup").write_text("0::/../../init.scope\n")
    nvml = FakeNvml([FakeDevice(H100, [(10, MIB)], [0])])
    reader = NvmlReader(nvml, UID, proc)
    with caplog.at_level(logging.INFO):
        assert [reader.read(), reader.read()] == [None, None]  # not "0 % busy": unknown, so never idle
    assert caplog.text.count("the meter cannot see this pod's GPU processes") == 1


def test_memory_the_driver_does_not_disclose_counts_as_none(proc: Path) -> None:
    nvml = FakeNvml([FakeDevice(H100, [(10, None), (11, 512 * MIB)], [10])])
    assert NvmlReader(nvml, UID, proc).read() == GpuReading(memory_used_mib=512.0, utilization_percent=10.0, model=H100)


def test_the_model_is_the_first_device_the_pod_runs_on_as_nvml_names_it(proc: Path) -> None:
    nvml = FakeNvml(
        [FakeDevice(H100, [(20, MIB)], [100]), FakeDevice(T4, [(11, MIB)], [40]), FakeDevice(A10, [(10, MIB)], [60])]
    )
    assert NvmlReader(nvml, UID, proc).read() == GpuReading(memory_used_mib=2.0, utilization_percent=60.0, model=T4)


def test_an_nvml_failure_gives_no_reading_and_one_log_line(proc: Path, caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([FakeDevice(H100, [(10, MIB)], [50])])
    reader = NvmlReader(nvml, UID, proc)
    nvml.failure = "GPU is lost"
    with caplog.at_level(logging.WARNING):
        assert [reader.read(), reader.read(), reader.read()] == [None, None, None]
    assert caplog.text.count("GPU is lost") == 1
    nvml.failure = None
    assert reader.read() == GpuReading(memory_used_mib=1.0, utilization_percent=50.0, model=H100)


@pytest.mark.skipif(fake_gpu.nvidia_driver_present(), reason="an NVIDIA driver is present: see test_with_a_driver")
def test_without_a_driver_there_is_no_reader_and_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        assert open_reader(UID) is None
    assert len(caplog.records) == 1
    assert "no GPU visible to the meter" in caplog.text


@pytest.mark.skipif(
    not fake_gpu.nvidia_driver_present(), reason="no NVIDIA driver on this machine: see test_without_a_driver"
)
def test_with_a_driver_the_reader_reads() -> None:
    reader = open_reader(UID)
    assert reader is not None
    reading = reader.read()
    assert reading is not None and reading.memory_used_mib >= 0


def test_the_reader_is_chosen_by_module_and_function() -> None:
    reader = load_reader("tests.sidecar.fake_gpu:open_reader", UID)
    assert isinstance(reader, fake_gpu.FakeGpu)
    assert reader.read() == GpuReading(fake_gpu.MEMORY_USED_MIB, fake_gpu.UTILIZATION_PERCENT, fake_gpu.MODEL)


@pytest.mark.parametrize(
    "path", ["tests.sidecar.no_such_module:open_reader", "tests.sidecar.fake_gpu:no_such_function"]
)
def test_a_reader_that_cannot_be_loaded_stops_the_meter_at_start(path: str) -> None:
    with pytest.raises(ConfigError, match=f"GPUSHARING_METER_GPU_READER='{path}' cannot be loaded"):
        load_reader(path, UID)
