"""The timekeeper suite runs against SQLite and PostgreSQL; its HTTP answers are checked against openapi.yaml."""

from __future__ import annotations

import datetime as dt
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from flask import Flask
from flask.testing import FlaskClient
from jsonschema import Draft202012Validator
from sqlalchemy import create_engine, text
from werkzeug.serving import WSGIRequestHandler, make_server

import timekeeper
from demo.kubeapi import FakeKube
from gpusharing.gpu.request import GpuRequestSettings
from testbed.postgres import PostgresServer
from timekeeper.app import create_app
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.manager import ControllerManager, ControllerPass
from timekeeper.cluster.utilisation import UtilisationSink
from timekeeper.config import TimekeeperConfig
from timekeeper.controller import build_controller
from timekeeper.database.schema import upgrade
from timekeeper.database.tables import Base

SPEC = yaml.safe_load((Path(timekeeper.__file__).parent / "api" / "openapi.yaml").read_text())
UTC = dt.timezone.utc
ADMIN, READER, METER = "admin-token", "reader-token", "meter-token"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite") / "template.sqlite"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def postgres_database(postgres: PostgresServer) -> str:
    url = postgres.create_database("timekeeper_suite")
    upgrade(url)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database: a fresh SQLite file, or the suite's PostgreSQL database emptied."""
    if request.param == "sqlite":
        path = tmp_path / "timekeeper.sqlite"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite:///{path}"
    url: str = request.getfixturevalue("postgres_database")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(t.name for t in Base.metadata.sorted_tables)} RESTART IDENTITY"))
    engine.dispose()
    return url


class Clock:
    """The timekeeper's Clock (gpusharing.clock), moved by tests: `at` is the time of day; advance() moves it and the
    monotonic clock together."""

    def __init__(self, at: dt.datetime):
        self.at = at
        self.elapsed = 0.0

    def now(self) -> dt.datetime:
        return self.at

    def monotonic(self) -> float:
        return self.elapsed

    def __call__(self) -> dt.datetime:
        return self.at

    def advance(self, **delta: float) -> None:
        step = dt.timedelta(**delta)
        self.at += step
        self.elapsed += step.total_seconds()


@pytest.fixture
def clock() -> Clock:
    return Clock(dt.datetime(2028, 2, 28, 23, 0, tzinfo=UTC))  # the eve of a leap day


@pytest.fixture
def tokens_file(tmp_path: Path) -> str:
    path = tmp_path / "tokens"
    path.write_text(f"# token role name\n{ADMIN} admin alice\n{READER} reader\n{METER} meter meter-fleet\n")
    return str(path)


@pytest.fixture
def fake_kube() -> Iterator[FakeKube]:
    fake = FakeKube()
    yield fake
    fake.close()


AppFactory = Callable[..., Flask]


@pytest.fixture
def make_app(database_url: str, clock: Clock, tokens_file: str) -> Iterator[AppFactory]:
    """create_app on the test's database; static tokens unless told otherwise."""
    apps: list[Flask] = []

    def make(kube: KubeApi | None = None, **settings: Any) -> Flask:
        if "catalogue" in settings:  # the GPU models, read with the rest of the GPU request's settings
            settings["gpu_request"] = GpuRequestSettings(catalogue=settings.pop("catalogue"))
        config = TimekeeperConfig(
            **{"database_url": database_url, "auth": "static", "static_tokens_file": tokens_file, **settings}
        )
        app = create_app(config, kube=kube, clock=clock)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.extensions["reports"].close()
        app.extensions["database"].dispose()


ControllerFactory = Callable[..., ControllerManager]


@pytest.fixture
def make_controller(database_url: str, clock: Clock) -> Iterator[ControllerFactory]:
    """The controller (its tasks, its caches) on the test's database and clock, against an API (the HTTP fake);
    tests run its tasks with run_controller."""
    managers: list[ControllerManager] = []

    def make(kube: KubeApi, identity: str | None = None, utilisation_sink: UtilisationSink | None = None,
             **settings: Any) -> ControllerManager:
        config = TimekeeperConfig(**{"database_url": database_url, **settings})
        manager = build_controller(config, kube, clock, utilisation_sink)
        if identity is not None:
            manager.election.identity = identity
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        manager.stop()
        manager.budget_sync.budgets.db.dispose()


def run_controller(manager: ControllerManager) -> ControllerPass:
    """Every task of the controller once, on what the API holds now (its caches listed again first)."""
    manager.informers.list_now()
    return manager.run_all()


class SpecClient:
    """A Flask test client whose every JSON answer must match the response openapi.yaml documents for it."""

    def __init__(self, client: FlaskClient, token: str | None = None):
        self.client = client
        self.token = token

    def as_(self, token: str | None) -> "SpecClient":
        return SpecClient(self.client, token)

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> Any:
        return self.request("PUT", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.request("POST", path, **kwargs)

    def patch(self, path: str, **kwargs: Any) -> Any:
        return self.request("PATCH", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Any:
        return self.request("DELETE", path, **kwargs)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = dict(kwargs.pop("headers", {}))
        if self.token is not None:
            headers.setdefault("Authorization", f"Bearer {self.token}")
        response = self.client.open(path, method=method, headers=headers, **kwargs)
        check_against_spec(method, path, response.status_code, response.get_json(silent=True), response.content_type)
        return response


def spec_operation(method: str, path: str) -> dict[str, Any]:
    bare = path.split("?", 1)[0]
    for template, item in SPEC["paths"].items():
        if re.fullmatch(re.sub(r"\{[^/]+\}", "[^/]+", template), bare) and method.lower() in item:
            return item[method.lower()]  # type: ignore[no-any-return]
    raise AssertionError(f"{method} {bare} is not in openapi.yaml")


def check_against_spec(method: str, path: str, status: int, body: Any, content_type: str) -> None:
    responses = spec_operation(method, path)["responses"]
    assert str(status) in responses, f"{method} {path} answered {status}, which openapi.yaml does not document: {body}"
    response = responses[str(status)]
    if "$ref" in response:
        response = SPEC["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    if "content" not in response:  # 204
        assert body is None, f"{method} {path} {status} has a body openapi.yaml does not document: {body}"
        return
    content = response["content"]
    media = content_type.split(";")[0]
    if media != "application/json" or "application/json" not in content:
        assert media in content, f"{method} {path} {status} answered {media}, which openapi.yaml does not document"
        return
    schema = {"$ref": content["application/json"]["schema"].get("$ref", "#/x-inline")}
    document = {**schema, "components": SPEC["components"], "x-inline": content["application/json"]["schema"]}
    errors = sorted(Draft202012Validator(document).iter_errors(body), key=str)
    assert not errors, f"{method} {path} {status} does not match openapi.yaml: {errors[0].message} in {body}"


@pytest.fixture
def app(make_app: AppFactory) -> Flask:
    return make_app()


@pytest.fixture
def api(app: Flask) -> SpecClient:
    """The API as the admin; `api.as_(token)` for anyone else."""
    return SpecClient(app.test_client(), ADMIN)


@contextmanager
def served(app: Flask) -> Iterator[str]:
    """The app over HTTP on loopback (a thread of this process); its base URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_Unlogged)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


class _Unlogged(WSGIRequestHandler):
    disable_nagle_algorithm = True  # the body written after the headers must not wait for a delayed ACK

    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass  # the development server's access lines: nothing a test reads
