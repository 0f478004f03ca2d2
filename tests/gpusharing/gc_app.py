"""A Flask app that tells how its worker's garbage collector is set, and which worker it is; and answers of each
framing: a body of known length, a streamed one (chunked), none (for test_serving)."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

from flask import Flask, Response, jsonify

ANSWER = b"".join(b"%05d " % i for i in range(700))  # about 4 KB, as an AdmissionReview's answer with its patch
STREAMED = (b"first part ", b"second part ", b"last part")


def create_app() -> Flask:
    app = Flask("gc-probe")

    @app.get("/gc")
    def collector() -> Response:
        return jsonify(thresholds=list(gc.get_threshold()), frozen=gc.get_freeze_count(), pid=os.getpid(),
                       metricsDir=os.environ.get("PROMETHEUS_MULTIPROC_DIR"))

    @app.post("/answer")
    def answer() -> Response:
        return Response(ANSWER, content_type="text/plain")

    @app.get("/streamed")
    def streamed() -> Response:
        def parts() -> Iterator[bytes]:
            yield from STREAMED

        return Response(parts(), content_type="text/plain")

    @app.get("/nothing")
    def nothing() -> tuple[str, int]:
        return "", 204

    return app
