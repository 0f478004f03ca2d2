"""Running the system's roles as real processes on loopback, and stopping them cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from types import TracebackType

import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """`gpusharing ARGS...` as a subprocess, ready once `ready_url` answers 200; stopped with SIGTERM on exit."""

    def __init__(self, name: str, args: list[str], ready_url: str, env: dict[str, str] | None = None, verify: str | bool = True):
        self.name = name
        self.args = args
        self.ready_url = ready_url
        self.env = {**os.environ, **(env or {})}
        self.verify = verify
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = f"{os.environ.get('TMPDIR', '/tmp')}/gpusharing-demo-{name}.log"

    def __enter__(self) -> "Service":
        log = open(self.log_path, "wb")
        self.process = subprocess.Popen([sys.executable, "-m", "gpusharing.cli", *self.args], env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        session = requests.Session()
        session.trust_env = False
        while True:
            try:
                if session.get(self.ready_url, verify=self.verify, timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"{self.name} did not start; its log is {self.log_path}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
