from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from flask.testing import FlaskClient

from demo.jsonhttp import reply_json
from webhook.app import create_app
from webhook.caches.budgets import BudgetStateCache
from webhook.config import WebhookConfig


class FakeTimekeeper:
    """The timekeeper's `GET /api/v1/budgets`, over real HTTP on loopback; `items`, `default` and `up` are set by tests."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.default: dict[str, Any] | None = None  # None: a timekeeper from before the listing told its default
        self.up = True
        self.authorizations: list[str | None] = []
        self.polls: list[dict[str, str]] = []  # each poll's query: the webhook's name and the listing it holds
        self.listed_at = 0.0  # each listing's stamp, one more than the last's
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                fake.authorizations.append(self.headers.get("Authorization"))
                if not fake.up:
                    self.send_response(503)
                    self.end_headers()
                    return
                path, _, query = self.path.partition("?")
                fake.polls.append({key: values[0] for key, values in urllib.parse.parse_qs(query).items()})
                fake.listed_at += 1
                listing = {"items": fake.items, "listedAt": fake.listed_at, **({} if fake.default is None else {"default": fake.default})}
                reply_json(self, 200 if path == "/api/v1/budgets" else 404, listing)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

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
    return WebhookConfig()


@pytest.fixture
def budgets(timekeeper: FakeTimekeeper) -> BudgetStateCache:
    timekeeper.set_states(ml_team="in-budget", greedy="over-budget")
    cache = BudgetStateCache(timekeeper.url)
    assert cache.refresh()
    return cache


@pytest.fixture
def client(config: WebhookConfig, budgets: BudgetStateCache) -> FlaskClient:
    return create_app(config, budgets).test_client()
