"""The real meter process and the real timekeeper (SQLite) on loopback, as the integration tests drive them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from demo.processes import Service, free_port
from sidecar.state import STATE_FILE

ADMIN_TOKEN = "admin-token"
METER_TOKENS = ("meter-token-a", "meter-token-b")
INTERVAL = 0.2  # GPUSHARING_METER_INTERVAL of the meters under test
GRACE_SECONDS = 30  # Kubernetes' default termination grace period: the meter must be gone by then
ROOT = Path(__file__).resolve().parents[2]  # the meter imports the tests' fake GPU from here


def eventually(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait until `condition` holds; the timeout only stops a broken test from hanging, it is not a speed check."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.05)


class Timekeeper:
    """`gpusharing timekeeper serve` on a SQLite file with static tokens; can be stopped and started again."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        tokens = workdir / "tokens"
        tokens.write_text(f"{ADMIN_TOKEN} admin\n" + "".join(f"{token} meter\n" for token in METER_TOKENS))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            "TIMEKEEPER_DATABASE_URL": f"sqlite:///{workdir / 'timekeeper.sqlite'}",
            "TIMEKEEPER_AUTH": "static",
            "TIMEKEEPER_STATIC_TOKENS_FILE": str(tokens),
            "TIMEKEEPER_WORKERS": "1",
            "TIMEKEEPER_THREADS": "4",
        }
        upgrade = subprocess.run(
            [sys.executable, "-m", "gpusharing.cli", "db", "upgrade"],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
        )
        assert upgrade.returncode == 0, upgrade.stderr
        self.log_path = workdir / "timekeeper.log"
        self._service: Service | None = None

    def start(self) -> None:
        self._service = Service(
            f"meter-test-timekeeper-{self.port}",
            ["timekeeper", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
            f"{self.url}/readyz",
            env=self.env,
            log_path=self.log_path,  # beside the test's other files, not in the shared /tmp
        )
        self._service.__enter__()

    def stop(self) -> None:
        if self._service is not None:
            self._service.stop()
            self._service = None

    def get(self, path: str, **params: str) -> Any:
        response = requests.get(
            f"{self.url}{path}", params=params, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10
        )
        response.raise_for_status()
        return response.json()

    def used_gpu_seconds(self, namespace: str) -> float:
        """What the namespace is charged for: its use in the current period."""
        return float(self.get(f"/api/v1/budgets/{namespace}")["usedGpuMinutes"]) * 60

    def pods(self, namespace: str, **params: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.get("/api/v1/pods", namespace=namespace, **params)["items"]
        return items


@dataclass
class Stopped:
    exit_code: int
    signalled_at: float  # Unix time just before SIGTERM was sent
    exited_at: float  # Unix time just after the process was seen to exit


class MeterProcess:
    """`gpusharing meter` as the webhook wires it, with a state directory that outlives the process."""

    def __init__(self, workdir: Path, timekeeper_url: str, namespace: str, share: float, **env: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.namespace = namespace
        self.share = share
        self.token_path = workdir / "token"
        self.set_token(METER_TOKENS[0])
        self.state_dir = workdir / "state"
        self.log_path = workdir / "meter.log"
        self.env = {
            **os.environ,
            "GPUSHARING_NAMESPACE": namespace,
            "GPUSHARING_POD_NAME": f"{namespace}-pod",
            "GPUSHARING_POD_UID": f"uid-{namespace}",
            "GPUSHARING_GPU_SHARE": str(share),
            "GPUSHARING_TIMEKEEPER_URL": timekeeper_url,
            "GPUSHARING_TOKEN_PATH": str(self.token_path),
            "GPUSHARING_METER_STATE_DIR": str(self.state_dir),
            "GPUSHARING_METER_INTERVAL": str(INTERVAL),
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> "MeterProcess":
        with open(self.log_path, "ab") as log:  # appended to: a restarted meter's lines follow the first one's
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpusharing.cli", "meter"], env=self.env, stderr=log, cwd=ROOT
            )
        return self

    def set_token(self, token: str) -> None:
        """Replace the token file the way the kubelet does: the new content appears at once, whole."""
        staged = self.token_path.with_name(".token.new")
        staged.write_text(token)
        os.replace(staged, self.token_path)

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_for_log(self, text: str, count: int = 1) -> None:
        eventually(lambda: self.log().count(text) >= count, f"{count} x {text!r} in the meter's log")

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads((self.state_dir / STATE_FILE).read_text())
        return state

    def billed_between(self, since: float, until: float) -> tuple[float, float]:
        """The total the meter must have reported if it took its last reading between these two Unix times."""
        started_at = self.state()["startedAt"]
        return self.share * (since - started_at), self.share * (until - started_at)

    def terminate(self) -> Stopped:
        assert self.process is not None
        signalled_at = time.time()
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=GRACE_SECONDS)
        return Stopped(code, signalled_at, time.time())

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def timekeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Timekeeper]:
    keeper = Timekeeper(tmp_path_factory.mktemp("timekeeper"))
    keeper.start()
    yield keeper
    keeper.stop()


@pytest.fixture
def meters(tmp_path: Path) -> Iterator[Callable[..., MeterProcess]]:
    """Makes meters (not started) in this test's directory; kills any still running at the end."""
    made: list[MeterProcess] = []

    def make(timekeeper_url: str, namespace: str, share: float = 0.5, **env: str) -> MeterProcess:
        meter = MeterProcess(tmp_path / namespace, timekeeper_url, namespace, share, **env)
        made.append(meter)
        return meter

    yield make
    for meter in made:
        meter.close()
