"""gunicorn as the services run it (gpusharing.serving.server): what each worker is set up with, and two servers on one host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import requests

from demo.processes import free_port
from gpusharing.serving.server import GC_THRESHOLDS


@contextmanager
def probe_server(env: dict[str, str] | None = None) -> Iterator[str]:
    """tests/gpusharing/gc_app.py under gpusharing.serving.server.serve, one worker; its URL once it answers."""
    port = free_port()
    program = ("from gpusharing.serving.server import ServerOptions, serve; "
               f"serve('tests.gpusharing.gc_app:create_app', ServerOptions(host='127.0.0.1', port={port}, workers=1))")
    server = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                requests.get(f"{url}/gc", timeout=1)
                break
            except requests.ConnectionError:
                assert server.poll() is None, server.communicate()[1].decode()[-2000:]
                assert time.monotonic() < deadline, "gunicorn did not answer within 20 s"
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=15)


@pytest.fixture
def served() -> Iterator[str]:
    with probe_server() as url:
        yield url


def test_each_worker_freezes_what_it_started_with_and_collects_young_garbage_less_often(served: str) -> None:
    collector = requests.get(f"{served}/gc", timeout=5).json()
    assert tuple(collector["thresholds"]) == GC_THRESHOLDS != (700, 10, 10)
    assert collector["frozen"] > 10_000  # the worker's modules and app, out of the collector's passes


def test_a_worker_that_exits_leaves_the_metrics_directory_to_the_others(served: str) -> None:
    first = requests.get(f"{served}/gc", timeout=5).json()
    metrics = Path(first["metricsDir"])
    assert metrics.is_dir()
    os.kill(first["pid"], signal.SIGTERM)  # the worker exits; gunicorn starts another
    deadline = time.monotonic() + 20
    while requests.get(f"{served}/gc", timeout=5).json()["pid"] == first["pid"]:
        assert time.monotonic() < deadline, "no new worker within 20 s"
        time.sleep(0.1)
    assert metrics.is_dir(), "the exiting worker removed the directory every worker writes its metrics to"


def test_two_servers_on_one_host_share_no_control_socket(tmp_path: Path) -> None:
    """gunicorn >= 25.1 opens a control socket at one path per user; the second server would take the first's."""
    runtime = tmp_path / "run"
    runtime.mkdir()
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(runtime)}  # where gunicorn would put it
    with ExitStack() as stack:
        urls = [stack.enter_context(probe_server(env)) for _ in range(2)]
        for url in urls:
            assert requests.get(f"{url}/gc", timeout=5).status_code == 200
        assert sorted(p.name for p in tmp_path.rglob("*")) == ["run"]
