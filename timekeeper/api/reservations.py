"""Safe admission's reservations (`POST /api/v1/reservations`): the webhook holds a pod's commitment here, once per
review of a GPU pod with a deadline under safe or strict admission."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from timekeeper.api.context import body, caller, services
from timekeeper.budgets.requests import reservation_from_json
from timekeeper.database.budgets.reservations import Uncountable
from timekeeper.database.cluster.commitments import NOT_PUBLISHED

blueprint = Blueprint("reservations", __name__, url_prefix="/api/v1/reservations")


@blueprint.post("")
def post_reservation() -> Response:
    services().auth.check_reserver(caller())
    asked = reservation_from_json(body())
    pods = services().commitments.read()  # one read: the answers below agree
    committed = pods.by_namespace()
    if committed is None:
        raise Uncountable(pods.problem() or NOT_PUBLISHED)
    grant = services().reservations.reserve(asked, committed, pods.counted_ids(), pods.admitted_as, pods.settled_ids())
    return jsonify(
        granted=grant.granted, uncommitted=None if grant.uncommitted is None else grant.uncommitted.to_json()
    )
