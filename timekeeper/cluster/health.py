"""The controller process's own small HTTP server (plain, as kube-controller-manager's metrics port): `/livez`,
`/readyz` (once the caches have listed the cluster) and `/metrics`, on TIMEKEEPER_CONTROLLER_PORT."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpusharing.serving.metrics import render_metrics


def serve_health(host: str, port: int, ready: Callable[[], bool]) -> ThreadingHTTPServer:
    """Serves in a thread of its own until `shutdown()`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                body, content_type = render_metrics()
                self._answer(200, body, content_type)
            elif self.path == "/livez":
                self._answer(200, b"ok\n")
            elif self.path == "/readyz":
                ok = ready()
                self._answer(200 if ok else 503, b"ok\n" if ok else b"the caches have not listed the cluster yet\n")
            else:
                self._answer(404, b"not found: /livez, /readyz and /metrics are served here\n")

        def _answer(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # probes every few seconds: not worth a line
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
