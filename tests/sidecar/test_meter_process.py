"""The real meter process against the real timekeeper (SQLite) on loopback: a pod's bill is right to the second
through SIGTERM, timekeeper outages, a killed meter and a rotated token; GPU figures pass through the NVML seam.

"Right" is checked against the meter's own persisted start: the final report is computed after SIGTERM was sent
and before the process exited, so the timekeeper's total must lie between share x (each of those instants - start).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from demo.processes import free_port
from tests.sidecar import fake_gpu
from tests.sidecar.conftest import (
    GRACE_SECONDS,
    INTERVAL,
    METER_TOKENS,
    ROOT,
    MeterProcess,
    Stopped,
    Timekeeper,
    eventually,
)

ROUNDING = 0.002  # the meter reports GPU-seconds to the millisecond

Meters = Callable[..., MeterProcess]


def accepted_seq(timekeeper: Timekeeper, namespace: str) -> int:
    pods = timekeeper.pods(namespace)
    return int(pods[0]["seq"]) if pods else 0


def charged(timekeeper: Timekeeper, namespace: str) -> float:
    pods = timekeeper.pods(namespace)
    return float(pods[0]["gpuSeconds"]) if pods else 0.0


def assert_billed_to_the_end(timekeeper: Timekeeper, meter: MeterProcess, stopped: Stopped) -> None:
    assert stopped.exit_code == 0
    [pod] = timekeeper.pods(meter.namespace)
    low, high = meter.billed_between(stopped.signalled_at, stopped.exited_at)
    assert pod["final"] is True
    assert low - ROUNDING <= pod["gpuSeconds"] <= high + ROUNDING
    assert timekeeper.used_gpu_seconds(meter.namespace) == pytest.approx(pod["gpuSeconds"], abs=1e-3)
    assert "Traceback" not in meter.log()


def test_reports_until_sigterm_then_a_final_report_and_exit_0(timekeeper: Timekeeper, meters: Meters) -> None:
    meter = meters(timekeeper.url, "steady").start()
    eventually(lambda: accepted_seq(timekeeper, "steady") >= 3, "three reports accepted")
    assert 0 < charged(timekeeper, "steady")

    stopped = meter.terminate()

    assert_billed_to_the_end(timekeeper, meter, stopped)
    assert "(final)" in meter.log()


def test_with_json_logs_each_line_is_an_object_with_time_level_and_the_pod(
    timekeeper: Timekeeper, meters: Meters
) -> None:
    meter = meters(timekeeper.url, "json-logs", GPUSHARING_LOG_FORMAT="json").start()
    meter.wait_for_log("report 1 accepted")
    assert_billed_to_the_end(timekeeper, meter, meter.terminate())
    entries = [json.loads(line) for line in meter.log().splitlines()]
    assert {e["logger"] for e in entries} >= {"sidecar.meter"} and all(e["time"].endswith("Z") for e in entries)
    started = next(e for e in entries if e["message"].startswith("metering pod"))
    assert started["level"] == "info" and "json-logs/json-logs-pod" in started["message"]
    assert any(
        e["level"] == "info" and e["message"].startswith("report") and "(final)" in e["message"] for e in entries
    )
    metering = [e for e in entries if e["logger"].startswith("sidecar.")]
    assert metering and all((e["namespace"], e["pod"], e["pod_uid"]) == ("json-logs", "json-logs-pod", "uid-json-logs")
                            for e in metering)  # every line names the pod, for a log collector


def test_an_outage_of_several_intervals_is_billed_in_full_when_the_timekeeper_is_back(
    tmp_path: Path, meters: Meters
) -> None:
    keeper = Timekeeper(tmp_path / "timekeeper")
    keeper.start()
    try:
        meter = meters(keeper.url, "outage", GPUSHARING_LOG_LEVEL="debug").start()
        eventually(lambda: accepted_seq(keeper, "outage") >= 2, "two reports accepted")

        keeper.stop()
        meter.wait_for_log("still unavailable", count=4)  # retried with backoff, several intervals' worth (at debug)
        keeper.start()
        back_at = time.time()
        low, _ = meter.billed_between(back_at, back_at)
        eventually(lambda: charged(keeper, "outage") >= low, "the first report after the outage carrying all of it")

        assert_billed_to_the_end(keeper, meter, meter.terminate())
        # At info and above, the outage is two lines: its start and its end.
        assert meter.log().count(" is unavailable: ") == 1 and meter.log().count(" is back after ") == 1
    finally:
        keeper.stop()


def test_a_killed_meter_restarts_where_it_was_without_counting_twice(timekeeper: Timekeeper, meters: Meters) -> None:
    meter = meters(timekeeper.url, "restart").start()
    eventually(lambda: accepted_seq(timekeeper, "restart") >= 3, "three reports accepted")
    meter.kill()
    before = meter.state()
    time.sleep(3 * INTERVAL)  # the workload goes on while its meter is down

    meter.start()
    meter.wait_for_log("continuing the count begun at")
    eventually(lambda: accepted_seq(timekeeper, "restart") > before["seq"], "a report of the restarted meter accepted")
    assert meter.state()["startedAt"] == before["startedAt"]

    assert_billed_to_the_end(timekeeper, meter, meter.terminate())


def test_the_token_file_is_read_afresh_for_every_report(timekeeper: Timekeeper, meters: Meters) -> None:
    meter = meters(timekeeper.url, "rotation").start()
    eventually(lambda: accepted_seq(timekeeper, "rotation") >= 2, "two reports accepted")

    meter.set_token("revoked-token")
    meter.wait_for_log("refused by the timekeeper: HTTP 401")
    charged_before = charged(timekeeper, "rotation")
    refusals_before = meter.log().count("refused by the timekeeper")
    time.sleep(4 * INTERVAL)
    # Refusals are not retried in a loop: at most one per interval (a loop would make hundreds).
    assert meter.log().count("refused by the timekeeper") - refusals_before <= 4 + 1
    assert charged(timekeeper, "rotation") == charged_before

    meter.set_token(METER_TOKENS[1])
    eventually(lambda: charged(timekeeper, "rotation") > charged_before, "reports accepted with the new token")

    assert_billed_to_the_end(timekeeper, meter, meter.terminate())


def test_gpu_figures_reach_the_timekeeper_through_the_nvml_seam(timekeeper: Timekeeper, meters: Meters) -> None:
    meter = meters(
        timekeeper.url,
        "gpu",
        GPUSHARING_METER_GPU_READER="tests.sidecar.fake_gpu:open_reader",
        GPUSHARING_GPU_MEMORY_MIB="20480",
    ).start()
    eventually(lambda: bool(timekeeper.pods("gpu", overMemory="true")), "the pod listed as over its GPU memory request")

    [pod] = timekeeper.pods("gpu", overMemory="true")
    assert pod["gpuMemoryUsedMiB"] == fake_gpu.MEMORY_USED_MIB
    assert pod["gpuUtilizationPercent"] == fake_gpu.UTILIZATION_PERCENT
    assert pod["gpuMemoryRequestedMiB"] == 20480
    assert pod["gpuMemoryOverRequestMiB"] == fake_gpu.MEMORY_USED_MIB - 20480
    assert "no GPU visible" not in meter.log()

    assert_billed_to_the_end(timekeeper, meter, meter.terminate())


@pytest.mark.skipif(fake_gpu.nvidia_driver_present(), reason="a real NVIDIA driver is present: the meter would find it")
def test_without_a_gpu_the_meter_says_so_once_and_reports_without_gpu_figures(
    timekeeper: Timekeeper, meters: Meters
) -> None:
    meter = meters(timekeeper.url, "cpu-only", GPUSHARING_GPU_MEMORY_MIB="20480").start()
    eventually(lambda: accepted_seq(timekeeper, "cpu-only") >= 3, "three reports accepted")

    [pod] = timekeeper.pods("cpu-only")
    assert (pod["gpuMemoryUsedMiB"], pod["gpuUtilizationPercent"], pod["gpuMemoryRequestedMiB"]) == (None, None, 20480)
    assert timekeeper.pods("cpu-only", overMemory="true") == []
    assert meter.log().count("no GPU visible to the meter") == 1

    assert_billed_to_the_end(timekeeper, meter, meter.terminate())


def test_sigterm_while_the_timekeeper_is_unreachable_still_exits_0_within_the_grace_period(meters: Meters) -> None:
    meter = meters(f"http://127.0.0.1:{free_port()}", "unreachable", GPUSHARING_LOG_LEVEL="debug").start()
    meter.wait_for_log("still unavailable", count=1)

    stopped = meter.terminate()  # waits at most the grace period

    assert stopped.exit_code == 0
    assert "stopping without a final report" in meter.log()


def proc_status(pid: int, field: str) -> str:
    """A field of /proc/PID/status: what the kernel says of the process."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return next(line.split(":", 1)[1].strip() for line in lines if line.startswith(f"{field}:"))


def test_a_sigterm_while_the_meter_still_loads_its_libraries_waits_for_it_and_gets_the_final_report(
    timekeeper: Timekeeper, meters: Meters
) -> None:
    meter = meters(timekeeper.url, "early").start()
    assert meter.process is not None
    pid = meter.process.pid
    # The meter blocks SIGTERM first of all. It is stopped there, before it has loaded the TLS library its client
    # needs (most of a fifth of a second of imports are still to come), and given SIGTERM at that moment.
    eventually(lambda: bool(int(proc_status(pid, "SigBlk"), 16) & 1 << (signal.SIGTERM - 1)), "SIGTERM blocked")
    os.kill(pid, signal.SIGSTOP)
    eventually(lambda: proc_status(pid, "State").startswith("T"), "the meter stopped")
    loaded = Path(f"/proc/{pid}/maps").read_text()
    os.kill(pid, signal.SIGTERM)
    os.kill(pid, signal.SIGCONT)
    exit_code = meter.process.wait(timeout=GRACE_SECONDS)

    assert "/_ssl." not in loaded, "SIGTERM was blocked only once the meter's libraries were loaded"
    assert exit_code == 0  # not -15: the signal waited, pending, for the meter's first wait
    [pod] = timekeeper.pods("early")
    assert pod["final"] is True
    assert "SIGTERM received: sending the final report" in meter.log()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"GPUSHARING_GPU_SHARE": "half"}, "GPUSHARING_GPU_SHARE='half' must be a finite number"),
        ({"GPUSHARING_POD_UID": ""}, "GPUSHARING_POD_UID must be set"),
        (
            {"GPUSHARING_METER_STATE_DIR": "{tmp}/a-file/state"},
            "GPUSHARING_METER_STATE_DIR='{tmp}/a-file/state': Not a directory",
        ),
    ],
)
def test_a_bad_setting_stops_the_meter_at_start_with_one_line(
    tmp_path: Path, change: dict[str, str], message: str
) -> None:
    (tmp_path / "a-file").write_text("")
    env = {
        **os.environ,
        "GPUSHARING_NAMESPACE": "ml",
        "GPUSHARING_POD_NAME": "train-0",
        "GPUSHARING_POD_UID": "uid-1",
        "GPUSHARING_GPU_SHARE": "0.5",
        "GPUSHARING_TIMEKEEPER_URL": f"http://127.0.0.1:{free_port()}",
        "GPUSHARING_METER_STATE_DIR": str(tmp_path / "state"),
        **{key: value.format(tmp=tmp_path) for key, value in change.items()},
    }
    result = subprocess.run(
        [sys.executable, "-m", "gpusharing.cli", "meter"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert result.stderr == f"gpusharing: {message.format(tmp=tmp_path)}\n"
