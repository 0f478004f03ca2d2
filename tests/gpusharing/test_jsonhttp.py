"""The standard-library JSON client the meter, the webhook's poller and the CLI share: keep-alive, and every way of
getting no answer said in words that tell what to check."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import pytest

from demo.jsonhttp import KeepAliveHandler, reply_json
from demo.processes import free_port
from gpusharing.serving.jsonhttp import Answer, JsonClient, TooLarge, Unreachable


class EchoServer:
    """Answers every request with its method, path, body and bearer token, on HTTP/1.1 keep-alive connections."""

    def __init__(self) -> None:
        self.connections: set[tuple[str, int]] = set()
        self.close_after_answer = False
        self.closed = threading.Event()  # set once the server has closed a connection
        echo = self

        class Handler(KeepAliveHandler):
            def _answer(self) -> None:
                echo.connections.add(self.client_address)
                self.close_connection = echo.close_after_answer  # as at a keep-alive timeout: without saying so
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                reply_json(self, 200, {"method": self.command, "path": self.path, "body": body,
                                       "authorization": self.headers.get("Authorization")})

            do_GET = do_POST = _answer  # noqa: N815

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def shutdown_request(self, request: Any) -> None:
                super().shutdown_request(request)
                echo.closed.set()

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.server.shutdown()
    server.server.server_close()


def test_json_goes_out_and_comes_back_with_the_token_over_one_kept_alive_connection(echo: EchoServer) -> None:
    client = JsonClient(echo.url + "/")
    answer = client.request("POST", "/api/v1/reports", {"seq": 1}, token="t-1")
    assert answer.status == 200
    assert answer.json() == {
        "method": "POST",
        "path": "/api/v1/reports",
        "body": {"seq": 1},
        "authorization": "Bearer t-1",
    }
    assert (
        client.request("GET", "/api/v1/pods", query={"overMemory": "true"}).json()["path"]
        == "/api/v1/pods?overMemory=true"
    )
    assert len(echo.connections) == 1
    client.close()


def test_a_connection_the_server_closed_while_idle_is_replaced_not_failed(echo: EchoServer) -> None:
    client = JsonClient(echo.url)
    echo.close_after_answer = True
    assert client.request("GET", "/a").status == 200
    echo.close_after_answer = False
    assert echo.closed.wait(10)
    assert client.request("GET", "/b").status == 200
    assert len(echo.connections) == 2


def test_an_answer_longer_than_allowed_is_not_read_further_and_its_connection_not_reused(echo: EchoServer) -> None:
    client = JsonClient(echo.url)
    whole = client.request("POST", "/a", {"pad": "x" * 500})
    with pytest.raises(TooLarge, match=f"answered with more than {len(whole.body) - 1} bytes"):
        client.request("POST", "/a", {"pad": "x" * 500}, max_bytes=len(whole.body) - 1)
    assert client.request("POST", "/a", {"pad": "x" * 500}, max_bytes=len(whole.body)).body == whole.body
    assert len(echo.connections) == 2  # the one cut short was closed: its unread rest never taken for the next answer


def test_nan_is_refused_before_anything_is_sent(echo: EchoServer) -> None:
    with pytest.raises(ValueError):
        JsonClient(echo.url).request("PUT", "/x", {"gpuMinutes": float("nan")})
    assert echo.connections == set()


def test_connection_refused_says_nothing_listens_there() -> None:
    port = free_port()
    with pytest.raises(Unreachable) as caught:
        JsonClient(f"http://127.0.0.1:{port}").request("GET", "/")
    assert str(caught.value) == f"connection refused by 127.0.0.1:{port}: is the server running there?"


def test_a_host_name_that_does_not_resolve_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_such_name(*args: object, **kwargs: object) -> None:  # no DNS query leaves the machine
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    with pytest.raises(Unreachable) as caught:
        JsonClient("http://timekeeper.example:8080").request("GET", "/")
    assert (
        str(caught.value)
        == "the host name 'timekeeper.example' does not resolve: check the URL http://timekeeper.example:8080"
    )


def test_a_server_that_does_not_answer_is_a_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts connections (the backlog), never answers
        port = silent.getsockname()[1]
        with pytest.raises(Unreachable) as caught:
            JsonClient(f"http://127.0.0.1:{port}").request("GET", "/", timeout=0.2)
    assert str(caught.value) == f"no answer from 127.0.0.1:{port} within 0.2 s"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": "the bearer token is not known"}', "the bearer token is not known"),
        (b'{"message": "token is not this pod\'s", "x": 1}', "token is not this pod's"),
        (b"<html>\n  Bad   Gateway\n</html>", "<html> Bad Gateway </html>"),
        (b"x" * 1000, "x" * 300),
    ],
)
def test_the_servers_own_words_are_one_line(body: bytes, message: str) -> None:
    assert Answer(400, "Bad Request", body).message == message
