"""A Flask app that tells how its worker's garbage collector is set (for test_serving)."""

from __future__ import annotations

import gc

from flask import Flask, jsonify


def create_app() -> Flask:
    app = Flask("gc-probe")

    @app.get("/gc")
    def collector() -> object:
        return jsonify(thresholds=list(gc.get_threshold()), frozen=gc.get_freeze_count())

    return app
