"""Chargeback: the FOCUS 1.2 export (`/api/v1/focus`), the GPU capacity's use (`/api/v1/utilization`) and the budget
hierarchy's GPU-hours and costs (`/api/v1/accounts`), scoped as every read is (docs/chargeback.md)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Response, jsonify, request, stream_with_context

from gpusharing.names import check_budget_name, check_namespace
from gpusharing.usage_report import UsageRequestError, report_days
from timekeeper.api.context import reader, services
from timekeeper.budgets.hierarchy import ancestry
from timekeeper.budgets.periods import iso_utc
from timekeeper.chargeback.accounts import accounts
from timekeeper.chargeback.capacity import CapacityFigures
from timekeeper.chargeback.export import ExportConflict, ExportTerms, export_rows
from timekeeper.chargeback.focus import (
    MICRO_GPU_SECONDS_PER_GPU_HOUR,
    FocusCharge,
    FocusDataset,
    FocusError,
    focus_chunks,
)
from timekeeper.chargeback.prices import GpuPrice
from timekeeper.database.chargeback.exports import ChargebackReads
from timekeeper.database.chargeback.prices import RecordedSheet, in_force

log = logging.getLogger(__name__)
blueprint = Blueprint("chargeback", __name__, url_prefix="/api/v1")

FINAL_HEADER = "X-Gpusharing-Export-Final"  # "true": every billing period of the window has closed
MAX_NODE_HOURS = 100_000  # in one answer: a month of 138 nodes
CLUSTER_TAG = "gpusharing.io/cluster"
PATH_TAG = "gpusharing.io/budget-path"


@dataclass(frozen=True)
class _Export:
    """The rows of a window's export as the caller may read them, and what they are in."""

    first: dt.date
    after: dt.date
    currency: str | None  # None: no price sheet in force in the window
    rows: Iterator[FocusCharge]
    final: bool  # every billing period of the window has closed: the rows will never change
    pins: dict[tuple[str, dt.datetime], dict[str, str]]  # tags of closed periods' rows first exported, once written

    def pin(self) -> None:
        """Records the tags the rows of closed periods were first exported with (call once the rows are written)."""
        ChargebackReads(services().database).pin_tags(self.pins)


@blueprint.get("/focus")
def get_focus() -> Response:
    namespace = request.args.get("namespace")
    scope = check_namespace(namespace) if namespace else None
    export = _export(scope)
    if export.currency is None:
        raise ExportConflict("no price sheet was in force in the window, so nothing can be costed: set the prices "
                             "(TIMEKEEPER_GPU_PRICES_FILE, the chart's gpuPrices; docs/chargeback.md)")
    cluster = services().config.chargeback.cluster
    dataset = FocusDataset(export.currency, cluster, cluster)

    def chunks() -> Iterator[str]:
        """The CSV as its rows are read (a month of a large cluster is a gigabyte): a row the writer refuses, a bug,
        ends the answer short, logged, after the lines before it."""
        try:
            yield from focus_chunks(dataset, export.rows)
        except FocusError:
            log.exception("the FOCUS export of %s to %s stopped short", export.first, export.after)
            return
        export.pin()

    filename = f"gpu-focus-{cluster}-{export.first}-{export.after}{'-' + scope if scope else ''}.csv"
    return Response(stream_with_context(chunks()), content_type="text/csv; charset=utf-8", headers={
        "Content-Disposition": f'attachment; filename="{filename}"', FINAL_HEADER: str(export.final).lower()})


@blueprint.get("/utilization")
def get_utilization() -> Response:
    reader(None)  # the cluster's GPUs: every namespace's
    first, after = report_days(request.args.get("from"), request.args.get("to"))
    per = request.args.get("per", "model")
    capacity = ChargebackReads(services().database).capacity
    start, end = _midnight(first), _midnight(after)
    if per == "node-hour":
        lines = capacity.node_hours(start, end, MAX_NODE_HOURS + 1)
        if len(lines) > MAX_NODE_HOURS:
            raise UsageRequestError(f"more than {MAX_NODE_HOURS:,} node-hours: ask for fewer days")
        items = [{"node": line.node, "hour": iso_utc(line.hour), **_figures(line.model, line.figures)}
                 for line in lines]
    elif per == "model":
        used = capacity.utilization(start, end)
        items = [_figures(None, used.cluster), *(_figures(model, figures) for model, figures in used.models.items())]
    else:
        raise UsageRequestError(f"per is model (the default) or node-hour, not {per[:40]!r}")
    return jsonify({"from": first.isoformat(), "to": after.isoformat(), "per": per, "items": items})


def _figures(model: str | None, figures: CapacityFigures) -> dict[str, Any]:
    """A line of the utilization report: GPU-hours of each figure, exact micro-GPU-seconds, and per cent of the
    capacity (null without capacity)."""
    line: dict[str, Any] = {"model": model}
    for name, micro in figures._asdict().items():
        line[f"{name}GpuHours"] = micro / MICRO_GPU_SECONDS_PER_GPU_HOUR
        line[f"{name}MicroGpuSeconds"] = micro
        if name != "capacity":
            line[f"{name}Percent"] = 100 * micro / figures.capacity if figures.capacity else None
    return line


@blueprint.get("/accounts")
def get_accounts() -> Response:
    budget = request.args.get("budget")
    scope = check_budget_name(budget) if budget else None
    export = _export(scope, whole=True)
    tree = accounts(export.rows, services().budgets.budgets(), scope)
    export.pin()
    return jsonify({"from": export.first.isoformat(), "to": export.after.isoformat(), "currency": export.currency,
                    "final": export.final, "items": [account.to_json(export.currency is not None) for account in tree]})


def _export(scope: str | None, whole: bool = False) -> _Export:
    """The export of the window `from`..`to` asked for, as `scope` (a namespace, a group with `whole`, None: the
    cluster) may read it: a tenant's own rows, and its part of the unallocated time where it is shared."""
    reader(scope)
    first, after = report_days(request.args.get("from"), request.args.get("to"))
    start, end = _midnight(first), _midnight(after)
    s = services()
    settings = s.config.chargeback
    now = s.budgets.clock()
    s.ledger.terms.record_once(now)  # the sheet this process runs with, as its first charge would record it
    history = s.ledger.terms.prices.history()
    budgets = s.budgets.budgets()
    reads = ChargebackReads(s.database)
    calendar = settings.calendar
    # Corrections of a window are booked in it, for hours of periods that closed before: its own periods' pins do.
    pinned = reads.pinned_tags(calendar.period_of(start).start, end)
    pins: dict[tuple[str, dt.datetime], dict[str, str]] = {}

    def tags(owner: str | None, period: dt.datetime) -> dict[str, str]:
        """The budget hierarchy as it stands; for a closed period's rows, as they were first exported."""
        if owner is not None and calendar.closes_at(period) <= now:
            if (owner, period) in pinned:
                return pinned[owner, period]
            pins[owner, period] = pinned[owner, period] = hierarchy_tags(owner)
            return pins[owner, period]
        return hierarchy_tags(owner)

    def hierarchy_tags(owner: str | None) -> dict[str, str]:
        chain = [] if owner is None else [owner, *ancestry(budgets, owner)]
        groups = {group.split(".", 1)[0]: group for group in reversed(chain[1:])}
        return {CLUSTER_TAG: settings.cluster, **({PATH_TAG: "/".join(reversed(chain))} if chain else {}),
                **{f"gpusharing.io/{kind}": group for kind, group in groups.items()}}

    def price(model: str, hour: dt.datetime) -> GpuPrice | None:
        sheet = in_force(history, hour)
        return None if sheet is None else sheet.sheet.price_at(model, hour)

    # A group's subtree is read whole and cut by the tree; so is a namespace's export where the unallocated time is
    # shared, in proportion to what every namespace held; else a namespace's rows are read alone.
    shown = None if whole else scope
    read = shown if not settings.share_unallocated else None
    terms = ExportTerms(calendar, price, tags, settings.share_unallocated, shown)
    unallocated = reads.capacity.unallocated(start, end) if read is None else {}
    rows = export_rows(reads.corrections(start, end, shown), reads.held(start, end, read), unallocated, terms)
    final = calendar.closes_at(end - dt.timedelta(microseconds=1)) <= now
    return _Export(first, after, _currency(history, start, end), rows, final, pins)


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc)


def _currency(history: list[RecordedSheet], start: dt.datetime, end: dt.datetime) -> str | None:
    """The one currency of the price sheets in force in [start, end) (None: none is; ExportConflict: several)."""
    at_start = in_force(history, start)
    sheets = [*([at_start] if at_start else []), *(r for r in history if start < r.effective_at < end)]
    currencies = sorted({r.sheet.currency for r in sheets if r.sheet.currency is not None})
    if len(currencies) > 1:
        raise ExportConflict(f"the price sheets in force in the window are in {' and '.join(currencies)}: export "
                             "the windows before and after the change of currency apart")
    return currencies[0] if currencies else None
