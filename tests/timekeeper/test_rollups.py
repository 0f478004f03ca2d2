"""Budget statuses read from the per-period rollups (namespace_period_usage) are exactly those the daily rows give,
whatever the charges, across day, ISO week, month and year boundaries (and a leap day), in hierarchies, with
top-ups; on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import delete, select

from gpusharing.contract import Period
from gpusharing.report import MeterReport
from testbed.day_sums import day_sum_reads
from tests.timekeeper.conftest import Clock
from timekeeper.budgets.periods import period_starts
from timekeeper.budgets.status import Budget
from timekeeper.database.accounting.charging import ReportLedger
from timekeeper.database.budgets.store import BudgetStore
from timekeeper.database.connection import Database
from timekeeper.database.tables import Base, namespace_period_usage, namespace_usage

UTC = dt.timezone.utc
FIRST_DAY = dt.datetime(2027, 12, 20, tzinfo=UTC)  # a Monday; 100 days reach past 2028's leap day and two month ends
NAMESPACES = ("ns-a", "ns-b", "ns-c")
GROUP = "team.g"
LAST_MICROSECOND = 86_400 - 1e-6

charges = st.lists(
    st.tuples(st.sampled_from(NAMESPACES), st.integers(0, 100), st.sampled_from([0.0, 43_200.0, LAST_MICROSECOND]),
              st.integers(1, 4_000)),
    min_size=1, max_size=10,
)
budget_plans = st.tuples(
    st.sampled_from(list(Period)),  # the group's period
    st.lists(
        st.tuples(st.sampled_from(list(Period)), st.booleans()), min_size=len(NAMESPACES), max_size=len(NAMESPACES)
    ),
)
top_up_plans = st.lists(
    st.tuples(st.sampled_from([*NAMESPACES, GROUP]), st.integers(0, 100), st.integers(1, 50)), max_size=4
)


@pytest.fixture
def shared(database_url: str) -> Any:
    """One database for every example, emptied by each (a database per example would cost more than the example)."""
    database = Database(database_url)
    yield database
    database.dispose()


def emptied(database: Database) -> None:
    with database.write() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(delete(table))


def at(day: int, seconds: float = 43_200.0) -> dt.datetime:
    return FIRST_DAY + dt.timedelta(days=day, seconds=seconds)


@given(charged=charges, plan=budget_plans, top_ups=top_up_plans)
def test_statuses_from_rollups_equal_those_from_the_days(
    shared: Database, charged: list[tuple[str, int, float, int]], plan: tuple[Period, list[tuple[Period, bool]]],
    top_ups: list[tuple[str, int, int]],
) -> None:
    emptied(shared)
    clock = Clock(at(0))
    store = BudgetStore(shared, default_gpu_minutes=600.0, default_period=Period.WEEKLY, clock=clock)
    ledger = ReportLedger(store)
    group_period, namespaces = plan
    store.set_budget(Budget(GROUP, 10_000.0, group_period), "test")
    for name, (period, in_group) in zip(NAMESPACES, namespaces):
        if name != NAMESPACES[-1]:  # the last keeps the default budget
            store.set_budget(Budget(name, 1_000.0, period, parent=GROUP if in_group else None), "test")
    cumulative = dict.fromkeys(NAMESPACES, 0)
    seq = 0
    # In the order of time, as a replica's clock moves; a batch per instant, several pods' charges in one.
    for when in sorted({at(day, seconds) for _, day, seconds, _ in charged}):
        batch = []
        for name, day, seconds, gpu_seconds in charged:
            if at(day, seconds) == when:
                seq += 1
                cumulative[name] += gpu_seconds
                batch.append((MeterReport(f"uid-{name}", name, name, 1.0, seq, float(cumulative[name])), None))
        clock.at = when
        ledger.record(batch)
    for name, day, gpu_minutes in top_ups:
        clock.at = at(day)
        store.top_up(name, float(gpu_minutes), "test", "test")
    # Read at the first and the last microsecond of every day charged or topped up.
    for day in sorted({d for _, d, _, _ in charged} | {d for _, d, _ in top_ups}):
        for now in (at(day, 0.0), at(day, LAST_MICROSECOND)):
            for asked in (None, [NAMESPACES[0]], [NAMESPACES[-1]]):  # all (the hierarchy's path), one, one alone
                with shared.read() as conn:
                    assert store.statuses_in(conn, asked, now) == day_sum_reads(store, conn, asked, now).statuses(), (
                        now,
                        asked,
                    )


def test_each_days_charges_roll_up_into_the_period_of_each_kind_it_lies_in(shared: Database) -> None:
    clock = Clock(at(0))
    ledger = ReportLedger(BudgetStore(shared, clock=clock))
    days = (0, 6, 7, 11, 12, 42, 70, 71, 72)  # a Monday, Sunday, Monday, Dec 31, Jan 1, Jan 31, Feb 28, 29, Mar 1
    for seq, day in enumerate(days, start=1):
        clock.at = at(day, LAST_MICROSECOND)
        ledger.record([(MeterReport("uid-a", "ns-a", "trainer", 1.0, seq, float(seq)), None)])
    with shared.read() as conn:
        rolled = {
            (row.period, row.period_start): row.micro_gpu_seconds
            for row in conn.execute(select(namespace_period_usage))
        }
        daily = {row.day: row.micro_gpu_seconds for row in conn.execute(select(namespace_usage))}
    expected: dict[tuple[str, dt.date], int] = {}
    for day, micro in daily.items():
        for kind, start in period_starts(day).items():
            expected[kind.value, start] = expected.get((kind.value, start), 0) + micro
    assert rolled == expected
    assert rolled["none", dt.date(1970, 1, 1)] == 9_000_000  # a GPU-second a report, each charged once
    assert rolled["weekly", dt.date(2027, 12, 27)] == 3_000_000  # Monday 27 Dec to Sunday 2 Jan: Dec 27, 31 and Jan 1
    assert rolled["monthly", dt.date(2028, 2, 1)] == 2_000_000  # Feb 28 and the leap day
    assert period_starts(dt.date(2028, 1, 1)) == {
        Period.DAILY: dt.date(2028, 1, 1),
        Period.WEEKLY: dt.date(2027, 12, 27),
        Period.MONTHLY: dt.date(2028, 1, 1),
        Period.NONE: dt.date(1970, 1, 1),
    }
