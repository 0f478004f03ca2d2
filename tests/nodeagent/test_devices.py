"""The node's GPUs read through NVML, played by a fake driver on a clock: each interval sees only the samples taken
since the last (a cursor per device), a process sampled several times reads as their mean, no sample is 0 % and
not unknown, a driver without per-process samples gives the device's, MIG instances read through GPM, and a GPU
that fails is left out, said once."""

from __future__ import annotations

import logging

import pytest

from nodeagent.devices import DeviceWindow, Gpus
from tests.nodeagent.fake_nvml import MIB, FakeGpu, FakeNvml

GPU0, GPU1, MIG0, MIG1 = "GPU-0000", "GPU-1111", "MIG-aaaa", "MIG-bbbb"


def test_each_interval_reads_the_samples_since_the_last_one_as_each_process_mean() -> None:
    gpu = FakeGpu(GPU0, {10: 512 * MIB, 20: None}, samples=[
        (0.5, 10, 40), (1.0, 10, 60), (1.5, 20, 10),  # the first interval: 10 sampled twice
        (2.5, 10, 90),  # the second
        # the third: nothing sampled, though both still hold memory
        (6.5, 99, 70),  # the fourth: a process of no pod
    ])
    nvml = FakeNvml([gpu])
    gpus = Gpus(nvml)
    busy = []
    for _ in range(4):
        nvml.advance(2.0)
        busy.append(gpus.read()[GPU0].busy_by_pid)
    assert busy == [{10: 50.0, 20: 10.0}, {10: 90.0}, {}, {99: 70.0}]
    # the last sample's timestamp, kept across an empty interval
    assert nvml.cursors == [0, 1_500_000, 2_500_000, 2_500_000]
    assert gpus.read() == {GPU0: DeviceWindow(GPU0, {}, None, ((10, 512 * MIB), (20, None)))}


def test_a_steady_trace_is_sampled_every_period() -> None:
    nvml = FakeNvml([FakeGpu(GPU0, {10: MIB}, busy={10: 30, 11: 0}, period=0.5)])
    gpus = Gpus(nvml)
    nvml.advance(3.0)
    assert gpus.read()[GPU0].busy_by_pid == {10: 30.0}


def test_without_per_process_samples_the_device_utilisation_is_read_instead() -> None:
    nvml = FakeNvml(
        [
            FakeGpu(GPU0, {10: MIB}, per_process=False, utilisation=42.0),
            FakeGpu(GPU1, per_process=False, utilisation=None),
        ]
    )
    windows = Gpus(nvml).read()
    assert (windows[GPU0].busy_by_pid, windows[GPU0].device_busy) == (None, 42.0)
    assert (windows[GPU1].busy_by_pid, windows[GPU1].device_busy) == (None, None)  # the driver cannot say: unknown


def test_mig_instances_read_through_gpm_from_their_second_reading() -> None:
    ours, theirs = FakeGpu(MIG0, {10: 2 * MIB}, utilisation=45.0), FakeGpu(MIG1, {20: MIB}, utilisation=5.0)
    nvml = FakeNvml([FakeGpu(GPU0, mig=[ours, theirs])])
    gpus = Gpus(nvml)
    first, second = gpus.read(), gpus.read()
    assert set(first) == {MIG0, MIG1}  # the instances, not their GPU
    assert [first[MIG0].device_busy, second[MIG0].device_busy, second[MIG1].device_busy] == [None, 45.0, 5.0]
    assert second[MIG0].processes == ((10, 2 * MIB),) and second[MIG0].busy_by_pid is None
    assert len(nvml.freed) == 2


def test_a_gpm_figure_that_is_no_percent_is_bounded_or_unknown() -> None:
    weird, over = FakeGpu(MIG0, utilisation=float("nan")), FakeGpu(MIG1, utilisation=100.4)
    gpus = Gpus(FakeNvml([FakeGpu(GPU0, mig=[weird, over])]))
    gpus.read()
    second = gpus.read()
    assert (second[MIG0].device_busy, second[MIG1].device_busy) == (None, 100.0)


def test_mig_without_gpm_is_unknown_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([FakeGpu(GPU0, mig=[FakeGpu(MIG0, {10: MIB}, gpm=False)])])
    gpus = Gpus(nvml)
    with caplog.at_level(logging.WARNING):
        assert [gpus.read()[MIG0].device_busy for _ in range(3)] == [None, None, None]
    assert caplog.text.count("cannot read the utilisation of a MIG instance") == 1


def test_a_failing_gpu_is_left_out_said_once_until_it_reads_again(caplog: pytest.LogCaptureFixture) -> None:
    lost = FakeGpu(GPU1, {20: MIB}, failing=True)
    nvml = FakeNvml([FakeGpu(GPU0, {10: MIB}), lost])
    gpus = Gpus(nvml)
    with caplog.at_level(logging.WARNING):
        assert [set(gpus.read()) for _ in range(3)] == [{GPU0}] * 3
        lost.failing = False
        assert set(gpus.read()) == {GPU0, GPU1}
        lost.failing = True
        gpus.read()
    assert caplog.text.count("cannot read GPU 1 through NVML") == 2


def test_a_driver_that_cannot_count_its_gpus_fails_the_reading() -> None:
    nvml = FakeNvml([FakeGpu(GPU0)])
    nvml.failure = "Driver Not Loaded"
    with pytest.raises(nvml.NVMLError, match="Driver Not Loaded"):
        Gpus(nvml).read()


def test_each_device_says_its_model_as_nvml_names_it_and_nothing_where_the_driver_will_not() -> None:
    nvml = FakeNvml([FakeGpu("GPU-0", name="Tesla T4"), FakeGpu("GPU-1", name=None)])
    windows = Gpus(nvml).read()
    assert (windows["GPU-0"].model, windows["GPU-1"].model) == ("Tesla T4", None)
