"""A stand-in for the timekeeper's report endpoint on loopback, for measuring and testing the meter on its own."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any

from demo.jsonhttp import KeepAliveHandler, reply_json


@dataclass(frozen=True)
class Received:
    at: float  # time.perf_counter() on arrival
    body: dict[str, Any]
    authorization: str | None


class ReportSink:
    """Takes every POST as a report, keeps it, and answers with `status` and `answer` (set them to change the
    answer)."""

    def __init__(self) -> None:
        self.status = 200
        self.answer: dict[str, Any] = {"state": "in-budget"}
        self.received: list[Received] = []
        sink = self

        class Handler(KeepAliveHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                sink.received.append(Received(time.perf_counter(), body, self.headers.get("Authorization")))
                reply_json(self, sink.status, sink.answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
