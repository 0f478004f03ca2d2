"""A tiny HTTP CONNECT proxy on 127.0.0.1, as a kubeconfig's `proxy-url` names one: it opens a tunnel to the target
it is asked for, copies bytes both ways, and records every target, so that a test can show which connections went
through it."""

from __future__ import annotations

import select
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ConnectProxy:
    def __init__(self) -> None:
        self.tunnels: list[str] = []  # host:port of every CONNECT, in order
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_CONNECT(self) -> None:
                proxy.tunnels.append(self.path)
                host, _, port = self.path.rpartition(":")
                try:
                    upstream = socket.create_connection((host, int(port)), timeout=10)
                except OSError:
                    self.send_error(502, "cannot reach the target")
                    return
                self.send_response(200, "Connection established")
                self.end_headers()
                _relay(self.connection, upstream)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _relay(client: socket.socket, upstream: socket.socket) -> None:
    """Bytes both ways until either side closes."""
    with upstream:
        sockets = [client, upstream]
        while True:
            readable, _, _ = select.select(sockets, [], [], 30)
            if not readable:
                return
            for source in readable:
                data = source.recv(65536)
                if not data:
                    return
                (upstream if source is client else client).sendall(data)
