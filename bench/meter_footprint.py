"""Footprint of the metering sidecar: time from process start to its first report, and resident memory.

Runs the real meter (`python -m gpusharing.cli meter`, what the container's `gpusharing meter` runs) several times
against a loopback HTTP endpoint that takes reports and answers as the timekeeper does, so the figures are the
meter's own and not the timekeeper's. Per run: wall time from spawning the process to the first report arriving,
resident memory (VmRSS) once it has reported for a while, its peak (VmHWM), and the time from SIGTERM to exit,
both with the endpoint answering and with nothing listening (the final report then gives up at its deadline).
Run by hand:

    .venv/bin/python bench/meter_footprint.py                     # 5 runs, 3 s of reports at 0.1 s each
    .venv/bin/python bench/meter_footprint.py --runs 10 --seconds 10
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # demo/: the repository's, never installed

from demo.reportsink import ReportSink  # noqa: E402


@dataclass
class Run:
    first_report_s: float
    rss_mib: float
    peak_rss_mib: float
    stop_s: float
    exit_code: int
    reports: int


def memory_mib(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def meter_env(url: str, interval: float, workdir: Path) -> dict[str, str]:
    (workdir / "token").write_text("bench-token")
    return {
        **os.environ,
        "GPUSHARING_NAMESPACE": "bench",
        "GPUSHARING_POD_NAME": "bench-0",
        "GPUSHARING_POD_UID": f"bench-{workdir.name}",
        "GPUSHARING_GPU_SHARE": "0.5",
        "GPUSHARING_GPU_MEMORY_MIB": "40960",
        "GPUSHARING_TIMEKEEPER_URL": url,
        "GPUSHARING_TOKEN_PATH": str(workdir / "token"),
        "GPUSHARING_METER_STATE_DIR": str(workdir / "state"),
        "GPUSHARING_METER_INTERVAL": str(interval),
    }


def spawn_meter(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "gpusharing.cli", "meter"], env=env, stderr=subprocess.DEVNULL)


def one_run(sink: ReportSink, seconds: float, interval: float, workdir: Path) -> Run:
    sink.received.clear()
    started = time.perf_counter()
    process = spawn_meter(meter_env(sink.url, interval, workdir))
    try:
        while not sink.received:
            if process.poll() is not None:
                raise SystemExit(f"the meter exited with {process.returncode} before its first report")
            time.sleep(0.001)
        first = sink.received[0].at - started
        time.sleep(seconds)
        memory = memory_mib(process.pid)
        stopping = time.perf_counter()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        return Run(first, memory["VmRSS"], memory["VmHWM"], time.perf_counter() - stopping, code, len(sink.received))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def stop_while_unreachable(seconds: float, interval: float, workdir: Path) -> tuple[float, int]:
    """Seconds from SIGTERM to exit, and the exit code, of a meter whose timekeeper does not answer."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{unused.getsockname()[1]}"  # bound, never listening: connections are refused
        process = spawn_meter(meter_env(url, interval, workdir))
        time.sleep(seconds)
        stopping = time.perf_counter()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    return time.perf_counter() - stopping, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="how long each meter reports before SIGTERM")
    parser.add_argument("--interval", type=float, default=0.1, help="GPUSHARING_METER_INTERVAL of the measured meter")
    args = parser.parse_args()
    sink = ReportSink()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.runs):
            workdir = Path(tmp) / f"run{index}"
            workdir.mkdir()
            runs.append(one_run(sink, args.seconds, args.interval, workdir))
        unreachable_dir = Path(tmp) / "unreachable"
        unreachable_dir.mkdir()
        unreachable_stop, unreachable_code = stop_while_unreachable(args.seconds, args.interval, unreachable_dir)
    print(
        f"meter footprint: {args.runs} runs, reports every {args.interval:g} s for {args.seconds:g} s each, "
        f"Python {sys.version.split()[0]}"
    )
    for name, values, unit in (
        ("start to first report", [r.first_report_s * 1000 for r in runs], "ms"),
        ("resident memory (VmRSS)", [r.rss_mib for r in runs], "MiB"),
        ("peak resident memory (VmHWM)", [r.peak_rss_mib for r in runs], "MiB"),
        ("SIGTERM to exit", [r.stop_s * 1000 for r in runs], "ms"),
    ):
        print(
            f"  {name:30} median {statistics.median(values):7.1f} {unit:3}  "
            f"min {min(values):7.1f}  max {max(values):7.1f}"
        )
    print(
        f"  exit codes {sorted({r.exit_code for r in runs})}, "
        f"reports per run {min(r.reports for r in runs)}-{max(r.reports for r in runs)}"
    )
    print(f"  SIGTERM to exit, timekeeper unreachable: {unreachable_stop * 1000:.0f} ms, exit code {unreachable_code}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
