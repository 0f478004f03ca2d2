"""The stack's ceiling, for the benchmarks that measure a service beside it: a Flask app that reads each request
and returns a fixed answer, served through gpusharing/serving/server.py with the service's own settings, so that
what it serves is what any app on that stack could, were its own work free."""

from __future__ import annotations

from flask import Flask, Response, request


def fixed_answer_app(path: str, answer: bytes) -> Flask:
    """POST `path` reads the body and returns `answer`; GET /readyz for the start."""
    app = Flask("fixed_answer")

    @app.post(path)
    def fixed() -> Response:
        request.get_data(cache=False)
        return Response(answer, content_type="application/json")

    @app.get("/readyz")
    def readyz() -> Response:
        return Response(b"ok", content_type="text/plain")

    return app
