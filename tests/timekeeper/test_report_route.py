"""Meter reports answered ahead of Flask (timekeeper.api.reports.ReportRoutes) exactly as Flask answers them: each
status, header and byte of the body, on every refusal as on every outcome."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from hypothesis import given
from hypothesis import strategies as st
from werkzeug.test import Client, TestResponse

from tests.timekeeper.conftest import ADMIN, METER, READER, AppFactory
from tests.timekeeper.test_fuzz import reports
from timekeeper.api.reports import ReportRoutes

PATH = "/api/v1/reports"


def _report(pod: str, seq: int, gpu_seconds: float, **extra: Any) -> bytes:
    return json.dumps({"podUid": f"uid-{pod}", "namespace": "team-a", "pod": pod, "gpuShare": 0.5, "seq": seq,
                       "gpuSeconds": gpu_seconds, **extra}).encode()


# (headers, the body of pod POD's report): one after the other, so that each pod's ledger moves alike on both paths.
CASES: list[tuple[dict[str, str], Any]] = [
    ({"Authorization": f"Bearer {METER}"}, lambda pod: _report(pod, 1, 30.0)),
    ({"Authorization": f"Bearer {METER}"}, lambda pod: _report(pod, 1, 30.0)),  # a retry: duplicate
    ({"Authorization": f"Bearer {METER}"}, lambda pod: _report(pod, 2, 10.0)),  # regressed
    ({"X-Timekeeper-Authorization": f"Bearer {METER}"}, lambda pod: _report(pod, 3, 60.5, gpuUtilizationPercent=7)),
    ({"Authorization": f"bearer  {ADMIN} "}, lambda pod: _report(pod, 4, 61.25)),
    ({"Authorization": f"Bearer {METER}", "Content-Type": "application/merge-patch+json"},
     lambda pod: _report(pod, 5, 62.0)),
    ({"Authorization": f"Bearer {METER}", "Content-Type": "Application/JSON; charset=utf-8"},
     lambda pod: _report(pod, 6, 63.0)),
    ({}, lambda pod: _report(pod, 7, 64.0)),
    ({"Authorization": "Bearer nobody-knows-me"}, lambda pod: _report(pod, 7, 64.0)),
    ({"Authorization": "Basic abc"}, lambda pod: _report(pod, 7, 64.0)),
    ({"Authorization": f"Bearer {READER}"}, lambda pod: _report(pod, 7, 64.0)),
    ({"Authorization": f"Bearer {METER}", "Content-Type": "text/plain"}, lambda pod: _report(pod, 7, 64.0)),
    ({"Authorization": f"Bearer {METER}"}, lambda pod: b'{"podUid": '),
    ({"Authorization": f"Bearer {METER}"}, lambda pod: b"[" * 200 + b"]" * 200),
    ({"Authorization": f"Bearer {METER}"}, lambda pod: b'{"a": 1, "a": 2}'),
    ({"Authorization": f"Bearer {METER}"}, lambda pod: _report(pod, 7, 64.0, colour="blue")),
    ({"Authorization": f"Bearer {METER}"}, lambda pod: _report(pod, 7, -1.0)),
    ({"Authorization": f"Bearer {METER}"}, lambda pod: _report(pod, 7, 64.0).replace(b"team-a", b"Team_A")),
    ({"Authorization": f"Bearer {METER}"}, lambda pod: _report(pod, 8, 64.0, final=True)),
    ({"Authorization": f"Bearer {METER}"}, lambda pod: _report(pod, 9, 65.0)),  # after the final report
    ({"Authorization": f"Bearer {METER}"}, lambda pod: b" " * (64 * 1024 + 1)),  # over the bound: Flask's 413 both
]


def _post(client: Client, headers: dict[str, str], body: bytes) -> TestResponse:
    return client.post(PATH, data=body, headers={"Content-Type": "application/json", **headers})


def _seen(response: TestResponse) -> tuple[int, str | None, str | None, bytes]:
    return (response.status_code, response.headers.get("Content-Type"), response.headers.get("WWW-Authenticate"),
            response.get_data())


def _clients(app: Flask) -> tuple[Client, Client]:
    routes = app.wsgi_app
    assert isinstance(routes, ReportRoutes)
    return Client(app), Client(routes.wsgi_app)  # ahead of Flask, and Flask's own


def test_a_report_ahead_of_flask_is_answered_as_flask_answers_it(app: Flask) -> None:
    ahead, flask = _clients(app)
    for headers, body in CASES:
        assert _seen(_post(ahead, headers, body("ahead"))) == _seen(_post(flask, headers, body("flask"))), headers


def test_what_is_rare_is_left_to_flask(app: Flask) -> None:
    ahead, flask = _clients(app)
    for path, method in ((PATH + "/", "POST"), (PATH, "GET"), (PATH, "PUT")):
        assert _seen(ahead.open(path, method=method)) == _seen(flask.open(path, method=method))
    # A Content-Length of more digits than int() reads.
    long = {"CONTENT_LENGTH": "0" * 5000 + "2", "HTTP_AUTHORIZATION": f"Bearer {METER}"}
    assert (_seen(ahead.post(PATH, data=b"{}", content_type="application/json", environ_overrides=long))
            == _seen(flask.post(PATH, data=b"{}", content_type="application/json", environ_overrides=long)))
    # A chunked body is Flask's to read (here, outside a server that ends the stream, Flask reads none: a 400).
    chunked = {"Authorization": f"Bearer {METER}", "Transfer-Encoding": "chunked"}
    assert _seen(_post(ahead, chunked, _report("c", 1, 30.0))) == _seen(_post(flask, chunked, _report("c", 1, 30.0)))


@pytest.mark.parametrize("failure", [RuntimeError("a bug"), TimeoutError()])
def test_a_failure_ahead_of_flask_is_answered_by_the_apps_handlers(app: Flask, failure: Exception,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: Any) -> None:
        raise failure

    monkeypatch.setattr(app.extensions["reports"], "submit", fail)
    ahead, flask = _clients(app)
    answers = [_seen(_post(client, {"Authorization": f"Bearer {METER}"}, _report("p", 1, 1.0)))
               for client in (ahead, flask)]
    assert answers[0] == answers[1]
    assert answers[0][0] == (500 if isinstance(failure, RuntimeError) else 503)


@pytest.fixture
def twin(make_app: AppFactory, sqlite_template: Path, tmp_path: Path) -> Flask:
    """A second timekeeper on a database of its own, which Flask alone answers."""
    path = tmp_path / "twin.sqlite"
    shutil.copyfile(sqlite_template, path)
    return make_app(database_url=f"sqlite:///{path}")


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@given(body=reports(), token=st.sampled_from([METER, METER, METER, READER, "unknown"]))
def test_any_report_is_answered_ahead_of_flask_as_flask_answers_it(app: Flask, twin: Flask, body: str,
                                                                   token: str) -> None:
    # The same reports, one after the other, to two timekeepers alike but for the path that answers them.
    ahead, flask = _clients(app)[0], _clients(twin)[1]
    data, headers = body.encode("utf-8", "surrogatepass"), {"Authorization": f"Bearer {token}"}
    assert _seen(_post(ahead, headers, data)) == _seen(_post(flask, headers, data))
