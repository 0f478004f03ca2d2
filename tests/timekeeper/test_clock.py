"""The timekeeper's time in a cluster is the database's (timekeeper.database.clock): read every few seconds and
carried forward by the monotonic clock; a test clock (TIMEKEEPER_CLOCK) replaces it."""

from __future__ import annotations

import datetime as dt
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy.exc import OperationalError

from timekeeper.config import TimekeeperConfig
from timekeeper.database.clock import DatabaseClock
from timekeeper.services import build_services, build_stores

UTC = dt.timezone.utc
DATABASE_TIME = dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)  # nothing like this machine's


class Monotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Readings:
    """The database's time as Database.now gives it, counted; `down`: the database cannot be reached."""

    def __init__(self) -> None:
        self.times = [DATABASE_TIME, DATABASE_TIME + dt.timedelta(seconds=12)]
        self.count = 0
        self.down = False

    def __call__(self) -> dt.datetime:
        if self.down:
            raise OperationalError("SELECT clock_timestamp()", {}, Exception("connection refused"))
        self.count += 1
        return self.times[self.count - 1]


def test_the_databases_time_is_carried_forward_and_read_again_after_the_interval() -> None:
    monotonic, readings = Monotonic(), Readings()
    clock = DatabaseClock(readings, resync_seconds=10.0, monotonic=monotonic)
    assert clock.now() == DATABASE_TIME and readings.count == 1
    monotonic.now += 9.5
    assert clock.now() == DATABASE_TIME + dt.timedelta(seconds=9.5) and readings.count == 1  # no round trip
    monotonic.now += 0.5
    # the database says 12 s passed
    assert clock.now() == DATABASE_TIME + dt.timedelta(seconds=12) and readings.count == 2


def test_a_database_down_at_a_reading_leaves_the_last_one_in_force_and_is_asked_again_after_the_interval() -> None:
    monotonic, readings = Monotonic(), Readings()
    clock = DatabaseClock(readings, resync_seconds=10.0, monotonic=monotonic)
    clock.now()
    readings.down = True
    monotonic.now += 10.0
    assert clock.now() == DATABASE_TIME + dt.timedelta(seconds=10)
    monotonic.now += 5.0
    # not asked meanwhile: no connection attempt per call
    assert clock.now() == DATABASE_TIME + dt.timedelta(seconds=15)
    readings.down = False
    monotonic.now += 5.0
    assert clock.now() == DATABASE_TIME + dt.timedelta(seconds=12) and readings.count == 2


def test_without_a_reading_the_databases_failure_is_the_callers_and_the_next_call_asks_again() -> None:
    monotonic, readings = Monotonic(), Readings()
    readings.down = True
    clock = DatabaseClock(readings, resync_seconds=10.0, monotonic=monotonic)
    with pytest.raises(OperationalError):
        clock.now()
    readings.down = False
    assert clock.now() == DATABASE_TIME


def test_a_served_timekeeper_reckons_by_the_databases_time_and_a_test_clock_replaces_it(database_url: str) -> None:
    stores = build_stores(TimekeeperConfig(database_url=database_url, auth="none"))
    assert isinstance(stores.clock, DatabaseClock)  # what the web replicas' and the controller's stores reckon by
    stores.database.dispose()
    services = build_services(TimekeeperConfig(database_url=database_url, auth="none"))
    before, now, after = services.database.now(), services.budgets.clock(), services.database.now()
    assert now.tzinfo is not None and before - dt.timedelta(seconds=1) <= now <= after + dt.timedelta(seconds=1)
    services.reports.close()
    services.database.dispose()
    tested = build_stores(
        TimekeeperConfig(database_url=database_url, auth="none", clock="tests.timekeeper.fake_clock:now")
    )
    assert not isinstance(tested.clock, DatabaseClock)
    tested.database.dispose()


def test_requests_that_come_while_the_first_reading_is_under_way_wait_for_it() -> None:
    """The first requests after a start arrive together: none may find the clock without a reading (a 500)."""
    reading = threading.Event()

    def slow_first_read() -> dt.datetime:
        reading.wait(5)  # held until every caller has come
        return DATABASE_TIME

    clock = DatabaseClock(slow_first_read)
    with ThreadPoolExecutor(8) as callers:
        answers = [callers.submit(clock.now) for _ in range(8)]
        reading.set()
        # Each is the database's time (carried forward by the moments since it was read), none the machine's own.
        assert all(
            dt.timedelta(0) <= answer.result(timeout=10) - DATABASE_TIME < dt.timedelta(hours=1) for answer in answers
        )
