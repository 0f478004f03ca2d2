"""Small JSON-over-HTTP servers on loopback: the demo's report sink and the test suite's fakes."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client gone before its answer, or refusing the certificate, is no error here


class KeepAliveHandler(BaseHTTPRequestHandler):
    """A quiet handler that keeps connections alive (HTTP/1.1), as gunicorn serves the project's services."""

    protocol_version = "HTTP/1.1"
    # reply_json writes the headers and the body apart: under Nagle's algorithm the body would wait for the client's
    # delayed ACK, 40 ms on every answer of a kept-alive connection.
    disable_nagle_algorithm = True

    def log_message(self, *args: Any) -> None:
        pass


def reply_json(
    handler: BaseHTTPRequestHandler, status: int, body: object, headers: dict[str, str] | None = None
) -> None:
    payload = json.dumps(body).encode()
    handler.send_response(status)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)
