"""The billing calendar (timekeeper/chargeback/calendar.py) and its settings: periods of UTC days, weeks or months,
each open for late time until its grace has passed, then closed: what comes later is booked in the hour it came."""

from __future__ import annotations

import datetime as dt

import pytest

from gpusharing.contract import Period
from gpusharing.settings.env import ConfigError
from timekeeper.chargeback.calendar import MONTHLY, BillingCalendar
from timekeeper.config import TimekeeperConfig

UTC = dt.timezone.utc
LAST_HOUR = dt.datetime(2026, 11, 30, 23, tzinfo=UTC)


def test_a_month_is_open_until_its_grace_has_passed_then_late_time_is_booked_when_it_came() -> None:
    assert MONTHLY.closes_at(LAST_HOUR) == dt.datetime(2026, 12, 1, 1, tzinfo=UTC)
    assert MONTHLY.booked(LAST_HOUR, dt.datetime(2026, 12, 1, 0, 59, 59, tzinfo=UTC)) == LAST_HOUR
    assert MONTHLY.booked(LAST_HOUR, dt.datetime(2026, 12, 1, 1, 0, 0, tzinfo=UTC)) == dt.datetime(
        2026, 12, 1, 1, tzinfo=UTC)
    assert MONTHLY.booked(LAST_HOUR, dt.datetime(2027, 3, 5, 7, 59, tzinfo=UTC)) == dt.datetime(
        2027, 3, 5, 7, tzinfo=UTC)


def test_weeks_and_days_close_at_their_utc_ends() -> None:
    weekly = BillingCalendar(Period.WEEKLY, dt.timedelta(0))
    assert weekly.closes_at(LAST_HOUR) == dt.datetime(2026, 12, 7, tzinfo=UTC)  # Monday 00:00
    daily = BillingCalendar(Period.DAILY, dt.timedelta(minutes=5))
    assert daily.closes_at(LAST_HOUR) == dt.datetime(2026, 12, 1, 0, 5, tzinfo=UTC)


def test_a_calendar_without_end_or_with_negative_grace_is_refused() -> None:
    with pytest.raises(ValueError, match="daily, weekly or monthly"):
        BillingCalendar(Period.NONE)
    with pytest.raises(ValueError, match="negative"):
        BillingCalendar(Period.DAILY, dt.timedelta(seconds=-1))


def test_the_settings_choose_the_period_the_grace_sharing_and_the_cluster_name() -> None:
    assert TimekeeperConfig.from_env({}).chargeback.calendar == MONTHLY
    chargeback = TimekeeperConfig.from_env({
        "TIMEKEEPER_BILLING_PERIOD": "weekly", "TIMEKEEPER_BILLING_GRACE": "6h",
        "TIMEKEEPER_SHARE_UNALLOCATED": "true", "TIMEKEEPER_CLUSTER_NAME": "prod-eu-1"}).chargeback
    assert chargeback.calendar == BillingCalendar(Period.WEEKLY, dt.timedelta(hours=6))
    assert chargeback.share_unallocated and chargeback.cluster == "prod-eu-1"


@pytest.mark.parametrize(("name", "value", "message"), [
    ("TIMEKEEPER_BILLING_PERIOD", "none", "TIMEKEEPER_BILLING_PERIOD"),
    ("TIMEKEEPER_BILLING_GRACE", "8d", "TIMEKEEPER_BILLING_GRACE"),
    ("TIMEKEEPER_BILLING_GRACE", "soon", "TIMEKEEPER_BILLING_GRACE"),
    ("TIMEKEEPER_CLUSTER_NAME", "Prod_EU", "DNS label"),
])
def test_bad_chargeback_settings_are_refused_naming_the_setting(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TimekeeperConfig.from_env({name: value})
