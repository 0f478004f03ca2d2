"""What the utilisation source's tests share: a sink that records what the `utilisation` task hands on, governed pods
as the webhook records them and their kubelet runs them, a canned HTTP server on loopback (a stand-in Prometheus, a
fake dcgm-exporter), and Prometheus's binaries."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sys
import threading
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from demo.kubeapi import FakeKube
from gpusharing.utilisation import PodUtilisation, UtilisationSource


@dataclass
class RecordingSink:
    """The ingestion's stand-in (a UtilisationSink): every call, as it came."""

    calls: list[tuple[UtilisationSource, list[PodUtilisation], float, dt.datetime]] = field(default_factory=list)

    def __call__(self, source: UtilisationSource, readings: Sequence[PodUtilisation], window_seconds: float,
                 at: dt.datetime) -> None:
        self.calls.append((source, list(readings), window_seconds, at))

    def last(self) -> dict[str, float | None]:
        """The last call's readings by namespace/name."""
        return {f"{r.namespace}/{r.pod}": r.utilisation_percent for r in self.calls[-1][1]}


def run_gpu_pod(kube: FakeKube, namespace: str, name: str, share: str, started: dt.datetime) -> dict[str, Any]:
    """A governed pod the webhook admitted at `share` GPUs, running since `started`."""
    pod = kube.add_pod(namespace, name, share=share)
    pod["status"]["startTime"] = started.strftime("%Y-%m-%dT%H:%M:%SZ")
    return pod


def beside_python(tool: str) -> str:
    """promtool or prometheus: what `make tools` put beside this Python (.venv/bin), else the machine's; the test is
    skipped without it, and fails under CI=true."""
    beside = Path(sys.executable).parent / tool
    found = str(beside) if beside.exists() else shutil.which(tool)
    if found is None:
        how = (
            f"{tool} is needed: `make tools` puts Debian's beside this Python, in .venv/bin "
            "(or install the prometheus package)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {how}", pytrace=False)
        pytest.skip(how)
    return found


class CannedServer:
    """Answers every GET with `status`, `content_type` and `body` (set by the test); what it was asked: the path, the
    query, the Authorization header."""

    def __init__(self, content_type: str = "application/json") -> None:
        self.status, self.content_type, self.body = 200, content_type, b""
        self.asked: list[tuple[str, dict[str, list[str]], str | None]] = []
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                canned.asked.append((url.path, urllib.parse.parse_qs(url.query), self.headers.get("Authorization")))
                self.send_response(canned.status)
                self.send_header("Content-Type", canned.content_type)
                self.send_header("Content-Length", str(len(canned.body)))
                self.end_headers()
                self.wfile.write(canned.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.url = f"http://{self.address}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
