"""The one Clock a process reckons by: `now()`, the time of day things are recorded at (in a timekeeper, the
database's, the one truth every replica shares), and `monotonic()`, for intervals and waits, which no change of the
time of day moves. Each is injected where it is read, so that a test drives both by advancing one clock instead of
reaching into a component's fields."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def now(self) -> dt.datetime:
        """The time of day, in UTC."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary start that only move forward."""


class SystemClock:
    """This process's clocks."""

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()


class ReadClock:
    """The time of day from `read` (a test's clock, or the database's), the monotonic clock from `monotonic`."""

    def __init__(self, read: Callable[[], dt.datetime], monotonic: Callable[[], float] = time.monotonic):
        self._read = read
        self._monotonic = monotonic

    def now(self) -> dt.datetime:
        return self._read()

    def monotonic(self) -> float:
        return self._monotonic()
