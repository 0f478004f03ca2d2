"""`gpusharing timekeeper serve` as a real process (gunicorn, several workers), for the concurrency test and bench/."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import requests

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TimekeeperProcess:
    def __init__(self, database_url: str, tokens_file: str, log_path: Path, workers: int = 2, threads: int = 8, **env: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "TIMEKEEPER_DATABASE_URL": database_url,
            "TIMEKEEPER_AUTH": "static",
            "TIMEKEEPER_STATIC_TOKENS_FILE": tokens_file,
            **env,
        }
        self._command = [sys.executable, "-m", "gpusharing.cli", "timekeeper", "serve", "--host", "127.0.0.1",
                         "--port", str(self.port), "--workers", str(workers), "--threads", str(threads)]
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> "TimekeeperProcess":
        log = self.log_path.open("wb")
        self._process = subprocess.Popen(self._command, env=self._env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.monotonic() + 60  # only stops a broken start from hanging the suite
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"the timekeeper exited with {self._process.returncode}: {self.log_path.read_text()[-2000:]}")
            try:
                if requests.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError(f"the timekeeper did not become ready: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.1)

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
