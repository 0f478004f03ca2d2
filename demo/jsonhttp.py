"""Small JSON-over-HTTP servers on loopback: the demo's report sink and the test suite's fakes."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


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
