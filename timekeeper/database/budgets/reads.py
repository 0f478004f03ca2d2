"""What budget statuses are read from: the SQL that reads each current period's use (its rollup) and top-ups in one
pass, and its rows made into statuses (the SQL side of timekeeper.budgets.status)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BindParameter, ColumnElement, Date, and_, bindparam, case, func, or_, select

from gpusharing.contract import AdmissionMode, Period, Shortfall
from gpusharing.idle.policy import from_stored
from timekeeper.budgets.hierarchy import roll_up
from timekeeper.budgets.periods import PeriodWindow
from timekeeper.budgets.status import Budget, BudgetStatus, effective_budget
from timekeeper.database.tables import (
    UtcDateTime,
    budgets,
    namespace_period_usage,
    top_ups,
)


@dataclass
class StatusReads:
    """The reads of BudgetStore.read_use, made into statuses once their rows are in (each row is read once: a
    pipeline's rows can be)."""

    default: Budget  # what a namespace without a budget of its own has (its name aside)
    own: dict[str, Any]  # name -> budget row, of the names asked for (or of all)
    wanted: Collection[str] | None  # None: every namespace `statuses` lists
    windows: dict[Period, PeriodWindow]
    used_rows: Iterable[Any]
    topped_rows: Iterable[Any]
    other_budget_rows: Iterable[Any] = ()  # the rest of the hierarchy, when the names asked for are part of one
    _read: tuple[dict[str, Any], dict[str, dict[Period, int]], dict[str, dict[Period, float]]] | None = None

    def statuses(self, minus: Mapping[str, int] | None = None) -> dict[str, BudgetStatus]:
        """The statuses; `minus`: as they were before these charges (micro-GPU-seconds by namespace, all of today)."""
        if self._read is None:
            rows = {**self.own, **{row.namespace: row for row in self.other_budget_rows}}
            used = {row.namespace: {k: int(getattr(row, f"used_{k}") or 0) for k in Period} for row in self.used_rows}
            topped = {
                row.namespace: {k: float(getattr(row, f"topped_{k}") or 0.0) for k in Period}
                for row in self.topped_rows
            }
            self._read = (rows, used, topped)
        rows, used, topped = self._read
        if minus:  # today's charges lie in every kind of period's current one
            used = {
                name: {kind: value - minus.get(name, 0) for kind, value in use.items()} for name, use in used.items()
            }
        budgets_by_name = {name: budget_of_row(row) for name, row in rows.items()}
        if self.wanted is None:
            kind = self.default.period
            wanted = set(budgets_by_name)
            wanted |= {n for n, use in used.items() if use.get(kind)} | {
                n for n, top in topped.items() if top.get(kind)
            }
        else:
            wanted = set(self.wanted)
        for name in wanted - budgets_by_name.keys():
            budgets_by_name[name] = effective_budget(name, None, self.default.gpu_minutes, self.default.period)
        managed = {name: row.managed_by for name, row in rows.items() if row.managed_by}
        statuses = roll_up(budgets_by_name, used, topped, self.windows, managed, self.default.idle)
        return {name: statuses[name] for name in wanted}


def _per_period(value: Any, in_period: Callable[[Period], ColumnElement[bool]], prefix: str) -> list[Any]:
    """One sum of `value` per kind of period, over the rows in that kind's current period (bound at execution)."""
    return [func.sum(case((in_period(kind), value), else_=0)).label(f"{prefix}_{kind}") for kind in Period]


def _rollup_in(kind: Period) -> ColumnElement[bool]:
    return and_(namespace_period_usage.c.period == kind.value,
                namespace_period_usage.c.period_start == bindparam(f"{kind}_first_day", type_=Date()))


def _top_up_in(kind: Period) -> ColumnElement[bool]:
    return top_ups.c.period_start == bindparam(f"{kind}_start", type_=UtcDateTime())


CHOSEN: BindParameter[list[str]] = bindparam("namespaces", expanding=True)
ALL_BUDGETS = select(budgets)
BUDGETS_OF = ALL_BUDGETS.where(budgets.c.namespace.in_(CHOSEN))
# One indexed lookup per kind of period (the rollups' and the top-ups' keys lead with the period): what a status
# reads does not grow with the history.
USAGE = (
    select(namespace_period_usage.c.namespace,
           *_per_period(namespace_period_usage.c.micro_gpu_seconds, _rollup_in, "used"))
    .where(or_(*(_rollup_in(kind) for kind in Period)))
    .group_by(namespace_period_usage.c.namespace)
)
USAGE_OF = USAGE.where(namespace_period_usage.c.namespace.in_(CHOSEN))
TOP_UPS = (
    select(top_ups.c.namespace, *_per_period(top_ups.c.gpu_minutes, _top_up_in, "topped"))
    .where(or_(*(_top_up_in(kind) for kind in Period)))
    .group_by(top_ups.c.namespace)
)
TOP_UPS_OF = TOP_UPS.where(top_ups.c.namespace.in_(CHOSEN))


def window_parameters(windows: dict[Period, PeriodWindow]) -> dict[str, object]:
    parameters: dict[str, object] = {}
    for kind, window in windows.items():
        parameters[f"{kind}_start"] = window.start
        parameters[f"{kind}_first_day"] = window.start.date()
    return parameters


def budget_of_row(row: Any) -> Budget:
    thresholds = tuple(int(t) for t in row.warning_thresholds.split(",") if t)
    return Budget(
        row.namespace,
        row.gpu_minutes,
        Period(row.period),
        bool(row.evict_on_exhaustion),
        row.parent,
        thresholds,
        AdmissionMode(row.admission),
        Shortfall(row.on_shortfall),
        from_stored(row.idle),
    )
