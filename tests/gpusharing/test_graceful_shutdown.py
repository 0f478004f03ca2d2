"""SIGTERM, as the kubelet sends it at the end of a pod's preStop hook: the webhook and the timekeeper stop taking
connections, finish the requests they have (an admission; a report, answered once its batch has committed), and
exit 0. Shown on the real `gpusharing … serve` processes with a request still arriving when the signal comes."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import ssl
import time
from pathlib import Path
from typing import Any

from demo.apiserver import admission_review, example_pod
from demo.processes import Service, free_port, run_command
from gpusharing.serving.certs import make_serving_certificate

STOP_SECONDS = 30  # only stops a broken test from hanging; not a speed check


def begin_request(sock: socket.socket, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """Sends the request line, the headers and half the body; returns the half still to send."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    )
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    half = len(body) // 2
    sock.sendall(head.encode() + body[:half])
    return body[half:]


def takes_the_signal(service: Service) -> None:
    """Waits until gunicorn's arbiter has handled the SIGTERM, which it passes on to its workers at once. (A stopping
    worker keeps its listening socket open until it exits, so a refused connection cannot tell.)"""
    assert service.process is not None
    deadline = time.monotonic() + STOP_SECONDS
    while "Handling signal: term" not in service.log_tail(100_000):
        assert service.process.poll() is None, f"the server exited with a request in flight:\n{service.log_tail()}"
        assert time.monotonic() < deadline, "the server did not take the SIGTERM"
        time.sleep(0.05)


def accepted(sock: socket.socket) -> None:
    """Waits until the server has accepted the connection: its side of it has an inode in /proc/net/tcp (0 while it
    waits in the listen backlog, where a stopping server resets it: not a request in flight yet)."""
    client_port, server_port = sock.getsockname()[1], sock.getpeername()[1]
    deadline = time.monotonic() + STOP_SECONDS
    while True:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
        if any(f[1].endswith(f":{server_port:04X}") and f[2].endswith(f":{client_port:04X}") and f[9] != "0"
               for f in (line.split() for line in lines)):
            return
        assert time.monotonic() < deadline, "the server did not accept the connection"
        time.sleep(0.02)


def finish(sock: socket.socket, rest: bytes) -> tuple[int, Any]:
    sock.sendall(rest)
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, json.loads(response.read())


def terminate_mid_request(service: Service, sock: socket.socket, path: str, body: bytes,
                          headers: dict[str, str] | None = None) -> tuple[int, Any]:
    assert service.process is not None
    rest = begin_request(sock, path, body, headers or {})
    accepted(sock)  # on a loaded host the worker may not have taken it yet: a request in flight is one it took
    service.process.send_signal(signal.SIGTERM)
    takes_the_signal(service)
    answer = finish(sock, rest)
    sock.close()  # else the stopping worker keeps the kept-alive connection open a moment for a next request
    assert service.process.wait(timeout=STOP_SECONDS) == 0
    return answer


def test_the_webhook_finishes_an_admission_in_flight_after_sigterm(tmp_path: Path) -> None:
    paths = make_serving_certificate(["127.0.0.1"]).write(tmp_path / "tls")
    port = free_port()
    args = ["webhook", "serve", "--host", "127.0.0.1", "--port", str(port), "--cert", str(paths["cert"]),
            "--key", str(paths["key"]), "--workers", "1", "--threads", "2"]
    review = admission_review(example_pod("kai-fraction.yaml"))
    with Service(
        "webhook", args, f"https://127.0.0.1:{port}/readyz", verify=str(paths["ca"]), log_path=tmp_path / "log"
    ) as webhook:
        tls = ssl.create_default_context(cafile=str(paths["ca"]))
        with tls.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1") as sock:
            status, answer = terminate_mid_request(webhook, sock, "/mutate", json.dumps(review).encode())
    assert status == 200
    assert answer["response"]["uid"] == review["request"]["uid"] and answer["response"]["allowed"] is True
    assert answer["response"]["patchType"] == "JSONPatch"


def test_the_timekeeper_answers_a_report_in_flight_after_sigterm_once_it_is_committed(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'timekeeper.sqlite'}"
    tokens = tmp_path / "tokens"
    tokens.write_text("meter-token meter\nreader-token reader\n")
    env = {
        "TIMEKEEPER_DATABASE_URL": database,
        "TIMEKEEPER_AUTH": "static",
        "TIMEKEEPER_STATIC_TOKENS_FILE": str(tokens),
    }
    assert run_command("db", "upgrade", env=env).returncode == 0
    port = free_port()
    args = ["timekeeper", "serve", "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--threads", "4"]
    report = {"podUid": "uid-1", "namespace": "team-a", "pod": "train-0", "gpuShare": 0.5, "seq": 1, "gpuSeconds": 90}
    with Service(
        "timekeeper", args, f"http://127.0.0.1:{port}/readyz", env=env, log_path=tmp_path / "log"
    ) as timekeeper:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            status, answer = terminate_mid_request(timekeeper, sock, "/api/v1/reports", json.dumps(report).encode(),
                                                   {"Authorization": "Bearer meter-token"})
    assert (status, answer["outcome"], answer["chargedGpuSeconds"]) == (200, "charged", 90)
    with Service("timekeeper", args, f"http://127.0.0.1:{port}/readyz", env=env, log_path=tmp_path / "log2"):
        again = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        again.request(
            "GET", "/api/v1/budgets/team-a", headers={"Authorization": "Bearer reader-token", "Connection": "close"}
        )
        assert json.loads(again.getresponse().read())["usedGpuMinutes"] == 1.5  # it was committed before the exit
        again.close()
