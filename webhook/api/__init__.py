"""The webhook's HTTP API: reviews (`/mutate`, `/validate`) and health (`/livez`, `/readyz`, `/metrics`); a body
too large or a wrong method is answered as JSON, never as an HTML page."""

from __future__ import annotations

from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from webhook.api import health, reviews
from webhook.api.reviews import MAX_REVIEW_BYTES


def register_api(app: Flask) -> None:
    app.config["MAX_CONTENT_LENGTH"] = MAX_REVIEW_BYTES
    app.register_blueprint(reviews.blueprint)
    app.register_blueprint(health.blueprint)
    app.register_error_handler(RequestEntityTooLarge, _too_large)
    app.register_error_handler(HTTPException, _http_error)


def _too_large(exc: RequestEntityTooLarge) -> tuple[Response, int]:
    return jsonify(
        error=f"not an AdmissionReview: the body is larger than the {MAX_REVIEW_BYTES} bytes the webhook reads"
    ), 413


def _http_error(exc: HTTPException) -> tuple[Response, int]:
    return jsonify(error=exc.description), exc.code or 500
