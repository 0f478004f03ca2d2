"""`make demo` keeps working: it shows every step and leaves nothing running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def gpusharing_processes() -> set[str]:
    """Every process running a gpusharing role with this interpreter (Linux /proc): not those of other checkouts
    whose suites run on the same machine meanwhile."""
    found = set()
    ours = [sys.executable.encode(), b"-m", b"gpusharing.cli"]
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().split(b"\0")[:3] == ours:
                found.add(cmdline.parent.name)
        except OSError:
            pass  # the process ended while we looked
    return found


def test_demo_runs_the_whole_story_and_stops_everything() -> None:
    before = gpusharing_processes()
    result = subprocess.run([sys.executable, "-m", "demo"], capture_output=True, text=True, timeout=170)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "hami-fraction.yaml                allowed   hami             0.3     gpusharing-in-budget" in out
    assert 'DENIED    invalid GPU request: container "nvidia": tencent.com/vcuda-core="150"' in out
    assert ": over-budget" in out
    assert "kai-memory.yaml (over budget)     allowed   kai              0.0245  gpusharing-over-budget" in out
    assert "kai-memory.yaml (topped up)       allowed   kai              0.0245  gpusharing-in-budget" in out
    assert gpusharing_processes() - before == set()
