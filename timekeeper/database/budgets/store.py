"""Budgets, top-ups, the audit log and namespace statuses in the database (the SQL side of
timekeeper.budgets.status)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, select

from gpusharing.contract import BudgetState, Period
from gpusharing.idle.policy import IdlePolicy, stored
from gpusharing.names import is_group
from timekeeper.budgets.hierarchy import hierarchy_problem
from timekeeper.budgets.periods import UTC, iso_utc, period_window
from timekeeper.budgets.status import Budget, BudgetStatus, crossed
from timekeeper.database.budgets.reads import (
    ALL_BUDGETS,
    BUDGETS_OF,
    TOP_UPS,
    TOP_UPS_OF,
    USAGE,
    USAGE_OF,
    StatusReads,
    budget_of_row,
    window_parameters,
)
from timekeeper.database.connection import Database, Statements
from timekeeper.database.tables import (
    budget_changes,
    budget_warnings,
    budgets,
    namespace_states,
    top_ups,
)

Clock = Callable[[], dt.datetime]


def utc_now() -> dt.datetime:
    return dt.datetime.now(UTC)


class NoLimit(ValueError):
    """A top-up for a namespace whose budget is unlimited."""


class NoBudget(LookupError):
    """The namespace (or group) has no budget of its own."""


class Managed(RuntimeError):
    """The budget is owned by a GPUBudget or ClusterGPUBudget: the REST API may not change it."""


class HierarchyConflict(RuntimeError):
    """The change would break the hierarchy (a parent without a budget, a cycle, too deep, a group with children)."""


@dataclass(frozen=True)
class BudgetChange:
    status: BudgetStatus
    created: bool  # the namespace had no budget of its own before
    crossed: bool  # the change moved the namespace's state, or past a warning threshold


class BudgetStore:
    def __init__(
        self,
        db: Database,
        default_gpu_minutes: float | None = None,
        default_period: Period = Period.MONTHLY,
        clock: Clock = utc_now,
        default_idle: IdlePolicy | None = None,
    ):
        self.db = db
        self.default_gpu_minutes = default_gpu_minutes
        self.default_period = default_period
        # the default budget's idle policy: in force where no budget up a chain sets one
        self.default_idle = default_idle
        self.clock = clock

    # -- reads ---------------------------------------------------------------------------------------------------

    def status(self, namespace: str) -> BudgetStatus:
        """A namespace's status (the default budget's when it has none), or a group's (NoBudget when it has none)."""
        with self.db.read() as conn:
            return self.status_in(conn, namespace, self.clock())

    def status_in(self, conn: Connection, namespace: str, now: dt.datetime, lock: bool = False) -> BudgetStatus:
        """The status as seen by `conn` (lock: hold its budget row until the transaction ends)."""
        if lock and not self.db.is_sqlite:
            conn.execute(select(budgets.c.namespace).where(budgets.c.namespace == namespace).with_for_update())
        reads = self.read_use(conn, self.budget_rows(conn, [namespace]), [namespace], now)
        if is_group(namespace) and namespace not in reads.own:
            raise NoBudget(f"there is no group budget {namespace}")
        return reads.statuses()[namespace]

    def statuses(self) -> list[BudgetStatus]:
        """Every budget (namespaces' and groups'), and every other namespace with use or top-ups in its (default)
        period."""
        with self.db.read() as conn:
            return sorted(self.statuses_in(conn, None, self.clock()).values(), key=lambda status: status.namespace)

    def statuses_in(
        self, conn: Statements, namespaces: Collection[str] | None, now: dt.datetime
    ) -> dict[str, BudgetStatus]:
        """The statuses of `namespaces` (None: of every namespace `statuses` lists)."""
        return self.read_use(conn, self.budget_rows(conn, namespaces), namespaces, now).statuses()

    def budget_rows(self, conn: Statements, namespaces: Collection[str] | None) -> Iterable[Any]:
        """The budget rows of `namespaces` (None: all), to hand to read_use."""
        if namespaces is None:
            return conn.execute(ALL_BUDGETS)
        return conn.execute(BUDGETS_OF, {"namespaces": sorted(namespaces)})

    def read_use(
        self, conn: Statements, budget_rows: Iterable[Any], namespaces: Collection[str] | None, now: dt.datetime
    ) -> StatusReads:
        """Sends the reads of the use and top-ups in the current periods; StatusReads.statuses() has the result.

        Use is rolled up per period of each kind as it is charged, so a namespace's use in its current periods is a
        row per kind, however long its history. Names that are part of a hierarchy (a group, or a budget with a
        parent) need the whole of it: then every budget, use and top-up of the current periods is read, as for the
        listing.
        """
        own = {row.namespace: row for row in budget_rows}
        windows = {kind: period_window(kind, now) for kind in Period}
        parameters = window_parameters(windows)
        whole = namespaces is None or any(row.parent for row in own.values()) or any(is_group(n) for n in namespaces)
        if whole:
            others = conn.execute(ALL_BUDGETS) if namespaces is not None else ()
            used, topped = conn.execute(USAGE, parameters), conn.execute(TOP_UPS, parameters)
        else:
            others = ()
            parameters["namespaces"] = sorted(namespaces or ())  # not None here: `whole` otherwise
            used, topped = conn.execute(USAGE_OF, parameters), conn.execute(TOP_UPS_OF, parameters)
        default = Budget("", self.default_gpu_minutes, self.default_period, idle=self.default_idle)
        return StatusReads(default, own, namespaces, windows, used, topped, others)

    def budgets(self) -> dict[str, Budget]:
        """Every budget, namespaces' and groups'."""
        with self.db.read() as conn:
            return {row.namespace: budget_of_row(row) for row in conn.execute(ALL_BUDGETS)}

    def managed(self) -> dict[str, str]:
        """The budgets that resources own: name -> the resource (`GPUBudget ns/name`, `ClusterGPUBudget name`)."""
        with self.db.read() as conn:
            query = select(budgets.c.namespace, budgets.c.managed_by).where(budgets.c.managed_by.is_not(None))
            return {row.namespace: row.managed_by for row in conn.execute(query)}

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

    def set_budget(self, budget: Budget, actor: str, owner: str | None = None) -> BudgetChange:
        """Gives the namespace (or group) `budget`, in place of what it had. `owner`: the resource that owns it
        (the controller's writes); without one, a budget a resource owns is refused (Managed)."""
        return self._set_budget(budget.namespace, lambda _current: budget, actor, owner)

    def patch_budget(self, namespace: str, changes: Mapping[str, Any], actor: str) -> BudgetChange:
        """Changes only the fields of its budget that `changes` names (Budget's): of its own budget, or of the default
        one when it has none (the result becomes its own)."""
        return self._set_budget(namespace, lambda current: replace(current, **changes), actor, None)

    def _set_budget(
        self, namespace: str, change: Callable[[Budget], Budget], actor: str, owner: str | None
    ) -> BudgetChange:
        now = self.clock()
        with self.db.write() as conn:
            if lock := not self.db.is_sqlite:  # every budget: the hierarchy is checked against all of them
                conn.execute(select(budgets.c.namespace).with_for_update())
            rows = {row.namespace: row for row in conn.execute(ALL_BUDGETS)}
            existed = rows.get(namespace)
            self._check_owner(existed, namespace, owner)
            before = self._status_or_none(conn, namespace, now, lock)
            current = budget_of_row(existed) if existed is not None else Budget(
                namespace, self.default_gpu_minutes, self.default_period)
            budget = change(current)
            others = {name: budget_of_row(row) for name, row in rows.items() if name != namespace}
            problem = hierarchy_problem(others, namespace, budget.parent, parent_must_exist=owner is None)
            if problem:
                raise HierarchyConflict(problem)
            values = {
                "gpu_minutes": budget.gpu_minutes,
                "period": budget.period.value,
                "evict_on_exhaustion": budget.evict_on_exhaustion,
                "parent": budget.parent,
                "warning_thresholds": ",".join(map(str, budget.warning_thresholds)),
                "admission": budget.admission.value,
                "on_shortfall": budget.on_shortfall.value,
                "idle": stored(budget.idle),
                "managed_by": owner,
                "updated_at": now,
            }
            conn.execute(
                self.db.insert(budgets)
                .values(namespace=budget.namespace, created_at=now, **values)
                .on_conflict_do_update(index_elements=[budgets.c.namespace], set_=values)
            )
            after = self.status_in(conn, budget.namespace, now)
            self._audit(conn, budget.namespace, "set", actor, now, before if existed is not None else None, after)
        return BudgetChange(after, existed is None, before is None or crossed(before, after))

    def remove_budget(self, namespace: str, actor: str, owner: str | None = None) -> BudgetStatus | None:
        """Removes the budget (a namespace gets the default again; None for a group); NoBudget when it has none.

        `owner`: the resource that owned it (the controller's removal); without one, a budget a resource owns is
        refused (Managed), and so is a group with children (HierarchyConflict). A group's children removed by its
        resource keep naming it, and have no ancestor there until it is back.
        """
        now = self.clock()
        with self.db.write() as conn:
            row = conn.execute(BUDGETS_OF, {"namespaces": [namespace]}).first()
            if row is None:
                raise NoBudget(
                    f"{'group' if is_group(namespace) else 'namespace'} {namespace} has no budget of its own"
                )
            self._check_owner(row, namespace, owner)
            children = sorted(
                r.namespace for r in conn.execute(select(budgets.c.namespace).where(budgets.c.parent == namespace))
            )
            if children and owner is None:
                raise HierarchyConflict(
                    f"{namespace} is the parent of {', '.join(children[:10])}: give them another parent first"
                )
            before = self.status_in(conn, namespace, now, lock=True)
            conn.execute(budgets.delete().where(budgets.c.namespace == namespace))
            after = None if is_group(namespace) else self.status_in(conn, namespace, now)
            self._audit(conn, namespace, "remove", actor, now, before, None)
        return after

    def top_up(self, namespace: str, gpu_minutes: float, reason: str, actor: str) -> BudgetStatus:
        """Adds GPU-minutes to the current period of a namespace's (or group's) budget, whoever owns it; raises NoLimit
        when it is unlimited."""
        now = self.clock()
        with self.db.write() as conn:
            before = self.status_in(conn, namespace, now, lock=True)
            if before.gpu_minutes is None:
                raise NoLimit(f"{namespace} has no limit on GPU-minutes: a top-up would change nothing")
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
            self._audit(
                conn, namespace, "top-up", actor, now, before, after, {"gpuMinutes": gpu_minutes, "reason": reason}
            )
        return after

    @staticmethod
    def _check_owner(row: Any, namespace: str, owner: str | None) -> None:
        if row is not None and row.managed_by and owner is None:
            raise Managed(
                f"the budget of {namespace} is managed by the {row.managed_by} resource: change it with kubectl "
                "(through the REST API and the command line it may only be topped up)"
            )

    def _status_or_none(self, conn: Connection, namespace: str, now: dt.datetime, lock: bool) -> BudgetStatus | None:
        try:
            return self.status_in(conn, namespace, now, lock=lock)
        except NoBudget:  # a new group
            return None

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

    # -- the controller's bookkeeping
    # -----------------------------------------------------------------------------------

    def acted_states(self) -> dict[str, BudgetState]:
        with self.db.read() as conn:
            return {row.namespace: BudgetState(row.state) for row in conn.execute(select(namespace_states))}

    def claim_transition(self, namespace: str, state: BudgetState) -> BudgetState | None:
        """Records that the controller acts on `state`; returns the state it acted on before, or None when unchanged.

        The first controller to record a transition acts on it; any other finds it recorded and does nothing.
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

    def claim_warnings(self, namespace: str, period_start: dt.datetime, thresholds: Iterable[int]) -> list[int]:
        """Records that the thresholds are warned of in this period; returns those no one had recorded yet.

        The first controller to record a threshold warns of it; any other finds it recorded and does nothing.
        """
        now = self.clock()
        claimed = []
        with self.db.write() as conn:
            for threshold in sorted(set(thresholds)):
                inserted = conn.execute(
                    self.db.insert(budget_warnings)
                    .values(namespace=namespace, period_start=period_start, threshold=threshold, warned_at=now)
                    .on_conflict_do_nothing()
                    .returning(budget_warnings.c.threshold)
                ).first()
                if inserted is not None:
                    claimed.append(threshold)
        return claimed

    def release_warnings(self, namespace: str, period_start: dt.datetime, thresholds: Iterable[int]) -> None:
        """Gives back claimed thresholds whose warning could not be sent, so that the next pass tries again."""
        with self.db.write() as conn:
            conn.execute(budget_warnings.delete().where(
                budget_warnings.c.namespace == namespace,
                budget_warnings.c.period_start == period_start,
                budget_warnings.c.threshold.in_(list(thresholds)),
            ))

