"""The laptop block of docs/operations.md runs as written, in a shell that stops at the first failing command: the
timekeeper started in the background, a readiness wait, then the commands, which never race its start."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from demo.processes import free_port

ROOT = Path(__file__).resolve().parents[2]


def laptop_block() -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text[text.index("### On a laptop"):]
    return re.search(r"```sh\n(.*?)```", section, re.S)[1]  # type: ignore[index]


def test_the_laptop_block_waits_for_the_timekeeper_and_runs(tmp_path: Path) -> None:
    lines = laptop_block().splitlines()
    assert lines[0].startswith("make test") and lines[1].startswith("export PATH=")  # what the suite has done already
    port = str(free_port())  # 8080 may be taken on a shared machine
    script = "\n".join(lines[2:]).replace("8080", port)
    assert "--retry-connrefused" in script and "/readyz" in script
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "TIMEKEEPER_URL": f"http://127.0.0.1:{port}", "GPUSHARING_LOG_LEVEL": "warning"}
    for variable in ("TIMEKEEPER_DATABASE_URL", "TIMEKEEPER_TOKEN", "TIMEKEEPER_AUTH"):
        env.pop(variable, None)
    # Whatever fails, the background timekeeper is stopped with the shell.
    stop = "trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n"
    ran = subprocess.run(
        ["bash", "-e", "-c", stop + script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    said = ran.stdout.splitlines()
    assert said[:2] == ["database migrated to head", '{"status":"ok"}'], ran.stdout  # curl printed /readyz once ready
    assert any(line.split()[:2] == ["ml-team", "6,000.0"] for line in said), ran.stdout
