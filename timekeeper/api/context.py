"""What every view of the timekeeper's API shares: the services of this process, who is calling, the JSON body, and
waking the controller when a change crossed a state."""

from __future__ import annotations

import logging
from typing import Any

from flask import Response, current_app, jsonify, request

from gpusharing.contract import TIMEKEEPER_TOKEN_HEADER, BudgetState
from gpusharing.serving.jsonbody import JsonBodyError, read_json
from timekeeper.auth import Caller
from timekeeper.budgets.status import BudgetStatus
from timekeeper.services import Services

log = logging.getLogger(__name__)

SERVICES = "timekeeper"  # the app.extensions key of the process's Services


def services() -> Services:
    return current_app.extensions[SERVICES]


def caller() -> Caller:
    """The authenticated caller (Unauthenticated: a 401)."""
    return services().auth.caller(request.headers.get("Authorization") or request.headers.get(TIMEKEEPER_TOKEN_HEADER))


def reader(scope: str | None) -> Caller:
    """The caller, who must be allowed to read `scope`: a namespace, a group budget, or (None) every namespace (a
    403)."""
    who = caller()
    services().auth.check_read(who, scope)
    return who


def admin() -> Caller:
    """The caller, who must be a budget admin (Forbidden: a 403)."""
    who = caller()
    services().auth.check_admin(who)
    return who


def body() -> Any:
    if not request.is_json:
        raise JsonBodyError("the body is not JSON (Content-Type: application/json)")
    return read_json(request.get_data(cache=False))


def status_json(status: BudgetStatus) -> Response:
    """A budget's status as the API answers a read or a change of it: the listing's entry, with its band's detail."""
    return jsonify(services().listed([status], detail=True)[0].to_json())


def crossing(crossed: bool, status: BudgetStatus, cause: str) -> None:
    """Logs a change that took a namespace over its budget (the controller acts on it on its next `budgets` run)."""
    if crossed and status.state is BudgetState.OVER_BUDGET:
        log.info("namespace %s went over its GPU budget: %s", status.namespace, cause,
                 extra={"namespace": status.namespace, "state": str(status.state)})
