"""Budget arithmetic: periods, their UTC boundaries, and a namespace's state. Plain data, no Flask, no SQL."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, TypeVar

from gpusharing.contract import AdmissionMode, BudgetState, Shortfall
from gpusharing.names import InvalidName, check_budget_name, is_group
from gpusharing.thresholds import DEFAULT_WARNING_THRESHOLDS, check_warning_thresholds

UTC = dt.timezone.utc
# Usage is kept in micro-GPU-seconds (integers) so that sums over any number of reports are exact.
MICROS_PER_GPU_MINUTE = 60_000_000
# The beginning of the one period a budget with period `none` has.
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)


class Period(StrEnum):
    DAILY = "daily"
    WEEKLY = "weekly"  # ISO weeks: Monday 00:00 UTC to the next Monday
    MONTHLY = "monthly"
    NONE = "none"  # the budget never renews


@dataclass(frozen=True)
class PeriodWindow:
    start: dt.datetime
    end: dt.datetime | None  # None: the period never ends

    def contains(self, at: dt.datetime) -> bool:
        return self.start <= at and (self.end is None or at < self.end)


def period_window(period: Period, at: dt.datetime) -> PeriodWindow:
    """The period of kind `period` that contains the instant `at` (an aware datetime; boundaries are UTC midnights)."""
    if at.tzinfo is None:
        raise ValueError("period boundaries need an aware datetime")
    day = at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period is Period.DAILY:
        return PeriodWindow(day, day + dt.timedelta(days=1))
    if period is Period.WEEKLY:
        monday = day - dt.timedelta(days=day.weekday())
        return PeriodWindow(monday, monday + dt.timedelta(days=7))
    if period is Period.MONTHLY:
        first = day.replace(day=1)
        following = first.replace(year=first.year + 1, month=1) if first.month == 12 else first.replace(month=first.month + 1)
        return PeriodWindow(first, following)
    return PeriodWindow(EPOCH, None)


def usage_day(at: dt.datetime) -> dt.date:
    """The UTC day whose usage bucket a report received at `at` is charged to (every period is made of whole days)."""
    return at.astimezone(UTC).date()


# Ancestors above a namespace's budget (a team, a department, an organisation, ...): bounds every walk up a chain.
MAX_ANCESTORS = 4
# How bad a state is: a namespace's effective state is the worst of its own budget's and its ancestors'.
SEVERITY = {BudgetState.UNKNOWN: 0, BudgetState.UNLIMITED: 1, BudgetState.IN_BUDGET: 2, BudgetState.WARNING: 3,
            BudgetState.OVER_BUDGET: 4}


@dataclass(frozen=True)
class Budget:
    """What an admin set for a namespace, or for a group (`namespace` is then the group's name, e.g. team.vision);
    gpu_minutes None means no limit."""

    namespace: str
    gpu_minutes: float | None
    period: Period
    evict_on_exhaustion: bool = False
    parent: str | None = None  # a group budget's name
    warning_thresholds: tuple[int, ...] = DEFAULT_WARNING_THRESHOLDS
    # Safe admission's settings: they act on a namespace's own budget; a group's may carry them, to no effect.
    admission: AdmissionMode = AdmissionMode.OPEN
    on_shortfall: Shortfall = Shortfall.DEMOTE


@dataclass(frozen=True)
class BudgetStatus:
    """A budget in its current period. `used` is the namespace's use, or for a group its descendants' use summed
    in the group's own period; `ancestors` (parent first) carry their own use, and decide the effective `state`."""

    namespace: str
    gpu_minutes: float | None
    period: Period
    window: PeriodWindow
    used_micro_gpu_seconds: int
    top_up_gpu_minutes: float
    evict_on_exhaustion: bool
    parent: str | None = None
    warning_thresholds: tuple[int, ...] = DEFAULT_WARNING_THRESHOLDS
    managed_by: str | None = None  # the GPUBudget or ClusterGPUBudget that owns it (the REST API may not change it)
    ancestors: tuple[BudgetStatus, ...] = ()
    admission: AdmissionMode = AdmissionMode.OPEN
    on_shortfall: Shortfall = Shortfall.DEMOTE

    @property
    def used_gpu_minutes(self) -> float:
        return self.used_micro_gpu_seconds / MICROS_PER_GPU_MINUTE

    @property
    def allowance_gpu_minutes(self) -> float | None:
        """The budget plus this period's top-ups; None when unlimited."""
        return None if self.gpu_minutes is None else self.gpu_minutes + self.top_up_gpu_minutes

    @property
    def remaining_gpu_minutes(self) -> float | None:
        allowance = self.allowance_gpu_minutes
        return None if allowance is None else max(0.0, allowance - self.used_gpu_minutes)

    @property
    def percent_used(self) -> float | None:
        """Use as a percent of the allowance; None when unlimited, 100 for a budget of 0 (it allows nothing)."""
        allowance = self.allowance_gpu_minutes
        if allowance is None:
            return None
        return 100.0 if allowance <= 0 else 100.0 * self.used_gpu_minutes / allowance

    @property
    def crossed_thresholds(self) -> tuple[int, ...]:
        """The warning thresholds this period's use has reached."""
        return crossed_thresholds(self.allowance_gpu_minutes, self.used_micro_gpu_seconds, self.warning_thresholds)

    @property
    def own_state(self) -> BudgetState:
        """The state of this budget alone."""
        return state_for(self.allowance_gpu_minutes, self.used_micro_gpu_seconds, self.warning_thresholds)

    @property
    def state(self) -> BudgetState:
        """The effective state: the worst of its own and its ancestors' (over budget when any of them is)."""
        return max((status.own_state for status in (self, *self.ancestors)), key=SEVERITY.__getitem__)

    @property
    def limited_by(self) -> str | None:
        """The budget (this one, or the nearest ancestor) whose own state is the effective state; None when unlimited."""
        state = self.state
        if state is BudgetState.UNLIMITED:
            return None
        return next(status.namespace for status in (self, *self.ancestors) if status.own_state is state)

    @property
    def kind(self) -> str:
        return "group" if is_group(self.namespace) else "namespace"

    def warning_json(self) -> dict[str, Any]:
        """What the webhook and the Events say of a budget above a warning threshold (gpusharing.thresholds)."""
        return {
            "budget": self.namespace,
            "percentUsed": round(self.percent_used or 0.0, 1),
            "gpuMinutes": self.allowance_gpu_minutes,
            "period": str(self.period),
            "periodStart": iso_utc(self.window.start),
        }

    def to_json(self) -> dict[str, Any]:
        percent = self.percent_used
        return {
            "namespace": self.namespace,
            "kind": self.kind,
            "gpuMinutes": self.gpu_minutes,
            "period": str(self.period),
            "periodStart": iso_utc(self.window.start),
            "periodEnd": iso_utc(self.window.end) if self.window.end else None,
            "usedGpuMinutes": self.used_gpu_minutes,
            "remainingGpuMinutes": self.remaining_gpu_minutes,
            "topUpGpuMinutes": self.top_up_gpu_minutes,
            "percentUsed": None if percent is None else round(percent, 1),
            "evictOnExhaustion": self.evict_on_exhaustion,
            "warningThresholds": list(self.warning_thresholds),
            "admission": str(self.admission),
            "onShortfall": str(self.on_shortfall),
            "parent": self.parent,
            "ancestors": [status.namespace for status in self.ancestors],
            "managedBy": self.managed_by,
            "ownState": str(self.own_state),
            "state": str(self.state),
            "limitedBy": self.limited_by,
            "warnings": [status.warning_json() for status in (self, *self.ancestors) if status.own_state is BudgetState.WARNING],
        }


def state_for(
    allowance_gpu_minutes: float | None, used_micro_gpu_seconds: int, warning_thresholds: tuple[int, ...] = ()
) -> BudgetState:
    """Over budget once the use reaches the allowance (budget plus top-ups; a zero budget allows nothing); a warning
    from the lowest warning threshold on."""
    if allowance_gpu_minutes is None:
        return BudgetState.UNLIMITED
    if used_micro_gpu_seconds >= allowance_gpu_minutes * MICROS_PER_GPU_MINUTE:
        return BudgetState.OVER_BUDGET
    if crossed_thresholds(allowance_gpu_minutes, used_micro_gpu_seconds, warning_thresholds[:1]):
        return BudgetState.WARNING
    return BudgetState.IN_BUDGET


def crossed_thresholds(
    allowance_gpu_minutes: float | None, used_micro_gpu_seconds: int, warning_thresholds: tuple[int, ...]
) -> tuple[int, ...]:
    """The thresholds (percent of the allowance) that the use has reached; none when unlimited."""
    if allowance_gpu_minutes is None:
        return ()
    allowance = allowance_gpu_minutes * MICROS_PER_GPU_MINUTE
    return tuple(t for t in warning_thresholds if used_micro_gpu_seconds * 100 >= t * allowance)


def ancestry(budgets: Mapping[str, Budget], name: str) -> list[str]:
    """The names above `name`, parent first, as far as they have budgets; at most MAX_ANCESTORS, never a loop."""
    chain: list[str] = []
    parent = budgets[name].parent if name in budgets else None
    while parent is not None and parent in budgets and parent != name and parent not in chain and len(chain) < MAX_ANCESTORS:
        chain.append(parent)
        parent = budgets[parent].parent
    return chain


def hierarchy_problem(budgets: Mapping[str, Budget], name: str, parent: str | None, parent_must_exist: bool = True) -> str | None:
    """Why `name` may not have `parent` among `budgets` (the other budgets' parents as they are), or None.

    A parent is a group budget; no budget is its own ancestor; no chain is longer than MAX_ANCESTORS above a
    namespace, counting the groups below `name` too.
    """
    if parent is None:
        return None
    if not is_group(parent):
        return f"the parent {parent!r} of {name} is a namespace: a parent is a group budget (a name with a dot, e.g. team.vision)"
    if parent == name:
        return f"{name} cannot be its own parent: {name} -> {name} is a cycle"
    if parent not in budgets:
        return f"the parent of {name} is {parent}, which has no budget: set the group's budget first" if parent_must_exist else None
    chain = [parent]
    while True:
        if chain[-1] == name:
            return f"{name} cannot have the parent {parent}: {' -> '.join([name, *chain])} is a cycle"
        above = budgets[chain[-1]].parent if chain[-1] in budgets else None
        if above is None or above in chain:
            break
        chain.append(above)
    # A group is itself above the namespaces below it, with the groups between them.
    levels = len(chain) + (1 + _height(budgets, name) if is_group(name) else 0)
    if levels > MAX_ANCESTORS:
        return f"{name} cannot have the parent {parent}: {levels} levels of budgets above a namespace, more than {MAX_ANCESTORS}"
    return None


def _height(budgets: Mapping[str, Budget], name: str, depth: int = 0) -> int:
    """How many levels of group budgets lie below `name` (0 for a namespace or a group without children)."""
    if depth > MAX_ANCESTORS:
        return depth
    children = [child for child, budget in budgets.items() if budget.parent == name and child != name]
    return max((1 + _height(budgets, child, depth + 1) for child in children), default=0)


UsageByPeriod = Mapping[str, Mapping[Period, int]]  # name -> kind of period -> micro-GPU-seconds in its current one
TopUpsByPeriod = Mapping[str, Mapping[Period, float]]


def roll_up(
    budgets: Mapping[str, Budget],
    used: UsageByPeriod,
    topped: TopUpsByPeriod,
    windows: Mapping[Period, PeriodWindow],
    managed_by: Mapping[str, str] | None = None,
) -> dict[str, BudgetStatus]:
    """Every budget's status: a namespace's use is its own, a group's the sum of its descendants' in the group's
    own period; each status carries its ancestors' (Slurm's Grp* limits: a namespace is over budget when it or any
    ancestor is). A parent without a budget is no ancestor."""
    chains = {name: ancestry(budgets, name) for name in budgets}
    group_used: dict[str, int] = {}
    for name, chain in chains.items():
        if is_group(name):
            continue
        for ancestor in chain:
            kind = budgets[ancestor].period
            group_used[ancestor] = group_used.get(ancestor, 0) + used.get(name, {}).get(kind, 0)
    alone = {
        name: BudgetStatus(
            name,
            budget.gpu_minutes,
            budget.period,
            windows[budget.period],
            group_used.get(name, 0) if is_group(name) else used.get(name, {}).get(budget.period, 0),
            topped.get(name, {}).get(budget.period, 0.0),
            budget.evict_on_exhaustion,
            budget.parent,
            budget.warning_thresholds,
            (managed_by or {}).get(name),
            admission=budget.admission,
            on_shortfall=budget.on_shortfall,
        )
        for name, budget in budgets.items()
    }
    return {name: replace(status, ancestors=tuple(alone[a] for a in chains[name])) for name, status in alone.items()}


def default_budget_json(gpu_minutes: float | None, period: Period) -> dict[str, Any]:
    """The default budget as `GET /api/v1/budgets` tells it: what holds for every namespace the listing leaves out
    (no budget of its own, no use and no top-up this period), whose state is that of no use at all."""
    return {"gpuMinutes": gpu_minutes, "period": str(period), "state": str(state_for(gpu_minutes, 0))}


def effective_budget(namespace: str, budget: Budget | None, default_gpu_minutes: float | None, default_period: Period) -> Budget:
    """The namespace's own budget, or the default one (unlimited when no default is configured)."""
    if budget is not None:
        return budget
    return Budget(namespace, default_gpu_minutes, default_period)


def crossed(before: BudgetStatus, after: BudgetStatus) -> bool:
    """Whether the change from `before` to `after` deserves the controller's attention at once: the effective state
    changed, or the budget reached a warning threshold it had not."""
    return before.state is not after.state or before.crossed_thresholds != after.crossed_thresholds


def iso_utc(at: dt.datetime) -> str:
    """An instant as the API writes it: RFC 3339, UTC, whole seconds."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class BudgetRequestError(ValueError):
    """A budget or top-up request that must be refused; the message says why."""


MAX_GPU_MINUTES = 1e12  # far beyond any fleet's month; rejects typos that would read as "unlimited"
MAX_REASON = 1000


BUDGET_FIELDS = {"gpuMinutes": "gpu_minutes", "period": "period", "evictOnExhaustion": "evict_on_exhaustion",
                 "parent": "parent", "warningThresholds": "warning_thresholds", "admission": "admission",
                 "onShortfall": "on_shortfall"}


def budget_from_json(name: str, body: object, default_period: Period) -> Budget:
    """A budget from `PUT /api/v1/budgets/{name}`: gpuMinutes (a number, or null for unlimited), period,
    evictOnExhaustion, parent, warningThresholds, admission, onShortfall."""
    fields = _object(body, required=("gpuMinutes",), optional=tuple(key for key in BUDGET_FIELDS if key != "gpuMinutes"))
    given = _budget_fields(fields)
    return replace(Budget(check_budget_name(name), given["gpu_minutes"], default_period), **given)


def budget_changes_from_json(body: object) -> dict[str, Any]:
    """The changes of `PATCH /api/v1/budgets/{namespace}`: the fields it names, at least one, as Budget's."""
    changes = _budget_fields(_object(body, required=(), optional=tuple(BUDGET_FIELDS)))
    if not changes:
        raise BudgetRequestError(f"name at least one of {', '.join(BUDGET_FIELDS)}")
    return changes


def _budget_fields(fields: dict[str, Any]) -> dict[str, Any]:
    given: dict[str, Any] = {}
    if "gpuMinutes" in fields:
        raw = fields["gpuMinutes"]
        given["gpu_minutes"] = None if raw is None else _minutes(raw, "gpuMinutes", allow_zero=True)
    if "period" in fields:
        given["period"] = _one_of(fields["period"], "period", Period)
    if "evictOnExhaustion" in fields:
        if not isinstance(fields["evictOnExhaustion"], bool):
            raise BudgetRequestError("evictOnExhaustion must be true or false")
        given["evict_on_exhaustion"] = fields["evictOnExhaustion"]
    if "parent" in fields:
        parent = fields["parent"]
        if parent is not None and not isinstance(parent, str):
            raise BudgetRequestError("parent must be a group budget's name (e.g. team.vision), or null for none")
        if parent is not None and not is_group(parent):
            raise BudgetRequestError(f"parent {parent!r} is a namespace's name: a parent is a group budget (a name with a dot, e.g. team.vision)")
        try:
            given["parent"] = None if parent is None else check_budget_name(parent, "parent")
        except InvalidName as exc:
            raise BudgetRequestError(str(exc)) from None
    if "warningThresholds" in fields:
        try:
            given["warning_thresholds"] = check_warning_thresholds(fields["warningThresholds"])
        except ValueError as exc:
            raise BudgetRequestError(str(exc)) from None
    if "admission" in fields:
        given["admission"] = _one_of(fields["admission"], "admission", AdmissionMode)
    if "onShortfall" in fields:
        given["on_shortfall"] = _one_of(fields["onShortfall"], "onShortfall", Shortfall)
    return given


Choice = TypeVar("Choice", bound=StrEnum)


def _one_of(value: object, key: str, choices: type[Choice]) -> Choice:
    if not isinstance(value, str) or value not in tuple(choices):
        raise BudgetRequestError(f"{key} must be one of {', '.join(choices)}, not {value!r}")
    return choices(value)


def top_up_from_json(body: object) -> tuple[float, str]:
    """GPU-minutes and reason from `POST /api/v1/budgets/{namespace}/top-ups`."""
    fields = _object(body, required=("gpuMinutes", "reason"), optional=())
    reason = fields["reason"]
    # Printable: no control characters (a database refuses NUL) and no lone surrogates (not UTF-8).
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON or not reason.isprintable():
        raise BudgetRequestError(f"reason must be a non-empty line of printable text of at most {MAX_REASON} characters")
    return _minutes(fields["gpuMinutes"], "gpuMinutes", allow_zero=False), reason.strip()


def _object(body: object, required: tuple[str, ...], optional: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BudgetRequestError("the body must be a JSON object")
    unknown = sorted(set(body) - set(required) - set(optional))
    if unknown:
        raise BudgetRequestError(f"unknown field(s): {', '.join(unknown)}")
    missing = [key for key in required if key not in body]
    if missing:
        raise BudgetRequestError(f"missing field(s): {', '.join(missing)}")
    return body


def _minutes(value: object, key: str, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BudgetRequestError(f"{key} must be a number")
    low_ok = value >= 0 if allow_zero else value > 0  # false for NaN too
    if not low_ok or value > MAX_GPU_MINUTES:
        bound = "at least 0" if allow_zero else "greater than 0"
        raise BudgetRequestError(f"{key} must be a finite number, {bound} and at most {MAX_GPU_MINUTES:g}, not {value}")
    return float(value)
