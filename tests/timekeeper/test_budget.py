"""Budget arithmetic and period boundaries, without HTTP or a database."""

from __future__ import annotations

import datetime as dt

import pytest

from gpusharing.contract import AdmissionMode, BudgetState, Period, Shortfall
from gpusharing.names import InvalidName
from gpusharing.units.weights import MICROS_PER_GPU_MINUTE
from timekeeper.budgets.periods import EPOCH, PeriodWindow, period_window, usage_day
from timekeeper.budgets.requests import (
    BudgetRequestError,
    budget_changes_from_json,
    budget_from_json,
    top_up_from_json,
)
from timekeeper.budgets.status import Budget, BudgetStatus, effective_budget, state_for

UTC = dt.timezone.utc


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC) if "+" not in text else dt.datetime.fromisoformat(text)


@pytest.mark.parametrize(
    ("period", "instant", "start", "end"),
    [
        (Period.DAILY, "2028-02-28T23:59:59", "2028-02-28", "2028-02-29"),
        (Period.DAILY, "2028-02-29T00:00:00", "2028-02-29", "2028-03-01"),
        (Period.DAILY, "2026-12-31T12:00:00", "2026-12-31", "2027-01-01"),
        (Period.MONTHLY, "2028-02-29T12:00:00", "2028-02-01", "2028-03-01"),  # leap year February
        (Period.MONTHLY, "2027-02-28T23:59:59", "2027-02-01", "2027-03-01"),
        (Period.MONTHLY, "2026-01-31T23:59:59.999999", "2026-01-01", "2026-02-01"),
        (Period.MONTHLY, "2026-04-30T10:00:00", "2026-04-01", "2026-05-01"),  # a 30-day month
        (Period.MONTHLY, "2026-12-15T00:00:00", "2026-12-01", "2027-01-01"),  # the year turns
        (Period.MONTHLY, "2026-03-01T00:00:00", "2026-03-01", "2026-04-01"),  # exactly on a boundary
        (Period.WEEKLY, "2026-11-21T05:00:00", "2026-11-16", "2026-11-23"),  # a Saturday: Monday to Monday
        (Period.WEEKLY, "2026-11-16T00:00:00", "2026-11-16", "2026-11-23"),  # a Monday midnight starts a week
        (Period.WEEKLY, "2027-01-01T08:00:00", "2026-12-28", "2027-01-04"),  # a week across the new year
        (Period.WEEKLY, "2028-03-01T00:00:00", "2028-02-28", "2028-03-06"),  # a week across a leap day
    ],
)
def test_periods_begin_and_end_at_utc_midnight(period: Period, instant: str, start: str, end: str) -> None:
    assert period_window(period, at(instant)) == PeriodWindow(at(start + "T00:00:00"), at(end + "T00:00:00"))


def test_boundaries_are_utc_whatever_the_time_zone_of_the_instant() -> None:
    # 01:30 on 1 March in UTC+02:00 is still 28 February in UTC.
    instant = dt.datetime(2027, 3, 1, 1, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert period_window(Period.MONTHLY, instant).start == at("2027-02-01T00:00:00")
    assert usage_day(instant) == dt.date(2027, 2, 28)


def test_period_none_never_ends() -> None:
    window = period_window(Period.NONE, at("2030-06-01T00:00:00"))
    assert window == PeriodWindow(EPOCH, None)
    assert window.contains(at("2999-01-01T00:00:00"))


def test_naive_instants_are_refused() -> None:
    with pytest.raises(ValueError):
        period_window(Period.DAILY, dt.datetime(2026, 1, 1))


def test_each_period_contains_its_instant_and_the_next_begins_where_it_ends() -> None:
    instant = at("2024-01-31T22:00:00")
    for period in (Period.DAILY, Period.WEEKLY, Period.MONTHLY):
        window = period_window(period, instant)
        assert window.contains(instant)
        assert window.end is not None
        following = period_window(period, window.end)
        assert following.start == window.end and not window.contains(window.end)


@pytest.mark.parametrize(
    ("allowance", "used_minutes", "state"),
    [
        (None, 10_000, BudgetState.UNLIMITED),
        (100.0, 99.999, BudgetState.IN_BUDGET),
        (100.0, 100.0, BudgetState.OVER_BUDGET),  # used >= allowance
        (100.0, 250.0, BudgetState.OVER_BUDGET),
        (0.0, 0.0, BudgetState.OVER_BUDGET),  # a zero budget allows no GPU time at all
    ],
)
def test_state(allowance: float | None, used_minutes: float, state: BudgetState) -> None:
    assert state_for(allowance, round(used_minutes * MICROS_PER_GPU_MINUTE)) is state


def test_top_ups_add_to_the_allowance_and_remaining_never_goes_below_zero() -> None:
    window = period_window(Period.MONTHLY, at("2026-05-05T00:00:00"))
    status = BudgetStatus("team-a", 100.0, Period.MONTHLY, window, 130 * MICROS_PER_GPU_MINUTE, 50.0, False)
    assert status.allowance_gpu_minutes == 150.0
    assert status.remaining_gpu_minutes == 20.0
    assert status.state is BudgetState.WARNING and status.crossed_thresholds == (80,)  # 87 % of 150, not 130 % of 100
    spent = BudgetStatus("team-a", 100.0, Period.MONTHLY, window, 170 * MICROS_PER_GPU_MINUTE, 50.0, False)
    assert spent.remaining_gpu_minutes == 0.0 and spent.state is BudgetState.OVER_BUDGET
    assert (
        spent.to_json()["periodStart"] == "2026-05-01T00:00:00Z"
        and spent.to_json()["periodEnd"] == "2026-06-01T00:00:00Z"
    )


def test_a_namespace_without_a_budget_gets_the_default() -> None:
    own = Budget("team-a", 10.0, Period.DAILY, True)
    assert effective_budget("team-a", own, 500.0, Period.MONTHLY) is own
    assert effective_budget("team-b", None, 500.0, Period.WEEKLY) == Budget("team-b", 500.0, Period.WEEKLY)
    assert effective_budget("team-b", None, None, Period.MONTHLY).gpu_minutes is None


def test_budget_requests() -> None:
    assert budget_from_json(
        "team-a", {"gpuMinutes": 6000, "period": "monthly", "evictOnExhaustion": True}, Period.DAILY
    ) == Budget("team-a", 6000.0, Period.MONTHLY, True)
    assert budget_from_json("team-a", {"gpuMinutes": None}, Period.WEEKLY) == Budget(
        "team-a", None, Period.WEEKLY, False
    )


def test_safe_admissions_settings_default_to_open_and_demote_and_are_taken_as_given() -> None:
    plain = budget_from_json("team-a", {"gpuMinutes": 10}, Period.MONTHLY)
    assert (plain.admission, plain.on_shortfall) == (AdmissionMode.OPEN, Shortfall.DEMOTE)
    safe = budget_from_json("team-a", {"gpuMinutes": 10, "admission": "safe", "onShortfall": "refuse"}, Period.MONTHLY)
    assert safe == Budget("team-a", 10.0, Period.MONTHLY, admission=AdmissionMode.SAFE, on_shortfall=Shortfall.REFUSE)
    grouped = budget_from_json("team.vision", {"gpuMinutes": 10, "admission": "strict"}, Period.MONTHLY)
    assert grouped.admission is AdmissionMode.STRICT  # a group may carry it (it acts on namespaces' own budgets)
    assert budget_changes_from_json({"onShortfall": "refuse"}) == {"on_shortfall": Shortfall.REFUSE}
    assert budget_changes_from_json({"admission": "open"}) == {"admission": AdmissionMode.OPEN}
    window = period_window(Period.MONTHLY, at("2026-05-05T00:00:00"))
    status = BudgetStatus("team-a", 10.0, Period.MONTHLY, window, 0, 0.0, False, admission=AdmissionMode.SAFE)
    assert (status.to_json()["admission"], status.to_json()["onShortfall"]) == ("safe", "demote")


@pytest.mark.parametrize(
    ("namespace", "body", "message"),
    [
        ("team-a", [], "the body must be a JSON object"),
        ("team-a", {}, "missing field(s): gpuMinutes"),
        ("team-a", {"gpuMinutes": 1, "owner": "x"}, "unknown field(s): owner"),
        ("team-a", {"gpuMinutes": "100"}, "gpuMinutes must be a number"),
        ("team-a", {"gpuMinutes": True}, "gpuMinutes must be a number"),
        ("team-a", {"gpuMinutes": -1}, "gpuMinutes must be a finite number, at least 0 and at most 1e+12, not -1"),
        ("team-a", {"gpuMinutes": float("nan")}, "gpuMinutes must be a finite number"),
        ("team-a", {"gpuMinutes": float("inf")}, "gpuMinutes must be a finite number"),
        ("team-a", {"gpuMinutes": 1e13}, "at most 1e+12"),
        (
            "team-a",
            {"gpuMinutes": 1, "period": "yearly"},
            "period must be one of daily, weekly, monthly, none, not 'yearly'",
        ),
        ("team-a", {"gpuMinutes": 1, "evictOnExhaustion": "yes"}, "evictOnExhaustion must be true or false"),
        ("team-a", {"gpuMinutes": 1, "admission": "x"}, "admission must be one of open, safe, strict, not 'x'"),
        ("team-a", {"gpuMinutes": 1, "admission": "SAFE"}, "admission must be one of open, safe, strict, not 'SAFE'"),
        ("team-a", {"gpuMinutes": 1, "admission": None}, "admission must be one of open, safe, strict, not None"),
        ("team-a", {"gpuMinutes": 1, "onShortfall": "evict"}, "onShortfall must be one of demote, refuse, not 'evict'"),
        (
            "team-a",
            {"gpuMinutes": 1, "onShortfall": ["refuse"]},
            "onShortfall must be one of demote, refuse, not ['refuse']",
        ),
        ("Team_A", {"gpuMinutes": 1}, "'Team_A' is not a namespace name"),
        ("a" * 64, {"gpuMinutes": 1}, "is not a namespace name"),
    ],
)
def test_bad_budget_requests_say_what_is_wrong(namespace: str, body: object, message: str) -> None:
    with pytest.raises((BudgetRequestError, InvalidName)) as refused:
        budget_from_json(namespace, body, Period.MONTHLY)
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"gpuMinutes": 0, "reason": "x"}, "gpuMinutes must be a finite number, greater than 0"),
        ({"gpuMinutes": -5, "reason": "x"}, "greater than 0"),
        ({"gpuMinutes": 5}, "missing field(s): reason"),
        ({"gpuMinutes": 5, "reason": "  "}, "reason must be a non-empty line of printable text"),
        ({"gpuMinutes": 5, "reason": "x" * 1001}, "at most 1000 characters"),
    ],
)
def test_bad_top_ups_say_what_is_wrong(body: object, message: str) -> None:
    with pytest.raises(BudgetRequestError) as refused:
        top_up_from_json(body)
    assert message in str(refused.value)


def test_top_up_request() -> None:
    assert top_up_from_json({"gpuMinutes": 120, "reason": " deadline "}) == (120.0, "deadline")
