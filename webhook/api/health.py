"""Probes and Prometheus: `/livez`, `/readyz`, `/metrics`."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from gpusharing.serving.metrics import render_metrics

blueprint = Blueprint("health", __name__)


@blueprint.get("/livez")
def livez() -> tuple[Response, int]:
    return jsonify(status="ok"), 200


@blueprint.get("/readyz")
def readyz() -> tuple[Response, int]:
    # Ready without the timekeeper: budget states are a cache, and unknown namespaces are admitted in budget.
    return jsonify(status="ok"), 200


@blueprint.get("/metrics")
def prometheus() -> Response:
    body, content_type = render_metrics()
    return Response(body, content_type=content_type)
