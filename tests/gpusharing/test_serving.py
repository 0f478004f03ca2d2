"""gunicorn as the services run it (gpusharing.serving): what each worker is set up with."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import requests

from demo.processes import free_port
from gpusharing.serving import GC_THRESHOLDS


@pytest.fixture
def served() -> Iterator[str]:
    port = free_port()
    program = ("from gpusharing.serving import ServerOptions, serve; "
               f"serve('tests.gpusharing.gc_app:create_app', ServerOptions(host='127.0.0.1', port={port}, workers=1))")
    server = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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


def test_each_worker_freezes_what_it_started_with_and_collects_young_garbage_less_often(served: str) -> None:
    collector = requests.get(f"{served}/gc", timeout=5).json()
    assert tuple(collector["thresholds"]) == GC_THRESHOLDS != (700, 10, 10)
    assert collector["frozen"] > 10_000  # the worker's modules and app, out of the collector's passes
