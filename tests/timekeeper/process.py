"""`gpusharing timekeeper serve` as a real process (gunicorn, several workers), for the concurrency test and bench/."""

from __future__ import annotations

from pathlib import Path

from demo.processes import Service, free_port


class TimekeeperProcess(Service):
    def __init__(self, database_url: str, tokens_file: str, log_path: Path, workers: int = 2, threads: int = 8, **env: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(
            f"timekeeper-{self.port}",
            ["timekeeper", "serve", "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(workers), "--threads", str(threads)],
            f"{self.url}/readyz",
            env={"TIMEKEEPER_DATABASE_URL": database_url, "TIMEKEEPER_AUTH": "static", "TIMEKEEPER_STATIC_TOKENS_FILE": tokens_file, **env},
            log_path=log_path,
        )
