"""Budget periods and their UTC boundaries. Plain data, no Flask, no SQL."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gpusharing.contract import Period

UTC = dt.timezone.utc
# The beginning of the one period a budget with period `none` has.
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class PeriodWindow:
    """One period of a budget: from `start` (a UTC midnight, or the epoch for period `none`) up to `end`, not
    included."""

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
        following = (
            first.replace(year=first.year + 1, month=1) if first.month == 12 else first.replace(month=first.month + 1)
        )
        return PeriodWindow(first, following)
    return PeriodWindow(EPOCH, None)


def usage_day(at: dt.datetime) -> dt.date:
    """The UTC day whose usage bucket a report received at `at` is charged to (every period is made of whole days)."""
    return at.astimezone(UTC).date()


def period_starts(day: dt.date) -> dict[Period, dt.date]:
    """The first day of the period of each kind that the UTC day `day` lies in: where a charge of that day rolls up
    (namespace_period_usage), and, for the current day, where a status reads its use."""
    midnight = dt.datetime(day.year, day.month, day.day, tzinfo=UTC)
    return {kind: period_window(kind, midnight).start.date() for kind in Period}


def iso_utc(at: dt.datetime) -> str:
    """An instant as the API writes it: RFC 3339, UTC, whole seconds."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
