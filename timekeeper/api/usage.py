"""What was used and what it cost: usage reports as JSON or CSV (`/api/v1/usage`), the GPU models' billing weights
with their history (`/api/v1/gpu-models`), and the price sheets with theirs (`/api/v1/prices`)."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from gpusharing.names import check_namespace
from gpusharing.units.weights import weight_number
from gpusharing.usage_report import usage_csv, usage_request
from timekeeper.api.context import caller, reader, services
from timekeeper.database.chargeback.prices import in_force

blueprint = Blueprint("usage", __name__, url_prefix="/api/v1")


@blueprint.get("/usage")
def get_usage() -> Response:
    args = request.args
    namespace = args.get("namespace")
    scope = check_namespace(namespace) if namespace else None
    reader(scope)
    asked = usage_request(args.get("from"), args.get("to"), args.get("groupBy"), scope)
    report = services().ledger.usage.report(asked)
    if request.accept_mimetypes.best_match(["application/json", "text/csv"]) == "text/csv":
        filename = f"gpu-usage-{asked.start}-{asked.end}.csv"
        return Response(
            usage_csv(report.fields, (row.to_json() for row in report.rows)),
            content_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{filename}"'},
        )
    return jsonify(report.to_json())


@blueprint.get("/gpu-models")
def get_gpu_models() -> Response:
    services().auth.check_not_meter(caller())
    catalogue = services().config.catalogue
    return jsonify(
        items=[
            {"name": m.name, "memoryMiB": m.memory_mib, "billingWeight": weight_number(m.billing_weight)}
            for m in catalogue.models
        ],
        default=catalogue.default.name,
        changes=[change.to_json() for change in services().ledger.terms.weights.history()],
    )


@blueprint.get("/prices")
def get_prices() -> Response:
    services().auth.check_not_meter(caller())
    now = services().budgets.clock()
    terms = services().ledger.terms
    terms.record_once(now)  # the sheet this process runs with, as its first charge would record it
    history = terms.prices.history()
    current = in_force(history, now)
    return jsonify(inForce=None if current is None else current.to_json(),
                   versions=[recorded.to_json() for recorded in history])
