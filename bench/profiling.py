"""Where a server's workers spend their time under a benchmark's load: py-spy (`pip install py-spy`) samples each
gunicorn worker's thread holding the GIL (`--gil`, every thread: `--threads`) while the benchmark runs, and each
sample is counted under the first part of the benchmark's list whose marks one of its frames holds.

`--gil` because the GIL's holder is where a Python server's CPU goes (a worker's other threads wait for it); under
load a thread also holds the GIL while the kernel runs another process, so the time per request moves with the
machine's load."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from demo.processes import child_pids

# A part's name and the marks of its frames; py-spy's raw frames read "function (file:line)".
Parts = Sequence[tuple[str, tuple[str, ...]]]
RATE = 200  # samples a second


def py_spy() -> str | None:
    """py-spy (`pip install py-spy`), on the PATH or beside this interpreter."""
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def profiled_run(
    spy: str, name: str, master: int, run: Callable[[], dict[str, float]], count: str, duration: float,
    directory: Path, parts: Parts,
) -> tuple[dict[str, float], dict[str, float]]:
    """`run()` (one measurement of `duration` seconds, whose figures count the requests under `count`) while py-spy
    samples each worker of the gunicorn `master`; the figures, and each part's GIL time per request in µs. The raw
    samples are left in `directory`, one file per worker."""
    outputs, recorders = [], []
    for worker in child_pids(master):
        outputs.append(directory / f"{name.replace(' ', '-')}-{worker}.txt")
        recorders.append(subprocess.Popen(
            [spy, "record", "--pid", str(worker), "--gil", "--threads", "--nonblocking", "--rate", str(RATE),
             "--duration", str(int(duration) + 2), "--format", "raw", "--output", str(outputs[-1])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))
    time.sleep(1)  # attached
    figures = run()
    for recorder in recorders:
        recorder.wait()
    samples: dict[str, int] = {}
    for output in outputs:
        lines = output.read_text().splitlines() if output.exists() else []
        for stack, _, number in (line.rpartition(" ") for line in lines):
            if number.isdigit():
                part = next((part for part, marks in parts if any(mark in stack for mark in marks)), "other")
                samples[part] = samples.get(part, 0) + int(number)
    return figures, {part: n / RATE * 1e6 / max(figures[count], 1) for part, n in samples.items()}


def print_profiles(profiles: dict[str, dict[str, float]], parts: Parts, unit: str) -> None:
    """Each server's GIL time per `unit` (a review, a report) by part, side by side."""
    names = sorted(profiles)
    width = max(45, *(len(part) for part, _ in parts))
    print(f"{'GIL time per ' + unit + ', us':>{width}}" + "".join(f"{name:>22}" for name in names))
    for part in [*(part for part, _ in parts), "other"]:
        if any(part in profiles[name] for name in names):
            print(f"{part:>{width}}" + "".join(f"{profiles[name].get(part, 0.0):22.0f}" for name in names))
    print(f"{'all':>{width}}" + "".join(f"{sum(profiles[name].values()):22.0f}" for name in names))
