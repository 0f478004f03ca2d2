"""The meter's interval as the contract states it: one setting, read alike by every role within one set of bounds, and
the one rule of freshness that follows from it (a reading is fresh, and a meter not yet silent, for two intervals)."""

from __future__ import annotations

import inspect

import pytest

from gpusharing.contract import (
    DEFAULT_METER_INTERVAL_SECONDS,
    MAX_METER_INTERVAL_SECONDS,
    METER_INTERVAL_SETTING,
    MIN_METER_INTERVAL_SECONDS,
    fresh_for,
)
from gpusharing.settings.env import ConfigError
from gpusharing.settings.meter import meter_interval_seconds


def test_the_setting_is_gpusharing_meter_interval_seconds_thirty_by_default() -> None:
    assert METER_INTERVAL_SETTING == "GPUSHARING_METER_INTERVAL_SECONDS"
    assert meter_interval_seconds({}) == DEFAULT_METER_INTERVAL_SECONDS == 30.0
    assert meter_interval_seconds({"GPUSHARING_METER_INTERVAL_SECONDS": " "}) == 30.0
    assert meter_interval_seconds({"GPUSHARING_METER_INTERVAL_SECONDS": "12.5"}) == 12.5


@pytest.mark.parametrize("seconds", [MIN_METER_INTERVAL_SECONDS, MAX_METER_INTERVAL_SECONDS])
def test_the_bounds_themselves_are_accepted(seconds: float) -> None:
    assert meter_interval_seconds({"GPUSHARING_METER_INTERVAL_SECONDS": f"{seconds:g}"}) == seconds


@pytest.mark.parametrize(("raw", "message"), [
    ("0.01", "GPUSHARING_METER_INTERVAL_SECONDS='0.01' must be a finite number from 0.05 to 300"),
    ("301", "GPUSHARING_METER_INTERVAL_SECONDS='301' must be a finite number from 0.05 to 300"),
    ("nan", "GPUSHARING_METER_INTERVAL_SECONDS='nan' must be a finite number from 0.05 to 300"),
    ("30s", "GPUSHARING_METER_INTERVAL_SECONDS='30s' must be a finite number"),
])
def test_an_interval_out_of_bounds_is_refused_naming_the_setting_and_the_bounds(raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        meter_interval_seconds({"GPUSHARING_METER_INTERVAL_SECONDS": raw})
    assert str(refused.value) == message


@pytest.mark.parametrize(
    "interval", [MIN_METER_INTERVAL_SECONDS, 10.0, DEFAULT_METER_INTERVAL_SECONDS, MAX_METER_INTERVAL_SECONDS]
)
def test_a_reading_is_fresh_for_two_meter_intervals(interval: float) -> None:
    assert fresh_for(interval) == 2 * interval
    assert fresh_for(DEFAULT_METER_INTERVAL_SECONDS) == 60.0  # not the 90 s the report path once kept apart


def test_a_meter_silent_for_the_longest_interval_is_still_counted_running() -> None:
    """The timekeeper stops counting a pod it has not heard from for a quarter of an hour as running (the report
    ledger's stale_seconds): a meter must turn silent well before."""
    from timekeeper.database.accounting.charging import ReportLedger

    stale_seconds = inspect.signature(ReportLedger).parameters["stale_seconds"].default
    assert fresh_for(MAX_METER_INTERVAL_SECONDS) < stale_seconds == 900.0
