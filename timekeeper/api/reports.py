"""Meter reports (`POST /api/v1/reports`): each accounted exactly once, refused with the reason when it may not be."""

from __future__ import annotations

import logging

from flask import Blueprint, Response, jsonify

from gpusharing.report import MeterReport, ReportError
from timekeeper import metrics
from timekeeper.api.context import body, caller, crossing, services
from timekeeper.auth import Forbidden, Unauthenticated

log = logging.getLogger(__name__)

blueprint = Blueprint("reports", __name__, url_prefix="/api/v1/reports")


@blueprint.post("")
def post_report() -> Response:
    outcome = "rejected"
    report: MeterReport | None = None
    try:
        who = caller()
        report = MeterReport.from_json(body())
        result = services().reports.submit(report, services().auth.report_terms(who, report))
        outcome = result.outcome.value
    except (Unauthenticated, Forbidden, ReportError) as refused:
        outcome = {Unauthenticated: "unauthenticated", Forbidden: "forbidden"}.get(type(refused), "rejected")
        # The pod and namespace only once the report parsed: before, they are whatever a client sent.
        fields = {"decision": outcome} | ({"namespace": report.namespace, "pod": report.pod} if report else {})
        log.warning("report refused (%s): %s", outcome, refused, extra=fields)
        raise
    finally:
        metrics.REPORTS.labels(outcome).inc()
    log.debug("report %d of pod %s/%s: %s", report.seq, report.namespace, report.pod, outcome,
              extra={"namespace": report.namespace, "pod": report.pod, "decision": outcome})
    crossing(result.crossed, result.status, f"the report of pod {report.pod}")
    return jsonify(result.to_json())
