"""Every refusal as JSON with the status it deserves; a bug is logged here, never a traceback in the answer."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout

from flask import Flask, Response, jsonify, request
from sqlalchemy.exc import SQLAlchemyError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from gpusharing.names import InvalidName
from gpusharing.report import ReportError
from gpusharing.serving.jsonbody import JsonBodyError
from gpusharing.usage_report import UsageRequestError
from timekeeper.auth import Forbidden, Unauthenticated
from timekeeper.budgets.requests import BudgetRequestError
from timekeeper.chargeback.export import ExportConflict
from timekeeper.cluster.objects import KubeUnavailable
from timekeeper.database.budgets.reservations import AdmissionIdTaken, Uncountable
from timekeeper.database.budgets.store import HierarchyConflict, Managed, NoBudget, NoLimit
from timekeeper.database.cluster.listings import ListingQueryError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
BAD_REQUESTS: tuple[type[Exception], ...] = (
    ReportError,
    UsageRequestError,
    BudgetRequestError,
    InvalidName,
    JsonBodyError,
    ListingQueryError,
)
CONFLICTS: tuple[type[Exception], ...] = (NoLimit, Managed, HierarchyConflict, AdmissionIdTaken, ExportConflict)


def register_error_handlers(app: Flask) -> None:
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    for kind in BAD_REQUESTS:
        app.register_error_handler(kind, _answer(400))
    for kind in CONFLICTS:
        app.register_error_handler(kind, _answer(409))
    app.register_error_handler(NoBudget, _answer(404))
    app.register_error_handler(Forbidden, _answer(403))
    app.register_error_handler(Unauthenticated, _unauthenticated)
    app.register_error_handler(RequestEntityTooLarge, _too_large)
    app.register_error_handler(KubeUnavailable, _kube_unavailable)
    app.register_error_handler(Uncountable, _answer(503))
    app.register_error_handler(FutureTimeout, _ledger_busy)
    app.register_error_handler(SQLAlchemyError, _database_unavailable)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected)


def _answer(status: int) -> Callable[[Exception], tuple[Response, int]]:
    def handler(exc: Exception) -> tuple[Response, int]:
        return jsonify(error=str(exc)), status
    return handler


def _unauthenticated(exc: Unauthenticated) -> tuple[Response, int, dict[str, str]]:
    return jsonify(error=str(exc)), 401, {"WWW-Authenticate": 'Bearer realm="gpusharing-timekeeper"'}


def _too_large(exc: RequestEntityTooLarge) -> tuple[Response, int]:
    return jsonify(error=f"the body is larger than the {request.max_content_length} bytes the timekeeper reads"), 413


def _kube_unavailable(exc: KubeUnavailable) -> tuple[Response, int]:
    return jsonify(error=f"the Kubernetes API is unavailable, try again: {exc}"), 503


def _ledger_busy(exc: FutureTimeout) -> tuple[Response, int]:
    return jsonify(error="the ledger is busy, try again (a retried report is never counted twice)"), 503


def _database_unavailable(exc: SQLAlchemyError) -> tuple[Response, int]:
    log.error("database error: %s", exc)
    return jsonify(error="the database is unavailable, try again"), 503


def _http_error(exc: HTTPException) -> tuple[Response, int]:
    return jsonify(error=exc.description), exc.code or 500


def _unexpected(exc: Exception) -> tuple[Response, int]:  # a bug
    log.exception("unexpected error on %s %s", request.method, request.path)
    return jsonify(error="internal error; see the timekeeper's log"), 500
