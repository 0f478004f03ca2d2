"""A dependency's outage as a loop that keeps trying it sees it: one log line when the outage starts (what failed,
and how the role carries on meanwhile), one when it ends (how long it lasted, how many attempts failed), and for
the attempts in between nothing above debug. A loop that polls every few seconds would otherwise write a line per
attempt for as long as the outage lasts, in every process. Only the standard library: the meter uses it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any


class Outage:
    """What one loop knows of `dependency` (e.g. "the timekeeper at http://…"): up, or down since when."""

    def __init__(self, log: logging.Logger, dependency: str, attempts: str = "attempts",
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`attempts`: what the loop calls one try, for the closing line ("polls", "reports")."""
        self._log = log
        self._dependency = dependency
        self._attempts = attempts
        self._clock = clock
        self._since: float | None = None
        self._failures = 0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, reason: object, meanwhile: str, **fields: Any) -> None:
        """An attempt failed for `reason`; the first of an outage is logged with `meanwhile` (how the role degrades)."""
        self._failures += 1
        if self._since is None:
            self._since = self._clock()
            self._log.warning("%s is unavailable: %s; %s (logged again when it is back)", self._dependency, reason,
                              meanwhile, extra={"outage": "started", **fields})
        else:
            self._log.debug("%s still unavailable (%d %s failed): %s", self._dependency, self._failures, self._attempts,
                            reason, extra=fields)

    def succeeded(self, restored: str = "", **fields: Any) -> None:
        """An attempt succeeded; the first after an outage is logged with its length, and `restored` (what is right
        again)."""
        if self._since is None:
            return
        lasted = format_duration(self._clock() - self._since)
        self._log.info("%s is back after %s (%d %s failed)%s", self._dependency, lasted, self._failures, self._attempts,
                       f": {restored}" if restored else "", extra={"outage": "ended", **fields})
        self._since = None
        self._failures = 0


def format_duration(seconds: float) -> str:
    """`45 s`, `2 min 13 s`, `1 h 02 min`: as long as an outage is read."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes, rest = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
