"""`make demo` keeps working: it shows every step and leaves nothing running."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

MARK = "GPUSHARING_TEST_DEMO_RUN"  # in the environment of the demo and of every process it starts


def marked_processes(run: str) -> set[str]:
    """Every process whose environment carries this run's mark (Linux /proc): the demo and what it started, and none
    of what runs beside it (other tests' gpusharing processes of the same interpreter, in a parallel run)."""
    found = set()
    mark = f"{MARK}={run}".encode()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark in environ.read_bytes().split(b"\0"):
                found.add(environ.parent.name)
        except OSError:
            pass  # the process ended while we looked
    return found


def test_demo_runs_the_whole_story_and_stops_everything() -> None:
    run = uuid.uuid4().hex
    result = subprocess.run([sys.executable, "-m", "demo"], capture_output=True, text=True, timeout=170,
                            env={**os.environ, MARK: run})
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "hami-fraction.yaml                allowed   hami             0.3     gpusharing-in-budget" in out
    assert 'DENIED    invalid GPU request: container "nvidia": tencent.com/vcuda-core="150"' in out
    assert ": over-budget" in out
    assert "kai-memory.yaml (over budget)     allowed   kai              0.0245  gpusharing-over-budget" in out
    assert "kai-memory.yaml (topped up)       allowed   kai              0.0245  gpusharing-in-budget" in out
    assert marked_processes(run) == set()
