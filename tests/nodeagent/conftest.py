"""What a node agent under test talks to: a kubelet's socket in a short temporary directory (a unix socket's path
holds at most 107 bytes) and a timekeeper's node-readings endpoint on loopback that records what it is sent."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from demo.jsonhttp import KeepAliveHandler, reply_json


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="podres-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Received:
    path: str
    authorization: str | None
    body: Any


@dataclass
class ReadingsEndpoint:
    """POST /api/v1/node-readings, answered with `statuses` in turn (the last one repeating)."""

    url: str
    received: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=lambda: [200])
    ignored: list[dict[str, str]] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def answer(self) -> tuple[int, dict[str, Any]]:
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        if status == 200:
            body = self.received[-1].body
            return 200, {"accepted": len(body["readings"]) - len(self.ignored), "ignored": self.ignored}
        return status, {"error": "not now" if status >= 500 else "the token is not a node agent's of this node"}

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        """The first `count` requests, once they have arrived (the timeout only stops a broken test from hanging)."""
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.received) >= count, timeout), (
                f"{len(self.received)} of {count} requests came"
            )
            return self.received[:count]


@pytest.fixture
def endpoint() -> Iterator[ReadingsEndpoint]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    recorder = ReadingsEndpoint(f"http://127.0.0.1:{server.server_address[1]}")

    class Handler(KeepAliveHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with recorder.arrived:
                recorder.received.append(Received(self.path, self.headers.get("Authorization"), body))
                status, answer = recorder.answer()
                recorder.arrived.notify_all()
            reply_json(self, status, answer)

    server.RequestHandlerClass = Handler
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield recorder
    server.shutdown()
    server.server_close()
