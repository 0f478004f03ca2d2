"""The stack's ceiling, for the benchmarks that measure a service beside it: a Flask app that reads each request
and returns a fixed answer, served through gpusharing/serving/server.py with the service's own settings, so that
what it serves is what any app on that stack could, were its own work free."""

from __future__ import annotations

from collections.abc import Callable

from flask import Flask, Response, request


def fixed_answer_app(path: str, answer: bytes, handle: Callable[[bytes], bytes] | None = None) -> Flask:
    """POST `path` reads the body and returns `answer` (with `handle`: what it returns for the body); GET /readyz for
    the start."""
    app = Flask("fixed_answer")

    @app.post(path)
    def fixed() -> Response:
        body = request.get_data(cache=False)
        return Response(answer if handle is None else handle(body), content_type="application/json")

    @app.get("/readyz")
    def readyz() -> Response:
        return Response(b"ok", content_type="text/plain")

    return app
