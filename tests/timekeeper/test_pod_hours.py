"""Charges by the hour their time was used in (pod_hours, written with every charge; docs/chargeback.md, "By the
hour"), on SQLite and PostgreSQL: a pod running across hours and midnight is split exactly, its day rows and the usage
report follow the hours, a correction is taken back from the hours it was billed in, and time that arrives after its
billing period closed is booked as a correction in the hour it came."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from gpusharing.contract import Period
from gpusharing.report import MeterReport
from gpusharing.usage_report import UsageRequest
from tests.timekeeper.conftest import Clock
from timekeeper.accounting.ledger import Observation
from timekeeper.chargeback.calendar import BillingCalendar
from timekeeper.database.accounting.charging import PodObservation, ReportLedger, ReportTerms
from timekeeper.database.budgets.store import BudgetStore
from timekeeper.database.connection import Database
from timekeeper.database.tables import pod_hours, pod_ledgers, pod_usage

UTC = dt.timezone.utc
START = dt.datetime(2026, 11, 30, 22, 30, tzinfo=UTC)  # 90 minutes before a month ends
MICRO = 1_000_000
DAILY = BillingCalendar(Period.DAILY, dt.timedelta(minutes=30))


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


@pytest.fixture
def ledger(database_url: str, clock: Clock) -> Iterator[ReportLedger]:
    db = Database(database_url)
    yield ReportLedger(BudgetStore(db, clock=clock), calendar=DAILY)
    db.dispose()


def observed(until: dt.datetime, ended: bool = False, share: float = 0.5, node: str = "gpu-1") -> PodObservation:
    return PodObservation("uid-1", "ml", "trainer", share, Observation(share, START, until, ended), node=node)


def hours(ledger: ReportLedger) -> dict[tuple[dt.datetime, dt.datetime], int]:
    """The pod's hours: (hour used, hour booked) -> raw micro-GPU-seconds (a row a correction emptied, left out)."""
    with ledger.db.read() as conn:
        rows = conn.execute(select(pod_hours).where(pod_hours.c.pod_uid == "uid-1")).all()
    return {(row.hour, row.booked_hour): row.micro_gpu_seconds for row in rows if row.micro_gpu_seconds}


def at(day: int, hour: int, minute: int = 0, second: int = 0) -> dt.datetime:
    return dt.datetime(2026, 11 if day <= 30 else 12, day if day <= 30 else day - 30, hour, minute, second, tzinfo=UTC)


def test_a_pod_across_midnight_is_split_by_the_hours_and_days_it_ran_in(ledger: ReportLedger, clock: Clock) -> None:
    clock.at = at(31, 0, 20)
    ledger.observe([observed(clock.at)])  # one pass after a long silence: 22:30 to 00:20 at half a GPU
    assert hours(ledger) == {
        (at(30, 22), at(30, 22)): 900 * MICRO, (at(30, 23), at(30, 23)): 1800 * MICRO,
        (at(31, 0), at(31, 0)): 600 * MICRO}
    with ledger.db.read() as conn:
        days = {row.day: row.micro_gpu_seconds for row in conn.execute(select(pod_usage))}
        node = conn.execute(select(pod_ledgers.c.node)).scalar_one()
    assert days == {dt.date(2026, 11, 30): 2700 * MICRO, dt.date(2026, 12, 1): 600 * MICRO}
    assert node == "gpu-1"
    report = ledger.usage.report(UsageRequest(dt.date(2026, 12, 1), dt.date(2026, 12, 2), ("namespace",)))
    assert report.total.micro_gpu_seconds == 600 * MICRO  # the usage report's days are the hours'
    # The budget counts a charge when it is made: all of it on the day of the pass.
    assert ledger.budgets.status("ml").used_micro_gpu_seconds == 3300 * MICRO


def test_a_correction_is_taken_back_from_the_hours_it_was_billed_in(ledger: ReportLedger, clock: Clock) -> None:
    clock.at = at(30, 23, 0, 4)
    ledger.observe([observed(clock.at)])  # billed to 23:00:04 while its containers had finished at 22:59:58
    clock.at = at(30, 23, 0, 6)
    ledger.observe([observed(at(30, 22, 59, 58), ended=True)])
    assert hours(ledger) == {(at(30, 22), at(30, 22)): 899 * MICRO}  # the hour after holds nothing


def test_time_arriving_after_its_period_closed_is_a_correction_booked_when_it_came(
        ledger: ReportLedger, clock: Clock) -> None:
    clock.at = at(30, 23, 30)
    ledger.observe([observed(clock.at)])
    # The controller was away: the next pass comes after November 30 closed (midnight and 30 minutes' grace).
    clock.at = at(31, 0, 45)
    ledger.observe([observed(clock.at)])
    assert hours(ledger) == {
        (at(30, 22), at(30, 22)): 900 * MICRO,
        (at(30, 23), at(30, 23)): 900 * MICRO,  # charged while the day was open
        (at(30, 23), at(31, 0)): 900 * MICRO,  # its last half hour came late: booked in the hour it came
        (at(31, 0), at(31, 0)): 1350 * MICRO,
    }


def test_a_meter_with_no_recorded_start_is_placed_in_the_hour_it_reported(ledger: ReportLedger, clock: Clock) -> None:
    clock.at = at(31, 1, 5)
    report = MeterReport("uid-1", "ml", "trainer", 0.5, 1, 7200.0)
    ledger.record([(report, ReportTerms(0.5, None, node="gpu-1"))])
    assert hours(ledger) == {(at(31, 1), at(31, 1)): 7200 * MICRO}
