"""Budgets, top-ups, the audit log and namespace statuses in the database (the SQL side of timekeeper.budget)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy import Connection, and_, case, func, select

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
from timekeeper.db import Database
from timekeeper.models import budget_changes, budgets, leases, namespace_states, namespace_usage, top_ups

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
        query = select(budgets).where(budgets.c.namespace == namespace)
        if lock and not self.db.is_sqlite:
            query = query.with_for_update()
        row = conn.execute(query).first()
        budget = effective_budget(namespace, _budget(row), self.default_gpu_minutes, self.default_period)
        window = period_window(budget.period, now)
        used, topped_up = conn.execute(
            select(
                select(func.coalesce(func.sum(namespace_usage.c.micro_gpu_seconds), 0))
                .where(namespace_usage.c.namespace == namespace, *_days_in(window))
                .scalar_subquery(),
                select(func.coalesce(func.sum(top_ups.c.gpu_minutes), 0.0))
                .where(top_ups.c.namespace == namespace, top_ups.c.period_start == window.start)
                .scalar_subquery(),
            )
        ).one()
        return BudgetStatus(namespace, budget.gpu_minutes, budget.period, window, int(used), float(topped_up), budget.evict_on_exhaustion)

    def statuses(self) -> list[BudgetStatus]:
        """Every namespace with a budget, and every other namespace with use in its (default) period."""
        now = self.clock()
        with self.db.read() as conn:
            own = {b.namespace: b for b in (_budget(row) for row in conn.execute(select(budgets))) if b is not None}
            kinds = {b.period for b in own.values()} | {self.default_period}
            windows = {kind: period_window(kind, now) for kind in kinds}
            earliest = min(w.start for w in windows.values()).date()
            used_by_kind = {kind: case((and_(*_days_in(w)), namespace_usage.c.micro_gpu_seconds), else_=0) for kind, w in windows.items()}
            usage = conn.execute(
                select(namespace_usage.c.namespace, *(func.sum(expr).label(kind.value) for kind, expr in used_by_kind.items()))
                .where(namespace_usage.c.day >= earliest)
                .group_by(namespace_usage.c.namespace)
            ).all()
            topped = conn.execute(
                select(top_ups.c.namespace, top_ups.c.period_start, func.sum(top_ups.c.gpu_minutes))
                .where(top_ups.c.period_start.in_([w.start for w in windows.values()]))
                .group_by(top_ups.c.namespace, top_ups.c.period_start)
            ).all()
        used = {row.namespace: {kind: int(getattr(row, kind.value) or 0) for kind in kinds} for row in usage}
        top_up_minutes = {(ns, _aware(start)): float(total) for ns, start, total in topped}
        namespaces = set(own) | {ns for ns, by_kind in used.items() if by_kind[self.default_period] > 0}
        result = []
        for namespace in sorted(namespaces):
            budget = effective_budget(namespace, own.get(namespace), self.default_gpu_minutes, self.default_period)
            window = windows[budget.period]
            result.append(
                BudgetStatus(
                    namespace,
                    budget.gpu_minutes,
                    budget.period,
                    window,
                    used.get(namespace, {}).get(budget.period, 0),
                    top_up_minutes.get((namespace, window.start), 0.0),
                    budget.evict_on_exhaustion,
                )
            )
        return result

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
        now = self.clock()
        with self.db.write() as conn:
            before = self.status_in(conn, budget.namespace, now, lock=True)
            existed = conn.execute(select(budgets.c.namespace).where(budgets.c.namespace == budget.namespace)).first()
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


def _budget(row: object | None) -> Budget | None:
    if row is None:
        return None
    return Budget(row.namespace, row.gpu_minutes, Period(row.period), bool(row.evict_on_exhaustion))  # type: ignore[attr-defined]


def _days_in(window: PeriodWindow) -> Iterable[object]:
    conditions = [namespace_usage.c.day >= window.start.date()]
    if window.end is not None:
        conditions.append(namespace_usage.c.day < window.end.date())
    return conditions


def _aware(at: dt.datetime) -> dt.datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
