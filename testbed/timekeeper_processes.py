"""`gpusharing timekeeper serve` (gunicorn, several workers) and `timekeeper controller` as real processes, for the
tests and bench/."""

from __future__ import annotations

from pathlib import Path

import requests

from demo.processes import Service, free_port


class TimekeeperProcess(Service):
    def __init__(self, database_url: str, tokens_file: str, log_path: Path, workers: int = 2, threads: int = 8,
                 cwd: Path | None = None, **env: str):
        """`cwd`: another checkout to run the timekeeper of (demo.processes.Service)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(
            f"timekeeper-{self.port}",
            [
                "timekeeper",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                str(workers),
                "--threads",
                str(threads),
            ],
            f"{self.url}/readyz",
            env={
                "TIMEKEEPER_DATABASE_URL": database_url,
                "TIMEKEEPER_AUTH": "static",
                "TIMEKEEPER_STATIC_TOKENS_FILE": tokens_file,
                **env,
            },
            log_path=log_path,
            cwd=cwd,
        )


class ControllerProcess(Service):
    """`gpusharing timekeeper controller` on the database, ready once its caches have listed the API's objects."""

    def __init__(self, database_url: str, log_path: Path, **env: str):
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        super().__init__(
            f"controller-{port}",
            ["timekeeper", "controller", "--host", "127.0.0.1", "--port", str(port)],
            f"http://127.0.0.1:{port}/readyz",
            env={"TIMEKEEPER_DATABASE_URL": database_url, **env},
            log_path=log_path,
        )

    def task_runs(self, task: str) -> float:
        """How many times the task has run, as its /metrics says."""
        return self.metric(f'gpusharing_controller_task_duration_seconds_count{{task="{task}"}}')

    def metric(self, series: str) -> float:
        """The value of one series (name and labels, as /metrics writes them) on its /metrics; 0 where absent."""
        text = requests.get(f"{self.url}/metrics", timeout=10).text
        prefix = f"{series} "
        return next((float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix)), 0.0)
