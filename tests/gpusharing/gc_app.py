"""A Flask app that tells how its worker's garbage collector is set, and which worker it is (for test_serving)."""

from __future__ import annotations

import gc
import os

from flask import Flask, jsonify


def create_app() -> Flask:
    app = Flask("gc-probe")

    @app.get("/gc")
    def collector() -> object:
        return jsonify(thresholds=list(gc.get_threshold()), frozen=gc.get_freeze_count(), pid=os.getpid(),
                       metricsDir=os.environ.get("PROMETHEUS_MULTIPROC_DIR"))

    return app
