"""Probes and Prometheus: `/livez`, `/readyz` (the database reachable and its schema at this version), `/metrics`."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from gpusharing.serving.metrics import render_metrics
from timekeeper.api.context import caller, services
from timekeeper.database.schema import schema_problem

blueprint = Blueprint("health", __name__)


@blueprint.get("/livez")
def livez() -> Response:
    return jsonify(status="ok")


@blueprint.get("/readyz")
def readyz() -> tuple[Response, int]:
    problem = schema_problem(services().database.engine, services().schema_head)
    if problem:
        return jsonify(status="unready", reason=problem), 503
    return jsonify(status="ok"), 200


@blueprint.get("/metrics")
def prometheus() -> Response:
    if services().config.metrics_auth == "token":
        caller()
    payload, content_type = render_metrics(services().collector)
    return Response(payload, content_type=content_type)
