"""Budgets: list, read, set, patch, remove, top up, and the audit log of their changes (`/api/v1/budgets`)."""

from __future__ import annotations

import logging

from flask import Blueprint, Response, jsonify, request

from gpusharing.names import check_budget_name
from timekeeper.api.context import admin, body, crossing, reader, services, status_json
from timekeeper.auth import Caller
from timekeeper.budgets.requests import budget_changes_from_json, budget_from_json, top_up_from_json
from timekeeper.budgets.status import BudgetStatus
from timekeeper.database.budgets.store import BudgetChange

log = logging.getLogger(__name__)

blueprint = Blueprint("budgets", __name__, url_prefix="/api/v1/budgets")


@blueprint.get("")
def list_budgets() -> Response:
    who = reader(None)
    webhook = request.args.get("webhook")
    if webhook is not None:  # what it holds in force holds evictions back: only the webhook's own say counts
        services().auth.check_reserver(
            who, "name itself as a webhook process (what it holds in force holds evictions back)"
        )
    # Stamped before it is read: the listing shows every change committed before listedAt.
    listed_at = services().webhooks.poll(webhook, request.args.get("inForce"), request.args.get("refreshSeconds"))
    return jsonify(services().listing(listed_at).to_json())


@blueprint.get("/<name>")
def get_budget(name: str) -> Response:
    reader(check_budget_name(name))
    return status_json(services().budgets.status(name))


@blueprint.put("/<name>")
def put_budget(name: str) -> tuple[Response, int]:
    who = admin()
    budget = budget_from_json(name, body(), services().config.default_period)
    return _answer_change(services().budgets.set_budget(budget, who.name), who)


@blueprint.patch("/<name>")
def patch_budget(name: str) -> tuple[Response, int]:
    who = admin()
    return _answer_change(
        services().budgets.patch_budget(check_budget_name(name), budget_changes_from_json(body()), who.name), who
    )


@blueprint.delete("/<name>")
def delete_budget(name: str) -> Response | tuple[str, int]:
    who = admin()
    status = services().budgets.remove_budget(check_budget_name(name), who.name)
    log.info(
        "%s: budget removed by %s", name, who.name, extra={"namespace": name, "actor": who.name, "action": "removal"}
    )
    if status is None:  # a group: nothing applies in its place
        return "", 204
    crossing(True, status, f"its budget was removed by {who.name}")
    return status_json(status)


@blueprint.post("/<name>/top-ups")
def post_top_up(name: str) -> tuple[Response, int]:
    who = admin()
    gpu_minutes, reason = top_up_from_json(body())
    status = services().budgets.top_up(check_budget_name(name), gpu_minutes, reason, who.name)
    _log_change(f"top-up of {gpu_minutes:g} GPU-minutes ({reason!r})", who, status)
    crossing(True, status, f"a top-up by {who.name}")
    return status_json(status), 201


@blueprint.get("/<name>/changes")
def get_changes(name: str) -> Response:
    reader(check_budget_name(name))
    return jsonify(items=services().budgets.changes(name))


def _answer_change(change: BudgetChange, who: Caller) -> tuple[Response, int]:
    _log_change("set", who, change.status)
    crossing(change.crossed, change.status, f"its budget was set by {who.name}")
    return status_json(change.status), 201 if change.created else 200


def _log_change(action: str, who: Caller, status: BudgetStatus) -> None:
    log.info("namespace %s: budget %s by %s; %s GPU-minutes %s, %s", status.namespace, action, who.name,
             "unlimited" if status.gpu_minutes is None else f"{status.gpu_minutes:g}", status.period, status.state,
             extra={"namespace": status.namespace, "actor": who.name, "action": action, "state": str(status.state)})
