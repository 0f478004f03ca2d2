"""The billing calendar: the periods chargeback books GPU time in, and when each closes, after which time that arrives
for it is booked as a correction in the period open then, never into the closed one (docs/chargeback.md, "Closed
periods and corrections")."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gpusharing.contract import Period
from timekeeper.accounting.hours import hour_of
from timekeeper.budgets.periods import PeriodWindow, period_window

BILLING_PERIODS = (Period.DAILY, Period.WEEKLY, Period.MONTHLY)


@dataclass(frozen=True)
class BillingCalendar:
    """Billing periods of one kind (UTC, as budget periods are), each open for late time until `grace` after its end."""

    period: Period = Period.MONTHLY
    grace: dt.timedelta = dt.timedelta(hours=1)

    def __post_init__(self) -> None:
        if self.period not in BILLING_PERIODS:
            raise ValueError(f"a billing period is daily, weekly or monthly, not {self.period}")
        if self.grace < dt.timedelta(0):
            raise ValueError("a billing period's grace cannot be negative")

    def period_of(self, at: dt.datetime) -> PeriodWindow:
        return period_window(self.period, at)

    def closes_at(self, at: dt.datetime) -> dt.datetime:
        """When the billing period of the instant `at` closes: its end, and the grace."""
        end = self.period_of(at).end
        assert end is not None  # every billing period ends
        return end + self.grace

    def booked(self, hour: dt.datetime, now: dt.datetime) -> dt.datetime:
        """The hour time used in `hour` and charged at `now` is booked in: its own while its period is open, else the
        hour it was charged in (a correction of a closed period)."""
        return hour if now < self.closes_at(hour) else hour_of(now)


MONTHLY = BillingCalendar()  # the default: calendar months, open an hour past their end
