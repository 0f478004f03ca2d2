"""Where on the clock a pod's charges lie (timekeeper/accounting/hours.py): each charge split by the UTC hour its time
was used in, the parts adding up to it to the micro-GPU-second whatever the rounding, corrections taken back from the
hours they were billed in, and integer amounts apportioned exactly."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from timekeeper.accounting.hours import apportion, charge_hours, hour_of
from timekeeper.accounting.ledger import share_time

UTC = dt.timezone.utc
START = dt.datetime(2026, 11, 29, 9, 40, tzinfo=UTC)
MICRO = 1_000_000


def at(hour: int, minute: int = 0, second: int = 0) -> dt.datetime:
    return dt.datetime(2026, 11, 29, hour, minute, second, tzinfo=UTC)


def test_a_charge_within_one_hour_lies_in_that_hour() -> None:
    assert charge_hours(0, 300 * MICRO, START, 0.5, at(9, 50)) == {at(9): 300 * MICRO}


def test_a_charge_across_hours_is_cut_at_each_hour_by_the_share_held_in_it() -> None:
    # A half share from 09:40 to 11:10: 20 minutes in the 9 o'clock hour, 60 in the 10, 10 in the 11.
    billed = share_time(0.5, START, at(11, 10))
    assert charge_hours(0, billed, START, 0.5, at(11, 10)) == {
        at(9): 600 * MICRO, at(10): 1800 * MICRO, at(11): 300 * MICRO}


def test_a_later_charge_continues_where_the_bill_had_reached() -> None:
    first = share_time(0.25, START, at(10, 5))
    second = share_time(0.25, START, at(12, 0, 30))
    assert charge_hours(first, second, START, 0.25, at(12, 0, 30)) == {
        at(10): 825 * MICRO, at(11): 900 * MICRO, at(12): 7_500_000}


def test_a_correction_is_taken_back_from_the_hours_the_time_was_billed_in() -> None:
    # Billed to 11:00:02 by a pass that still saw the pod running; its containers finished at 10:59:59.
    billed = share_time(1.0, START, at(11, 0, 2))
    ended = share_time(1.0, START, at(10, 59, 59))
    assert charge_hours(billed, ended, START, 1.0, at(11, 0, 5)) == {at(10): -MICRO, at(11): -2 * MICRO}


def test_a_bill_beyond_the_clock_lies_in_the_hour_it_was_made_and_one_without_a_start_too() -> None:
    # A meter claimed an hour before the start was recorded: what the clock since the start cannot hold is now's.
    assert charge_hours(0, 3600 * MICRO, START, 1.0, at(9, 50)) == {at(9): 3600 * MICRO}
    assert charge_hours(0, 3600 * MICRO, START, 1.0, at(10, 10)) == {at(9): 1200 * MICRO, at(10): 2400 * MICRO}
    assert charge_hours(5, 17, None, 0.5, at(13, 59, 59)) == {at(13): 12}
    assert charge_hours(7, 7, START, 0.5, at(13)) == {}


@given(
    share=st.floats(min_value=0.001, max_value=8.0),
    cuts=st.lists(st.integers(min_value=0, max_value=40 * 3600 * MICRO), min_size=2, max_size=8),
    started_minutes=st.integers(min_value=0, max_value=59),
)
def test_any_sequence_of_charges_adds_up_exactly_hour_by_hour_to_the_bill_laid_from_the_start(
        share: float, cuts: list[int], started_minutes: int) -> None:
    started = at(0, started_minutes, 7)
    now = started + dt.timedelta(hours=48)
    bills = sorted(min(cut, share_time(share, started, now)) for cut in cuts)
    total: dict[dt.datetime, int] = {}
    for before, after in zip(bills, bills[1:]):
        parts = charge_hours(before, after, started, share, now)
        assert sum(parts.values()) == after - before
        assert all(part > 0 for part in parts.values())
        for hour, part in parts.items():
            total[hour] = total.get(hour, 0) + part
    # However the bill was charged, each hour holds what the share made in it, but for where the first charge began.
    whole = charge_hours(bills[0], bills[-1], started, share, now)
    assert {hour: part for hour, part in total.items() if part} == whole


def test_hour_of_is_the_utc_hour() -> None:
    assert hour_of(dt.datetime(2026, 11, 29, 11, 59, 59, 999_999, tzinfo=dt.timezone(dt.timedelta(hours=2)))) == at(9)


@given(total=st.integers(min_value=-10**15, max_value=10**15),
       weights=st.lists(st.integers(min_value=1, max_value=10**12), min_size=1, max_size=30))
def test_apportioned_parts_add_up_to_the_total_and_each_is_within_one_of_its_exact_share(
        total: int, weights: list[int]) -> None:
    sign = -1 if total < 0 else 1
    parts = apportion(total, [sign * weight for weight in weights])
    assert sum(parts) == total
    for part, weight in zip(parts, weights):
        assert abs(part * sum(weights) - total * weight) < sum(weights)


def test_apportioning_gives_what_rounding_left_to_the_largest_remainders_first() -> None:
    assert apportion(10, [1, 1, 1]) == [4, 3, 3]
    assert apportion(-10, [-1, -1, -1]) == [-4, -3, -3]
    assert apportion(5, [1, 2, 2]) == [1, 2, 2]
    assert apportion(0, [3, 4]) == [0, 0]
