"""Usage decayed by a half-life, kept as (GPU-seconds, as of): O(1) to move forward, exact for a ledger's intervals.

Minimal version for branch `fairwire` (the wiring); the `fairshare` branch's replaces it at merge."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class DecayedUsage:
    gpu_seconds: float  # model-weighted GPU-seconds (as billed), decayed to `as_of`
    as_of: datetime  # UTC, aware

    @classmethod
    def zero(cls, as_of: datetime) -> DecayedUsage:
        return cls(0.0, as_of)

    def at(self, when: datetime, half_life: timedelta) -> DecayedUsage:
        """Decayed forward to `when`; an earlier `when` leaves it unchanged."""
        if when <= self.as_of:
            return self
        return DecayedUsage(self.gpu_seconds * _factor(when - self.as_of, half_life), when)

    def plus(self, gpu_seconds: float, start: datetime, end: datetime, half_life: timedelta) -> DecayedUsage:
        """With one ledger interval billed at a constant rate over [start, end], decayed exactly: the integral of
        rate * 2^(-(T - t)/h) dt; as of max(self.as_of, end)."""
        until = max(self.as_of, end)
        base = self.at(until, half_life)
        if gpu_seconds <= 0:
            return base
        seconds = (end - start).total_seconds()
        if seconds <= 0:
            added = gpu_seconds * _factor(until - end, half_life)
        else:
            h = half_life.total_seconds()
            added = gpu_seconds / seconds * h / math.log(2) * (_factor(until - end, half_life) - _factor(until - start, half_life))
        return DecayedUsage(base.gpu_seconds + added, until)


def _factor(elapsed: timedelta, half_life: timedelta) -> float:
    return float(2.0 ** (-elapsed.total_seconds() / half_life.total_seconds()))
