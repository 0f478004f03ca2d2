"""The pods the ledger has accounted (`GET /api/v1/pods`), filtered by namespace or by memory over what was asked;
what `gpusharing pods` and `gpusharing explain` read."""

from __future__ import annotations

import re

from flask import Blueprint, Response, jsonify, request

from gpusharing.names import check_namespace
from timekeeper.api.context import reader, services
from timekeeper.budgets.requests import BudgetRequestError

MAX_PODS = 10_000

blueprint = Blueprint("pods", __name__, url_prefix="/api/v1/pods")


@blueprint.get("")
def list_pods() -> Response:
    over_memory = _flag(request.args.get("overMemory", "false"), "overMemory")
    namespace = request.args.get("namespace")
    scope = check_namespace(namespace) if namespace else None
    reader(scope)
    limit = _limit(request.args.get("limit", "500"))
    uid = request.args.get("uid")
    if uid is not None and not _UID.fullmatch(uid):
        raise BudgetRequestError("uid must be a pod's UID: 1 to 64 letters, digits and dashes")
    pods = services().ledger.pods(scope, over_memory, limit, uid=uid)
    return jsonify(items=[pod.to_json() for pod in pods])


_UID = re.compile(r"[0-9A-Za-z-]{1,64}")


def _flag(raw: str, name: str) -> bool:
    if raw not in ("true", "false"):
        raise BudgetRequestError(f"{name} must be true or false, not {raw!r}")
    return raw == "true"


def _limit(raw: str) -> int:
    if not re.fullmatch(r"[0-9]{1,6}", raw) or not 1 <= int(raw) <= MAX_PODS:
        raise BudgetRequestError(f"limit must be a whole number from 1 to {MAX_PODS}, not {raw!r}")
    return int(raw)
