"""The timekeeper's time in a cluster: the database's, which every replica reads alike, where their own clocks may
differ by seconds.

Read every RESYNC_SECONDS and carried forward by the monotonic clock in between, so that a report batch or a status
read costs no extra round trip: off by half a round trip and the monotonic clock's drift, milliseconds at most.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError

RESYNC_SECONDS = 10.0


class DatabaseClock:
    """The timekeeper's Clock (gpusharing.clock) in a cluster: now() by the database's time, which `read` reads
    (Database.now); monotonic() the process's."""

    def __init__(self, read: Callable[[], dt.datetime], resync_seconds: float = RESYNC_SECONDS,
                 monotonic: Callable[[], float] = time.monotonic):
        self.read = read
        self.resync_seconds = resync_seconds
        self._monotonic = monotonic
        self._lock = threading.Lock()
        # The database's time and the monotonic instant it was read at; None until the first read.
        self._read: tuple[dt.datetime, float] | None = None
        self._next_read = 0.0  # monotonic: when to read it again

    def monotonic(self) -> float:
        return self._monotonic()

    def now(self) -> dt.datetime:
        if self._read is None or self._monotonic() >= self._next_read:
            self._resync()
        read = self._read
        assert read is not None  # the first resync raised otherwise
        at, monotonic = read
        return at + dt.timedelta(seconds=self._monotonic() - monotonic)

    def _resync(self) -> None:
        with self._lock:
            if self._read is not None and self._monotonic() < self._next_read:
                return  # another thread just read it (a first read is waited for: there is nothing to carry on)
            # Not again before the interval, even when it fails: a database down would otherwise cost every caller a
            # connection attempt; the last reading carries on meanwhile (without one, the failure is the caller's).
            self._next_read = self._monotonic() + self.resync_seconds
            try:
                before = self._monotonic()
                now = self.read()
                after = self._monotonic()
            except SQLAlchemyError:
                if self._read is None:
                    self._next_read = 0.0
                    raise
                return
            self._read = (now, (before + after) / 2)  # the server read its clock about halfway through
