from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from demo.jsonhttp import QuietServer, reply_json
from webhook.api.callers import Callers
from webhook.app import create_app
from webhook.caches.budgets import BudgetStateCache
from webhook.config import WebhookConfig

API_SERVER_USER = "system:serviceaccount:gpusharing-system:gpusharing-apiserver"
API_SERVER_TOKEN = "the-api-servers-token"


def api_server_callers() -> Callers:
    """Client authentication by token, with a TokenReview that knows the API server's token and a tenant's."""
    users = {API_SERVER_TOKEN: API_SERVER_USER, "a-tenants-token": "system:serviceaccount:ml-team:default"}
    return Callers(token_users=frozenset({API_SERVER_USER}), review=users.get)


def as_api_server(app: Flask) -> FlaskClient:
    """A test client that presents the API server's token, as its AdmissionConfiguration's kubeconfig would."""
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {API_SERVER_TOKEN}"
    return client


class FakeTimekeeper:
    """The timekeeper's `GET /api/v1/budgets` and `POST /api/v1/reservations`, over real HTTP on loopback; `items`,
    `default`, `up`, and the reservations' `reservation` (status and answer) and `delay` are set by tests."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.default: dict[str, Any] | None = None  # None: a timekeeper from before the listing told its default
        self.up = True
        self.reservation: tuple[int, Any] = (200, {"granted": True, "uncommitted": None})
        self.delay = 0.0
        self.authorizations: list[str | None] = []
        self.bodies: list[Any] = []
        self.polls: list[dict[str, str]] = []  # each poll's query: the webhook's name and the listing it holds
        self.listed_at = 0.0  # each listing's stamp, one more than the last's
        self.extra: dict[str, Any] = {}  # more of the listing (fair share's bands)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.authorizations.append(self.headers.get("Authorization"))
                if not fake.up:
                    self.send_response(503)
                    self.end_headers()
                    return
                path, _, query = self.path.partition("?")
                fake.polls.append({key: values[0] for key, values in urllib.parse.parse_qs(query).items()})
                fake.listed_at += 1
                listing = {
                    "items": fake.items,
                    "listedAt": fake.listed_at,
                    **({} if fake.default is None else {"default": fake.default}),
                    **fake.extra,
                }
                reply_json(self, 200 if path == "/api/v1/budgets" else 404, listing)

            def do_POST(self) -> None:
                fake.authorizations.append(self.headers.get("Authorization"))
                fake.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                time.sleep(fake.delay)
                reply_json(self, *fake.reservation)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def set_states(self, **states: str) -> None:
        self.items = [{"namespace": ns.replace("_", "-"), "state": state} for ns, state in states.items()]


@pytest.fixture
def timekeeper() -> Iterator[FakeTimekeeper]:
    fake = FakeTimekeeper()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture
def config() -> WebhookConfig:
    return WebhookConfig(allowed_priority_classes=frozenset({"research-high"}))


@pytest.fixture
def budgets(timekeeper: FakeTimekeeper) -> BudgetStateCache:
    timekeeper.set_states(ml_team="in-budget", greedy="over-budget")
    cache = BudgetStateCache(timekeeper.url)
    assert cache.refresh()
    return cache


@pytest.fixture
def client(config: WebhookConfig, budgets: BudgetStateCache) -> FlaskClient:
    """The webhook as the API server calls it: with client authentication, and so with the budgets' figures."""
    return as_api_server(create_app(config, budgets, callers=api_server_callers()))
