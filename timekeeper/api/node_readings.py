"""Node agents' readings (`POST /api/v1/node-readings`): a node's batch of GPU utilisation per pod, taken only from the
node agent of that node and only for the pods bound to it (timekeeper.auth), recorded in one transaction
(timekeeper.database.accounting.readings)."""

from __future__ import annotations

import logging

from flask import Blueprint, Response, jsonify, request

from gpusharing.names import InvalidName
from gpusharing.report import ReportError
from gpusharing.utilisation import NodeReadings, UtilisationSource
from timekeeper import metrics
from timekeeper.api.context import body, caller, services
from timekeeper.auth import Forbidden, Unauthenticated
from timekeeper.database.accounting.readings import RecordedReadings, bound_to_node

log = logging.getLogger(__name__)

blueprint = Blueprint("node_readings", __name__, url_prefix="/api/v1/node-readings")

# A batch holds at most MAX_PODS_PER_NODE readings of at most ~700 bytes each (names at their longest).
MAX_BATCH_BYTES = 1024 * 1024


@blueprint.before_request
def bounded() -> None:
    request.max_content_length = MAX_BATCH_BYTES


@blueprint.post("")
def post_node_readings() -> Response:
    outcome = "rejected"
    try:
        who = caller()
        batch = NodeReadings.from_json(body())
        bound = services().auth.node_pods(who, batch.node)
        kept, ignored = bound_to_node(batch.readings, bound, batch.node)
        ledger = services().ledger
        recorded = services().utilisation.record_utilisation(UtilisationSource.NODE, kept, batch.window_seconds,
                                                             ledger.budgets.clock())
        outcome = "recorded"
    except (Unauthenticated, Forbidden, ReportError, InvalidName) as refused:
        outcome = {Unauthenticated: "unauthenticated", Forbidden: "forbidden"}.get(type(refused), "rejected")
        log.warning("node readings refused (%s): %s", outcome, refused, extra={"decision": outcome})
        raise
    finally:
        metrics.NODE_READINGS.labels(outcome).inc()
    answer = RecordedReadings(recorded.accepted, (*ignored, *recorded.ignored))
    log.debug("node %s: %d readings taken, %d ignored", batch.node, answer.accepted, len(answer.ignored),
              extra={"node": batch.node})
    return jsonify(answer.to_json())
