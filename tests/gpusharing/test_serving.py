"""gunicorn as the services run it (gpusharing.serving.server): what each worker is set up with, and two servers on one
host."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import requests
from gunicorn.config import Config
from gunicorn.http.parser import RequestParser

from demo.processes import free_port
from gpusharing.serving.server import GC_THRESHOLDS, _OneWriteResponse, stated_length
from tests.gpusharing.gc_app import ANSWER, STREAMED


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
            except (requests.ConnectionError, requests.Timeout):  # not listening yet, or its worker not yet answering
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


class RecordedSocket:
    """A socket whose every sendall is recorded, then made."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.writes: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.sock.sendall(data)


def answered(method: str, path: str, status: str, headers: list[tuple[str, str]], body: list[bytes]) -> list[bytes]:
    """What a worker's response writes, one item a sendall, for a request parsed by gunicorn from a real socket."""
    server, client = socket.socketpair()
    with server, client:
        client.sendall(f"{method} {path} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
        config = Config()
        request = next(iter(RequestParser(config, server, ("127.0.0.1", 1))))
        recorded = RecordedSocket(server)
        response = _OneWriteResponse(request, recorded, config)  # type: ignore[arg-type]  # sendall is all it uses here
        response.start_response(status, headers)
        for part in body:
            response.write(part)
        response.close()
        return recorded.writes


def test_an_answer_is_written_at_once_its_headers_with_its_body() -> None:
    writes = answered("POST", "/mutate", "200 OK", [("Content-Length", str(len(ANSWER)))], [ANSWER])
    assert len(writes) == 1
    head, _, body = writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"\r\nContent-Length: %d" % len(ANSWER) in head
    assert body == ANSWER


def test_a_streamed_answer_sends_its_headers_with_its_first_chunk_and_ends_with_the_last_chunk() -> None:
    writes = answered("GET", "/streamed", "200 OK", [], list(STREAMED))
    assert len(writes) == len(STREAMED) + 1
    assert b"\r\nTransfer-Encoding: chunked\r\n" in writes[0]
    assert writes[0].endswith(b"\r\n\r\n%X\r\n%s\r\n" % (len(STREAMED[0]), STREAMED[0]))
    assert writes[1:-1] == [b"%X\r\n%s\r\n" % (len(part), part) for part in STREAMED[1:]]
    assert writes[-1] == b"0\r\n\r\n"


def test_an_answer_without_a_body_sends_its_headers_when_it_closes() -> None:
    writes = answered("GET", "/nothing", "204 No Content", [], [])
    assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 204 No Content\r\n") and writes[0].endswith(b"\r\n\r\n")


def test_answers_of_every_framing_read_whole_over_one_kept_alive_connection(served: str) -> None:
    connection = http.client.HTTPConnection(served.removeprefix("http://"), timeout=5)

    def read(method: str, path: str) -> tuple[int, str | None, bytes]:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.getheader("Transfer-Encoding"), response.read()

    try:
        assert read("POST", "/answer") == (200, None, ANSWER)
        kept = connection.sock
        for _ in range(2):
            assert read("GET", "/streamed") == (200, "chunked", b"".join(STREAMED))
            assert read("GET", "/nothing") == (204, None, b"")
            assert read("POST", "/answer") == (200, None, ANSWER)
        assert connection.sock is kept  # never closed by the server, never opened again by the client
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("environ", "length"),
    [
        ({"CONTENT_LENGTH": "1024"}, 1024),
        ({"CONTENT_LENGTH": "0"}, 0),
        ({"CONTENT_LENGTH": "2048"}, 2048),  # the bound itself
        ({"CONTENT_LENGTH": "2049"}, None),  # over the bound: Flask's 413
        ({}, None),  # no stated length
        ({"CONTENT_LENGTH": ""}, None),
        ({"CONTENT_LENGTH": "12", "HTTP_TRANSFER_ENCODING": "chunked"}, None),
        ({"CONTENT_LENGTH": "+12"}, None),
        ({"CONTENT_LENGTH": " 12"}, None),
        ({"CONTENT_LENGTH": "\u0661\u0662"}, None),  # digits, but not ASCII ones
        ({"CONTENT_LENGTH": "0" * 5000 + "2"}, None),  # more digits than int() reads
    ],
)
def test_a_hot_path_takes_only_a_body_of_plain_stated_length_within_its_bound(
    environ: dict[str, str], length: int | None
) -> None:
    assert stated_length(environ, 2048) == length
