"""Meter reports (`POST /api/v1/reports`): each accounted exactly once, refused with the reason when it may not be.

A report is served ahead of Flask (`ReportRoutes`, which `create_app` puts in front of the app): Flask's request and
response objects, context and URL matching cost a report as much as its handling does (docs/development.md, the
timekeeper's ingest). Flask still serves what is rare: a report without a Content-Length or with a chunked body, one
over the bound (413), another method (405), every other path; and every refusal is answered by the app's own error
handlers (timekeeper.api.errors), so that each status and message is one and the same on both paths.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING

from flask import Blueprint, Flask, Response, request
from werkzeug.http import parse_options_header

from gpusharing.contract import TIMEKEEPER_TOKEN_HEADER
from gpusharing.report import MeterReport, ReportError
from gpusharing.serving.jsonbody import JsonBodyError, read_json
from gpusharing.serving.metrics import series
from gpusharing.serving.server import stated_length
from gpusharing.units.weights import MICROS_PER_SECOND
from timekeeper import metrics
from timekeeper.api.context import crossing, services
from timekeeper.api.errors import MAX_BODY_BYTES
from timekeeper.auth import Forbidden, Unauthenticated
from timekeeper.database.accounting.charging import ReportResult
from timekeeper.services import Services

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger(__name__)

PATH = "/api/v1/reports"
blueprint = Blueprint("reports", __name__, url_prefix=PATH)
_TOKEN_KEY = "HTTP_" + TIMEKEEPER_TOKEN_HEADER.upper().replace("-", "_")  # as Werkzeug reads the header
_REFUSALS = {Unauthenticated: "unauthenticated", Forbidden: "forbidden"}


@blueprint.post("")
def post_report() -> Response:
    """What ReportRoutes leaves to Flask: a body of no stated length, or too long (Flask's 413 when it is read)."""
    answer = report(services(), request.headers.get("Authorization") or request.headers.get(TIMEKEEPER_TOKEN_HEADER),
                    request.is_json, lambda: request.get_data(cache=False))
    return Response(answer, mimetype="application/json")


def report(services: Services, authorization: str | None, is_json: bool, read_body: Callable[[], bytes]) -> bytes:
    """One report, accounted: the answer's body; raises what the app's error handlers answer (the caller's, the
    body's, the report's, the ledger's and the database's refusals). `read_body` is called once the caller is known."""
    outcome = "rejected"
    report: MeterReport | None = None
    try:
        who = services.auth.caller(authorization)
        if not is_json:
            raise JsonBodyError("the body is not JSON (Content-Type: application/json)")
        report = MeterReport.from_json(read_json(read_body()))
        result = services.reports.submit(report, services.auth.report_terms(who, report))
        outcome = result.outcome.value
    except (Unauthenticated, Forbidden, ReportError) as refused:
        outcome = _REFUSALS.get(type(refused), "rejected")
        # The pod and namespace only once the report parsed: before, they are whatever a client sent.
        fields = {"decision": outcome} | ({"namespace": report.namespace, "pod": report.pod} if report else {})
        log.warning("report refused (%s): %s", outcome, refused, extra=fields)
        raise
    finally:
        series(metrics.REPORTS, outcome).inc()
    if log.isEnabledFor(logging.DEBUG):
        log.debug("report %d of pod %s/%s: %s", report.seq, report.namespace, report.pod, outcome,
                  extra={"namespace": report.namespace, "pod": report.pod, "decision": outcome})
    crossing(result.crossed, result.status, f"the report of pod {report.pod}")
    return answer(result)


def answer(result: ReportResult) -> bytes:
    """`result.to_json()` as Flask's jsonify writes it (keys sorted, compact, ASCII, a newline), byte for byte: its
    strings escaped by json's own function, its floats written by `float.__repr__` as json writes a finite float."""
    return b'{"billedGpuSeconds":%s,"chargedGpuSeconds":%s,"namespace":%s,"outcome":%s,"state":%s}\n' % (
        repr(result.billed_micro_gpu_seconds / MICROS_PER_SECOND).encode(),
        repr(result.charged_micro_gpu_seconds / MICROS_PER_SECOND).encode(),
        encode_basestring_ascii(result.status.namespace).encode(),
        encode_basestring_ascii(str(result.outcome)).encode(),
        encode_basestring_ascii(str(result.status.state)).encode(),
    )


def is_json(content_type: str | None) -> bool:
    """Werkzeug's `Request.is_json` of a Content-Type."""
    if content_type == "application/json":
        return True
    mimetype = parse_options_header(content_type)[0].lower()
    return mimetype == "application/json" or (mimetype.startswith("application/") and mimetype.endswith("+json"))


class ReportRoutes:
    """WSGI: `POST /api/v1/reports` with a Content-Length within the bound and no other framing, answered here; any
    other request goes to the Flask app's own WSGI callable. A refusal is answered by the app's error handlers, in a
    request context made for it alone."""

    def __init__(self, app: Flask, wsgi_app: WSGIApplication, services: Services):
        self.app = app
        self.wsgi_app = wsgi_app
        self.services = services

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        length = stated_length(environ, MAX_BODY_BYTES) if environ.get("PATH_INFO") == PATH else None
        if length is None or environ.get("REQUEST_METHOD") != "POST":
            return self.wsgi_app(environ, start_response)
        started = time.perf_counter()
        stream = environ["wsgi.input"]
        try:
            body = report(self.services, environ.get("HTTP_AUTHORIZATION") or environ.get(_TOKEN_KEY),
                          is_json(environ.get("CONTENT_TYPE")), lambda: stream.read(length))
        except Exception as refused:  # noqa: BLE001  (every refusal, and a bug, as the app's error handlers answer)
            with self.app.request_context(environ):
                response = self.app.make_response(self.app.handle_user_exception(refused))
            series(metrics.LATENCY, PATH).observe(time.perf_counter() - started)
            return response(environ, start_response)
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        series(metrics.LATENCY, PATH).observe(time.perf_counter() - started)
        return [body]
