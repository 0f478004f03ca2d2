"""The timekeeper's HTTP API (described in openapi.yaml beside this file): one blueprint per concern, each view a
short function that checks the caller, parses, calls a service and renders.

- budgets: `/api/v1/budgets` (read, set, patch, remove, top up, the audit log)
- reports: `POST /api/v1/reports`, the meters' reports
- node_readings: `POST /api/v1/node-readings`, the node agents' GPU utilisation readings
- pods: `/api/v1/pods`, what the ledger accounted per pod
- usage: `/api/v1/usage`, `/api/v1/gpu-models` and `/api/v1/prices`
- chargeback: `/api/v1/focus`, `/api/v1/utilization` and `/api/v1/accounts`
- reservations: `POST /api/v1/reservations`, safe admission's, made by the webhook
- health: `/livez`, `/readyz`, `/metrics`
- auth: who may call what; errors: every refusal's status; context: what the views share
"""

from __future__ import annotations

from flask import Flask

from timekeeper.api import budgets, chargeback, health, node_readings, pods, reports, reservations, usage
from timekeeper.api.errors import register_error_handlers

BLUEPRINTS = (
    budgets.blueprint,
    reports.blueprint,
    node_readings.blueprint,
    pods.blueprint,
    usage.blueprint,
    chargeback.blueprint,
    reservations.blueprint,
    health.blueprint,
)


def register_api(app: Flask) -> None:
    for blueprint in BLUEPRINTS:
        app.register_blueprint(blueprint)
    register_error_handlers(app)
