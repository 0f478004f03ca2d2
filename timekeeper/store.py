"""Budgets, top-ups, the audit log and namespace statuses in the database (the SQL side of timekeeper.budget)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import ColumnElement, Connection, Date, and_, bindparam, case, func, select

from gpusharing.contract import BudgetState
from timekeeper.budget import (
    UTC,
    Budget,
    BudgetStatus,
    Period,
    PeriodWindow,
    crossed_into_over_budget,
    effective_budget,
    iso_utc,
    period_window,
)
from timekeeper.db import Database, Statements
from timekeeper.models import UtcDateTime, budget_changes, budgets, leases, namespace_states, namespace_usage, top_ups

Clock = Callable[[], dt.datetime]


def utc_now() -> dt.datetime:
    return dt.datetime.now(UTC)


class NoLimit(ValueError):
    """A top-up for a namespace whose budget is unlimited."""


class NoBudget(LookupError):
    """The namespace has no budget of its own."""


@dataclass(frozen=True)
class BudgetChange:
    status: BudgetStatus
    created: bool  # the namespace had no budget of its own before
    crossed: bool  # the change put the namespace over budget


@dataclass
class StatusReads:
    """The reads of BudgetStore.read_use, made into statuses once their rows are in."""

    store: BudgetStore
    effective: dict[str, Budget]
    windows: dict[Period, PeriodWindow]
    listing: bool  # every namespace: those without a budget of their own are listed when they have use or top-ups
    used_rows: Iterable[Any]
    topped_rows: Iterable[Any]

    def statuses(self) -> dict[str, BudgetStatus]:
        used = {row.namespace: row for row in self.used_rows}
        topped = {row.namespace: row for row in self.topped_rows}
        effective = dict(self.effective)
        store = self.store
        if self.listing:
            kind = store.default_period.value
            active = {n for n, row in used.items() if getattr(row, f"used_{kind}")}
            active |= {n for n, row in topped.items() if getattr(row, f"topped_{kind}")}
            for namespace in active - effective.keys():
                effective[namespace] = effective_budget(namespace, None, store.default_gpu_minutes, store.default_period)
        result = {}
        for namespace, budget in effective.items():
            kind = budget.period.value
            use, top_up = used.get(namespace), topped.get(namespace)
            result[namespace] = BudgetStatus(
                namespace,
                budget.gpu_minutes,
                budget.period,
                self.windows[budget.period],
                int(getattr(use, f"used_{kind}") or 0) if use else 0,
                float(getattr(top_up, f"topped_{kind}") or 0.0) if top_up else 0.0,
                budget.evict_on_exhaustion,
            )
        return result


class BudgetStore:
    def __init__(
        self,
        db: Database,
        default_gpu_minutes: float | None = None,
        default_period: Period = Period.MONTHLY,
        clock: Clock = utc_now,
    ):
        self.db = db
        self.default_gpu_minutes = default_gpu_minutes
        self.default_period = default_period
        self.clock = clock

    # -- reads ---------------------------------------------------------------------------------------------------

    def status(self, namespace: str) -> BudgetStatus:
        with self.db.read() as conn:
            return self.status_in(conn, namespace, self.clock())

    def status_in(self, conn: Connection, namespace: str, now: dt.datetime, lock: bool = False) -> BudgetStatus:
        """The namespace's status as seen by `conn` (lock: hold its budget row until the transaction ends)."""
        if lock and not self.db.is_sqlite:
            conn.execute(select(budgets.c.namespace).where(budgets.c.namespace == namespace).with_for_update())
        return self.statuses_in(conn, [namespace], now)[namespace]

    def statuses(self) -> list[BudgetStatus]:
        """Every namespace with a budget, and every other namespace with use or top-ups in its (default) period."""
        with self.db.read() as conn:
            return sorted(self.statuses_in(conn, None, self.clock()).values(), key=lambda status: status.namespace)

    def statuses_in(self, conn: Statements, namespaces: Collection[str] | None, now: dt.datetime) -> dict[str, BudgetStatus]:
        """The statuses of `namespaces` (None: of every namespace `statuses` lists), in three statements."""
        return self.read_use(conn, self.budget_rows(conn, namespaces), namespaces, now).statuses()

    def budget_rows(self, conn: Statements, namespaces: Collection[str] | None) -> Iterable[Any]:
        """The budget rows of `namespaces` (None: all), to hand to read_use."""
        if namespaces is None:
            return conn.execute(_BUDGETS)
        return conn.execute(_BUDGETS_OF, {"namespaces": sorted(namespaces)})

    def read_use(
        self, conn: Statements, budget_rows: Iterable[Any], namespaces: Collection[str] | None, now: dt.datetime
    ) -> StatusReads:
        """Sends the reads of the namespaces' use and top-ups in their current periods; StatusReads.statuses() has the result.

        Use is kept per UTC day, so one pass over the days since the earliest period start in use gives every
        namespace's use in its own period, whatever that period is.
        """
        own = {row.namespace: _budget(row) for row in budget_rows}
        effective = {
            namespace: effective_budget(namespace, own.get(namespace), self.default_gpu_minutes, self.default_period)
            for namespace in (namespaces if namespaces is not None else own)
        }
        kinds = {budget.period for budget in effective.values()} | {self.default_period}
        windows = {kind: period_window(kind, now) for kind in Period}
        earliest = min(windows[kind].start for kind in kinds)
        parameters = {**_window_parameters(windows), "earliest_day": earliest.date(), "earliest_start": earliest}
        if namespaces is None:
            used, topped = conn.execute(_USAGE, parameters), conn.execute(_TOP_UPS, parameters)
        else:
            parameters["namespaces"] = sorted(namespaces)
            used, topped = conn.execute(_USAGE_OF, parameters), conn.execute(_TOP_UPS_OF, parameters)
        return StatusReads(self, effective, windows, listing=namespaces is None, used_rows=used, topped_rows=topped)

    def changes(self, namespace: str) -> list[dict[str, object]]:
        """The audit log of one namespace, oldest first."""
        with self.db.read() as conn:
            rows = conn.execute(
                select(budget_changes).where(budget_changes.c.namespace == namespace).order_by(budget_changes.c.id)
            ).all()
        return [
            {
                "namespace": row.namespace,
                "action": row.action,
                "actor": row.actor,
                "changedAt": iso_utc(row.changed_at),
                "before": json.loads(row.before) if row.before else None,
                "after": json.loads(row.after) if row.after else None,
            }
            for row in rows
        ]

    # -- writes (each in one transaction, with its audit record) --------------------------------------------------

    def set_budget(self, budget: Budget, actor: str) -> BudgetChange:
        """Gives the namespace `budget`, in place of what it had."""
        return self._set_budget(budget.namespace, lambda _current: budget, actor)

    def patch_budget(self, namespace: str, changes: Mapping[str, Any], actor: str) -> BudgetChange:
        """Changes only the fields of its budget that `changes` names (Budget's): of its own budget, or of the default
        one when it has none (the result becomes its own)."""
        return self._set_budget(namespace, lambda current: replace(current, **changes), actor)

    def _set_budget(self, namespace: str, change: Callable[[Budget], Budget], actor: str) -> BudgetChange:
        now = self.clock()
        with self.db.write() as conn:
            before = self.status_in(conn, namespace, now, lock=True)
            existed = conn.execute(select(budgets.c.namespace).where(budgets.c.namespace == namespace)).first()
            budget = change(Budget(namespace, before.gpu_minutes, before.period, before.evict_on_exhaustion))
            values = {
                "gpu_minutes": budget.gpu_minutes,
                "period": budget.period.value,
                "evict_on_exhaustion": budget.evict_on_exhaustion,
                "updated_at": now,
            }
            conn.execute(
                self.db.insert(budgets)
                .values(namespace=budget.namespace, created_at=now, **values)
                .on_conflict_do_update(index_elements=[budgets.c.namespace], set_=values)
            )
            after = self.status_in(conn, budget.namespace, now)
            self._audit(conn, budget.namespace, "set", actor, now, before if existed else None, after)
        return BudgetChange(after, existed is None, crossed_into_over_budget(before.state, after.state))

    def remove_budget(self, namespace: str, actor: str) -> BudgetStatus:
        """Removes the namespace's own budget (the default applies again); raises NoBudget when it has none."""
        now = self.clock()
        with self.db.write() as conn:
            before = self.status_in(conn, namespace, now, lock=True)
            if conn.execute(budgets.delete().where(budgets.c.namespace == namespace)).rowcount == 0:
                raise NoBudget(f"namespace {namespace} has no budget of its own")
            after = self.status_in(conn, namespace, now)
            self._audit(conn, namespace, "remove", actor, now, before, None)
        return after

    def top_up(self, namespace: str, gpu_minutes: float, reason: str, actor: str) -> BudgetStatus:
        """Adds GPU-minutes to the namespace's current period; raises NoLimit when its budget is unlimited."""
        now = self.clock()
        with self.db.write() as conn:
            before = self.status_in(conn, namespace, now, lock=True)
            if before.gpu_minutes is None:
                raise NoLimit(f"namespace {namespace} has no limit on GPU-minutes: a top-up would change nothing")
            conn.execute(
                top_ups.insert().values(
                    namespace=namespace,
                    period_start=before.window.start,
                    gpu_minutes=gpu_minutes,
                    reason=reason,
                    actor=actor,
                    created_at=now,
                )
            )
            after = self.status_in(conn, namespace, now)
            self._audit(conn, namespace, "top-up", actor, now, before, after, {"gpuMinutes": gpu_minutes, "reason": reason})
        return after

    def _audit(
        self,
        conn: Connection,
        namespace: str,
        action: str,
        actor: str,
        now: dt.datetime,
        before: BudgetStatus | None,
        after: BudgetStatus | None,
        detail: dict[str, object] | None = None,
    ) -> None:
        after_json = None if after is None else {**after.to_json(), **(detail or {})}
        conn.execute(
            budget_changes.insert().values(
                namespace=namespace,
                action=action,
                actor=actor,
                changed_at=now,
                before=None if before is None else json.dumps(before.to_json()),
                after=None if after_json is None else json.dumps(after_json),
            )
        )

    # -- demotion bookkeeping -------------------------------------------------------------------------------------

    def acted_states(self) -> dict[str, BudgetState]:
        with self.db.read() as conn:
            return {row.namespace: BudgetState(row.state) for row in conn.execute(select(namespace_states))}

    def claim_transition(self, namespace: str, state: BudgetState) -> BudgetState | None:
        """Records that the demoter acts on `state`; returns the state it acted on before, or None when unchanged.

        The first demoter to record a transition acts on it; any other finds it recorded and does nothing.
        """
        now = self.clock()
        with self.db.write() as conn:
            query = select(namespace_states.c.state).where(namespace_states.c.namespace == namespace)
            row = conn.execute(query if self.db.is_sqlite else query.with_for_update()).first()
            previous = BudgetState(row.state) if row else BudgetState.UNKNOWN
            if previous is state:
                return None
            if row is None:
                inserted = conn.execute(
                    self.db.insert(namespace_states)
                    .values(namespace=namespace, state=state.value, changed_at=now)
                    .on_conflict_do_nothing()
                    .returning(namespace_states.c.namespace)
                ).first()
                return previous if inserted is not None else None
            conn.execute(
                namespace_states.update()
                .where(namespace_states.c.namespace == namespace)
                .values(state=state.value, changed_at=now)
            )
            return previous

    def release_transition(self, namespace: str, state: BudgetState, previous: BudgetState) -> None:
        """Gives back a claim of `state` that could not be acted on: the namespace reads `previous` again."""
        with self.db.write() as conn:
            claimed = (namespace_states.c.namespace == namespace) & (namespace_states.c.state == state.value)
            if previous is BudgetState.UNKNOWN:
                conn.execute(namespace_states.delete().where(claimed))
            else:
                conn.execute(namespace_states.update().where(claimed).values(state=previous.value))

    def acquire_lease(self, name: str, holder: str, seconds: float) -> bool:
        """Takes or renews the lease `name` for `holder`; False while another holder's lease runs."""
        now = self.clock()
        expires = now + dt.timedelta(seconds=seconds)
        with self.db.write() as conn:
            taken = conn.execute(
                leases.update()
                .where(leases.c.name == name, (leases.c.holder == holder) | (leases.c.expires_at < now))
                .values(holder=holder, expires_at=expires)
            ).rowcount
            if taken:
                return True
            inserted = conn.execute(
                self.db.insert(leases)
                .values(name=name, holder=holder, expires_at=expires)
                .on_conflict_do_nothing()
                .returning(leases.c.name)
            ).first()
            return inserted is not None


def _per_period(value: Any, in_period: Callable[[Period], ColumnElement[bool]], prefix: str) -> list[Any]:
    """One sum of `value` per kind of period, over the rows in that kind's current period (bound at execution)."""
    return [func.sum(case((in_period(kind), value), else_=0)).label(f"{prefix}_{kind}") for kind in Period]


def _day_in(kind: Period) -> ColumnElement[bool]:
    first = namespace_usage.c.day >= bindparam(f"{kind}_first_day", type_=Date())
    if kind is Period.NONE:
        return first
    return and_(first, namespace_usage.c.day < bindparam(f"{kind}_end_day", type_=Date()))


def _top_up_in(kind: Period) -> ColumnElement[bool]:
    return top_ups.c.period_start == bindparam(f"{kind}_start", type_=UtcDateTime())


_CHOSEN = bindparam("namespaces", expanding=True)
_BUDGETS = select(budgets)
_BUDGETS_OF = _BUDGETS.where(budgets.c.namespace.in_(_CHOSEN))
_USAGE = (
    select(namespace_usage.c.namespace, *_per_period(namespace_usage.c.micro_gpu_seconds, _day_in, "used"))
    .where(namespace_usage.c.day >= bindparam("earliest_day", type_=Date()))
    .group_by(namespace_usage.c.namespace)
)
_USAGE_OF = _USAGE.where(namespace_usage.c.namespace.in_(_CHOSEN))
_TOP_UPS = (
    select(top_ups.c.namespace, *_per_period(top_ups.c.gpu_minutes, _top_up_in, "topped"))
    .where(top_ups.c.period_start >= bindparam("earliest_start", type_=UtcDateTime()))
    .group_by(top_ups.c.namespace)
)
_TOP_UPS_OF = _TOP_UPS.where(top_ups.c.namespace.in_(_CHOSEN))


def _window_parameters(windows: dict[Period, PeriodWindow]) -> dict[str, object]:
    parameters: dict[str, object] = {}
    for kind, window in windows.items():
        parameters[f"{kind}_start"] = window.start
        parameters[f"{kind}_first_day"] = window.start.date()
        if window.end is not None:
            parameters[f"{kind}_end_day"] = window.end.date()
    return parameters


def _budget(row: Any) -> Budget:
    return Budget(row.namespace, row.gpu_minutes, Period(row.period), bool(row.evict_on_exhaustion))  # type: ignore[attr-defined]
