"""The timekeeper's app factory: it builds the services and registers the API; the views live in timekeeper.api."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from flask import Flask, Response, g, request

from gpusharing.clock import Clock
from gpusharing.serving.metrics import series
from gpusharing.serving.server import ON_STOP
from timekeeper import metrics
from timekeeper.api import register_api
from timekeeper.api.context import SERVICES
from timekeeper.api.reports import ReportRoutes
from timekeeper.config import TimekeeperConfig
from timekeeper.services import build_services

if TYPE_CHECKING:
    from timekeeper.cluster.kube import KubeApi


def create_app(
    config: TimekeeperConfig | None = None,
    kube: KubeApi | None = None,
    clock: Clock | None = None,
) -> Flask:
    """The app of the web replicas; `kube` defaults to TIMEKEEPER_KUBECONFIG, KUBECONFIG or the in-cluster API (for
    TokenReviews and SubjectAccessReviews), `clock` to the database's time (TIMEKEEPER_CLOCK in tests). Safe
    admission's commitments are read from what the controller publishes; the cluster work is the controller's
    process (timekeeper.cluster.manager)."""
    services = build_services(config or TimekeeperConfig.from_env(), kube, clock)
    app = Flask("timekeeper")
    app.extensions.update({SERVICES: services, ON_STOP: services.on_stop()}, ledger=services.ledger,
                          reports=services.reports, database=services.database)
    app.before_request(_start_clock)
    app.after_request(_observe)
    register_api(app)
    # Meter reports are answered ahead of Flask's per-request machinery (timekeeper.api.reports).
    app.wsgi_app = ReportRoutes(app, app.wsgi_app, services)  # type: ignore[method-assign]
    return app


def _start_clock() -> None:
    g.started = time.perf_counter()


def _observe(response: Response) -> Response:
    rule = request.url_rule.rule if request.url_rule else "unmatched"
    series(metrics.LATENCY, rule).observe(time.perf_counter() - g.get("started", time.perf_counter()))
    return response
