"""Usage decayed with a half-life, exactly, from the ledger's intervals, kept as (usage, as of) so that a pass adds
only what is new: O(1) per namespace, whatever the history. The caller adds each stretch of the ledger once (a running
pod's bill since the last pass, not since it started). docs/fair-share.md (decayed usage) gives the formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

LN2 = math.log(2.0)


def half_life_seconds(half_life: timedelta) -> float:
    """The half-life in seconds, refused unless positive."""
    seconds = half_life.total_seconds()
    if not seconds > 0:
        raise ValueError(f"the half-life must be positive, not {half_life}")
    return seconds


def decay_factor(elapsed_seconds: float, half_life: float) -> float:
    """2^(-elapsed/half_life): what one GPU-second counts `elapsed_seconds` later (elapsed >= 0; 0.0 once
    negligible: a year under a half-life of seconds underflows to zero, never overflows)."""
    return math.exp(-elapsed_seconds * LN2 / half_life)


def interval_worth(duration_seconds: float, half_life: float) -> float:
    """What one GPU-second spread evenly over `duration_seconds` counts at the interval's end, in (0, 1]: 1 for an
    instant, 1 - d ln2 / (2h) for a short one, h / (d ln 2) for one much longer than the half-life.

    The integral of 2^(-(end - t)/h) / d over [start, end] is (1 - e^(-x)) / x with x = d ln 2 / h; computed as
    `-expm1(-x) / x` it stays exact for a microsecond under a half-life of a year, where `1 - e^(-x)` would lose every
    digit.
    """
    x = duration_seconds * LN2 / half_life
    return 1.0 if x == 0.0 else -math.expm1(-x) / x


def _aware(when: datetime, what: str) -> None:
    if when.tzinfo is None:
        raise ValueError(f"{what} must be an aware time (UTC), not the naive {when.isoformat()}")


@dataclass(frozen=True, slots=True)
class DecayedUsage:
    """Model-weighted GPU-seconds (as billed), each decayed by its age at `as_of`."""

    gpu_seconds: float
    as_of: datetime  # UTC, aware

    def __post_init__(self) -> None:
        if not (math.isfinite(self.gpu_seconds) and self.gpu_seconds >= 0):
            raise ValueError(
                f"decayed usage must be a finite number of GPU-seconds, at least 0, not {self.gpu_seconds!r}"
            )
        _aware(self.as_of, "the time of decayed usage")

    @classmethod
    def zero(cls, as_of: datetime) -> DecayedUsage:
        """Nothing used yet, as of `as_of`."""
        return cls(0.0, as_of)

    def at(self, when: datetime, half_life: timedelta) -> DecayedUsage:
        """The same usage decayed forward to `when`; unchanged for a time at or before `as_of` (never decayed back)."""
        h = half_life_seconds(half_life)
        _aware(when, "the time to decay to")
        if when <= self.as_of:
            return self
        return _figured(self.gpu_seconds * decay_factor((when - self.as_of).total_seconds(), h), when)

    def plus(self, gpu_seconds: float, start: datetime, end: datetime, half_life: timedelta) -> DecayedUsage:
        """With one interval of the ledger added: `gpu_seconds` billed at a constant rate over [start, end], decayed
        exactly; as of max(as_of, end). An interval that ended before `as_of` (a late report) is decayed to `as_of`,
        so the order in which intervals are added does not change the usage at a common time."""
        h = half_life_seconds(half_life)
        if not (math.isfinite(gpu_seconds) and gpu_seconds >= 0):
            raise ValueError(f"an interval's GPU-seconds must be a finite number, at least 0, not {gpu_seconds!r}")
        _aware(start, "an interval's start")
        _aware(end, "an interval's end")
        duration = (end - start).total_seconds()
        if duration < 0:
            raise ValueError(f"an interval cannot end ({end.isoformat()}) before it starts ({start.isoformat()})")
        worth = gpu_seconds * interval_worth(duration, h)
        if end >= self.as_of:
            carried = (
                self.gpu_seconds * decay_factor((end - self.as_of).total_seconds(), h) if self.gpu_seconds else 0.0
            )
            return _figured(carried + worth, end)
        return _figured(self.gpu_seconds + worth * decay_factor((self.as_of - end).total_seconds(), h), self.as_of)


def _figured(gpu_seconds: float, as_of: datetime) -> DecayedUsage:
    """Usage figured here from checked figures (sums of non-negative finite terms, factors within [0, 1]): built
    without checking again, which is most of what a pass's fold would otherwise spend."""
    usage = object.__new__(DecayedUsage)
    object.__setattr__(usage, "gpu_seconds", gpu_seconds)
    object.__setattr__(usage, "as_of", as_of)
    return usage
