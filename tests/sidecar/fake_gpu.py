"""A GPU for the meter's NVML seam in tests, selected with
GPUSHARING_METER_GPU_READER=tests.sidecar.fake_gpu:open_reader."""

from sidecar.nvml import GpuReading

MEMORY_USED_MIB = 30720.0  # more than the 20480 MiB the tests say the pod requested: an overrun
UTILIZATION_PERCENT = 87.0
MODEL = "NVIDIA H100 80GB HBM3"


class FakeGpu:
    def read(self) -> GpuReading:
        return GpuReading(memory_used_mib=MEMORY_USED_MIB, utilization_percent=UTILIZATION_PERCENT, model=MODEL)


def open_reader(pod_uid: str) -> FakeGpu:
    return FakeGpu()


def nvidia_driver_present() -> bool:
    """Whether this machine has a real NVIDIA driver, where the meter's default reader would find a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True
