"""The webhook's HTTP layer: AdmissionReview over POST /mutate and /validate, health and metrics."""

from __future__ import annotations

import logging
import time
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from gpusharing.metrics import render_metrics
from webhook import metrics
from webhook.admission import BadReview, Decision, parse_review, review_response
from webhook.budget import BudgetStateCache
from webhook.config import WebhookConfig
from webhook.policy import admit

log = logging.getLogger(__name__)


def create_app(config: WebhookConfig | None = None, budgets: BudgetStateCache | None = None) -> Flask:
    config = config or WebhookConfig.from_env()
    if budgets is None:
        budgets = BudgetStateCache(
            config.timekeeper_url, config.timekeeper_token_file, config.budget_refresh_seconds, metrics.record_budget_refresh
        )
        budgets.start()
    app = Flask("webhook")
    app.config["GPUSHARING"] = config
    app.extensions["budgets"] = budgets

    def review(endpoint: str, mutate: bool) -> tuple[Response, int]:
        started = time.perf_counter()
        try:
            admission = parse_review(request.get_json(force=True, silent=True))
        except BadReview as exc:
            metrics.BAD_REVIEWS.labels(endpoint).inc()
            log.warning("refused a body on /%s that is not an AdmissionReview: %s", endpoint, exc,
                        extra={"endpoint": endpoint, "decision": "bad-review"})
            return jsonify(error=f"not an AdmissionReview: {exc}"), 400
        fields = {"request_id": admission.uid, "namespace": admission.namespace, "pod": _pod_name(admission.object),
                  "operation": admission.operation, "endpoint": endpoint}
        try:
            decision = admit(admission, config, budgets.state_of, mutate)
        except Exception:  # a bug must not become a 500 the API server shows as a cryptic failure
            log.exception("could not decide on %s %s", admission.operation, admission.uid, extra=fields)
            decision = Decision.deny(400, "the GPU-sharing webhook could not read this pod; see the webhook's log")
        outcome = "allowed" if decision.allowed else "denied"
        metrics.ADMISSIONS.labels(endpoint, admission.operation, outcome, decision.dialect).inc()
        fields.update(decision=outcome, dialect=decision.dialect)
        if not decision.allowed:
            log.info("denied %s of pod %s/%s: %s", admission.operation, fields["namespace"], fields["pod"], decision.message,
                     extra=fields)
        elif decision.warnings:  # demoted: its namespace is over budget
            log.info("admitted pod %s/%s demoted: %s", fields["namespace"], fields["pod"], decision.warnings[0], extra=fields)
        elif decision.patch:
            log.debug("admitted pod %s/%s (%s)", fields["namespace"], fields["pod"], decision.dialect, extra=fields)
        metrics.LATENCY.labels(endpoint).observe(time.perf_counter() - started)
        return jsonify(review_response(admission, decision)), 200

    @app.post("/mutate")
    def mutate() -> tuple[Response, int]:
        return review("mutate", mutate=True)

    @app.post("/validate")
    def validate() -> tuple[Response, int]:
        return review("validate", mutate=False)

    @app.get("/livez")
    def livez() -> tuple[Response, int]:
        return jsonify(status="ok"), 200

    @app.get("/readyz")
    def readyz() -> tuple[Response, int]:
        # Ready without the timekeeper: budget states are a cache, and unknown namespaces are admitted in budget.
        return jsonify(status="ok"), 200

    @app.get("/metrics")
    def prometheus() -> Response:
        body, content_type = render_metrics()
        return Response(body, content_type=content_type)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> tuple[Response, int]:
        return jsonify(error=exc.description), exc.code or 500

    return app


def _pod_name(pod: dict[str, Any] | None) -> str:
    metadata = (pod or {}).get("metadata") or {}
    return str(metadata.get("name") or metadata.get("generateName") or "?")
