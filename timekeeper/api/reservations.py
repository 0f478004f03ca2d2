"""Safe admission's reservations (`POST /api/v1/reservations`): the webhook holds a pod's commitment here, once per
review of a GPU pod with a deadline under safe or strict admission."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from timekeeper.api.context import body, caller, services
from timekeeper.budgets.requests import reservation_from_json
from timekeeper.budgets.reservations import Uncountable

blueprint = Blueprint("reservations", __name__, url_prefix="/api/v1/reservations")

NO_POD_WATCH = "the timekeeper does not follow the cluster's pods (it has no Kubernetes API)"


@blueprint.post("")
def post_reservation() -> Response:
    services().auth.check_reserver(caller())
    asked = reservation_from_json(body())
    pods = services().commitments
    committed = None if pods is None else pods.by_namespace()
    if pods is None or committed is None:
        raise Uncountable(NO_POD_WATCH if pods is None else pods.problem() or NO_POD_WATCH)
    grant = services().reservations.reserve(asked, committed, pods.counted_ids(), pods.admitted_as, pods.settled_ids())
    return jsonify(granted=grant.granted, uncommitted=None if grant.uncommitted is None else grant.uncommitted.to_json())
