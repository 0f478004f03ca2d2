"""Budget arithmetic: periods, their UTC boundaries, and a namespace's state. Plain data, no Flask, no SQL."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpusharing.contract import BudgetState
from gpusharing.names import check_namespace

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


@dataclass(frozen=True)
class Budget:
    """What an admin set for a namespace; gpu_minutes None means no limit."""

    namespace: str
    gpu_minutes: float | None
    period: Period
    evict_on_exhaustion: bool = False


@dataclass(frozen=True)
class BudgetStatus:
    namespace: str
    gpu_minutes: float | None
    period: Period
    window: PeriodWindow
    used_micro_gpu_seconds: int
    top_up_gpu_minutes: float
    evict_on_exhaustion: bool

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
    def state(self) -> BudgetState:
        return state_for(self.allowance_gpu_minutes, self.used_micro_gpu_seconds)

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "gpuMinutes": self.gpu_minutes,
            "period": str(self.period),
            "periodStart": iso_utc(self.window.start),
            "periodEnd": iso_utc(self.window.end) if self.window.end else None,
            "usedGpuMinutes": self.used_gpu_minutes,
            "remainingGpuMinutes": self.remaining_gpu_minutes,
            "topUpGpuMinutes": self.top_up_gpu_minutes,
            "evictOnExhaustion": self.evict_on_exhaustion,
            "state": str(self.state),
        }


def state_for(allowance_gpu_minutes: float | None, used_micro_gpu_seconds: int) -> BudgetState:
    """Over budget once the use reaches the allowance (budget plus top-ups); a zero budget allows nothing."""
    if allowance_gpu_minutes is None:
        return BudgetState.UNLIMITED
    if used_micro_gpu_seconds >= allowance_gpu_minutes * MICROS_PER_GPU_MINUTE:
        return BudgetState.OVER_BUDGET
    return BudgetState.IN_BUDGET


def default_budget_json(gpu_minutes: float | None, period: Period) -> dict[str, Any]:
    """The default budget as `GET /api/v1/budgets` tells it: what holds for every namespace the listing leaves out
    (no budget of its own, no use and no top-up this period), whose state is that of no use at all."""
    return {"gpuMinutes": gpu_minutes, "period": str(period), "state": str(state_for(gpu_minutes, 0))}


def effective_budget(namespace: str, budget: Budget | None, default_gpu_minutes: float | None, default_period: Period) -> Budget:
    """The namespace's own budget, or the default one (unlimited when no default is configured)."""
    if budget is not None:
        return budget
    return Budget(namespace, default_gpu_minutes, default_period)


def crossed_into_over_budget(before: BudgetState, after: BudgetState) -> bool:
    return before is not BudgetState.OVER_BUDGET and after is BudgetState.OVER_BUDGET


def iso_utc(at: dt.datetime) -> str:
    """An instant as the API writes it: RFC 3339, UTC, whole seconds."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class BudgetRequestError(ValueError):
    """A budget or top-up request that must be refused; the message says why."""


MAX_GPU_MINUTES = 1e12  # far beyond any fleet's month; rejects typos that would read as "unlimited"
MAX_REASON = 1000


BUDGET_FIELDS = {"gpuMinutes": "gpu_minutes", "period": "period", "evictOnExhaustion": "evict_on_exhaustion"}


def budget_from_json(namespace: str, body: object, default_period: Period) -> Budget:
    """A budget from `PUT /api/v1/budgets/{namespace}`: gpuMinutes (a number, or null for unlimited), period, evictOnExhaustion."""
    fields = _object(body, required=("gpuMinutes",), optional=("period", "evictOnExhaustion"))
    given = _budget_fields(fields)
    return Budget(check_namespace(namespace), given["gpu_minutes"], given.get("period", default_period),
                  given.get("evict_on_exhaustion", False))


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
        if fields["period"] not in tuple(Period):
            raise BudgetRequestError(f"period must be one of {', '.join(Period)}, not {fields['period']!r}")
        given["period"] = Period(fields["period"])
    if "evictOnExhaustion" in fields:
        if not isinstance(fields["evictOnExhaustion"], bool):
            raise BudgetRequestError("evictOnExhaustion must be true or false")
        given["evict_on_exhaustion"] = fields["evictOnExhaustion"]
    return given


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
