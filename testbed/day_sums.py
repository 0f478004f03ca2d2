"""Statuses as the daily rows alone give them: each kind of period's use summed over its days, top-ups over every
period since the earliest start (what the rollups of namespace_period_usage stand for). The tests hold the rollups
to them; bench/budget_reads.py measures them as the baseline."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from dataclasses import replace
from typing import Any

from sqlalchemy import BindParameter, ColumnElement, Date, and_, bindparam, case, func, select

from gpusharing.contract import Period
from timekeeper.budgets.periods import period_window
from timekeeper.database.budgets.reads import StatusReads
from timekeeper.database.budgets.store import BudgetStore
from timekeeper.database.connection import Statements
from timekeeper.database.tables import UtcDateTime, namespace_usage, top_ups


def _summed(value: Any, inside: dict[Period, ColumnElement[bool]], prefix: str) -> list[Any]:
    return [func.sum(case((inside[kind], value), else_=0)).label(f"{prefix}_{kind}") for kind in Period]


_DAY = namespace_usage.c.day
_DAYS = {
    kind: and_(_DAY >= bindparam(f"{kind}_first", type_=Date()), _DAY < bindparam(f"{kind}_end", type_=Date()))
    for kind in Period
    if kind is not Period.NONE
} | {Period.NONE: _DAY >= bindparam(f"{Period.NONE}_first", type_=Date())}
_STARTS = {kind: top_ups.c.period_start == bindparam(f"{kind}_start", type_=UtcDateTime()) for kind in Period}
USED = (select(namespace_usage.c.namespace, *_summed(namespace_usage.c.micro_gpu_seconds, _DAYS, "used"))
        .where(_DAY >= bindparam("earliest_day", type_=Date())).group_by(namespace_usage.c.namespace))
TOPPED = (select(top_ups.c.namespace, *_summed(top_ups.c.gpu_minutes, _STARTS, "topped"))
          .where(top_ups.c.period_start >= bindparam("earliest", type_=UtcDateTime())).group_by(top_ups.c.namespace))
CHOSEN: BindParameter[Any] = bindparam("namespaces", expanding=True)
USED_OF, TOPPED_OF = USED.where(namespace_usage.c.namespace.in_(CHOSEN)), TOPPED.where(top_ups.c.namespace.in_(CHOSEN))


def day_sum_parameters(now: dt.datetime) -> dict[str, object]:
    windows = {kind: period_window(kind, now) for kind in Period}
    earliest = min(w.start for w in windows.values())
    parameters: dict[str, object] = {"earliest_day": earliest.date(), "earliest": earliest}
    for kind, window in windows.items():
        parameters |= {f"{kind}_first": window.start.date(), f"{kind}_start": window.start}
        if window.end is not None:
            parameters[f"{kind}_end"] = window.end.date()
    return parameters


def day_sum_reads(
    store: BudgetStore, conn: Statements, namespaces: Collection[str] | None, now: dt.datetime
) -> StatusReads:
    """BudgetStore.read_use, its use and top-ups read from the days (of every namespace: a hierarchy needs them all)."""
    reads = store.read_use(conn, store.budget_rows(conn, namespaces), namespaces, now)
    parameters = day_sum_parameters(now)
    return replace(
        reads, used_rows=list(conn.execute(USED, parameters)), topped_rows=list(conn.execute(TOPPED, parameters))
    )
