"""Running the system's roles as real processes on loopback, and stopping them cleanly (demo, tests, benchmarks)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import requests

START_TIMEOUT_SECONDS = 60  # only stops a broken start from hanging; not a speed check


COMMAND = [sys.executable, "-m", "gpusharing.cli"]  # the `gpusharing` command of this interpreter


def run_command(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`gpusharing ARGS...` to its end, with `env` over this process's environment; output captured as text."""
    return subprocess.run(
        [*COMMAND, *args], env={**os.environ, **(env or {})}, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class TreeUsage:
    """What a process and its descendants have used so far (Linux /proc): a server's master and its workers."""

    user_seconds: float
    system_seconds: float
    context_switches: int  # every thread's, voluntary (it waited) and not (it was preempted)

    def __sub__(self, earlier: TreeUsage) -> TreeUsage:
        return TreeUsage(self.user_seconds - earlier.user_seconds, self.system_seconds - earlier.system_seconds,
                         self.context_switches - earlier.context_switches)


def tree_usage(root: int) -> TreeUsage:
    """The CPU and context switches of a process and its descendants so far (benchmarks)."""
    children: dict[int, list[int]] = {}
    times: dict[int, tuple[int, int]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        pid = int(stat.parent.name)
        children.setdefault(int(fields[1]), []).append(pid)
        times[pid] = (int(fields[11]), int(fields[12]))
    user = system = switches = 0
    pending = [root]
    while pending:
        pid = pending.pop()
        user, system = user + times.get(pid, (0, 0))[0], system + times.get(pid, (0, 0))[1]
        switches += _context_switches(pid)
        pending.extend(children.get(pid, ()))
    return TreeUsage(user / tick, system / tick, switches)


def _context_switches(pid: int) -> int:
    switches = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:  # gone meanwhile
            continue
        switches += sum(int(line.split()[1]) for line in lines
                        if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")))
    return switches


def tree_cpu_seconds(root: int) -> float:
    """User and system CPU of a process and its descendants so far, in seconds (benchmarks)."""
    usage = tree_usage(root)
    return usage.user_seconds + usage.system_seconds


def child_pids(parent: int) -> list[int]:
    """The processes whose parent is `parent` (a gunicorn master's workers), from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == parent:
            pids.append(int(stat.parent.name))
    return sorted(pids)


class Service:
    """`gpusharing ARGS...` (or `command` ARGS...) as a subprocess, ready once `ready_url` answers 200; stopped with
    SIGTERM on exit.

    Raises RuntimeError, with the end of the process's log, when it exits or is not ready in time.
    """

    def __init__(
        self,
        name: str,
        args: list[str],
        ready_url: str,
        env: dict[str, str] | None = None,
        verify: str | bool = True,
        log_path: Path | None = None,
        cwd: Path | None = None,
        command: list[str] = COMMAND,
    ):
        """`cwd`: the directory it runs in (`python -m` imports the packages found there first: another checkout's)."""
        self.name = name
        self.command = command
        self.cwd = cwd
        self.args = args
        self.ready_url = ready_url
        self.env = {**os.environ, **(env or {})}
        self.verify = verify
        self.log_path = log_path or Path(os.environ.get("TMPDIR", "/tmp")) / f"gpusharing-{name}-{os.getpid()}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> "Service":
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen([*self.command, *self.args], env=self.env, cwd=self.cwd, stdout=log,
                                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        session = requests.Session()
        session.trust_env = False
        while True:
            try:
                # Connection: close, else the server, once told to stop, lingers on the idle kept-alive connection.
                if (
                    session.get(
                        self.ready_url, verify=self.verify, timeout=1, headers={"Connection": "close"}
                    ).status_code
                    == 200
                ):
                    return self
            except requests.exceptions.SSLError as refused:  # it answers: waiting longer would change nothing
                self.stop()
                raise RuntimeError(
                    f"{self.name} answers, but its TLS certificate was not accepted: {refused}"
                ) from None
            except requests.RequestException:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"{self.name} did not start; the end of its log ({self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def log_tail(self, characters: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-characters:]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
