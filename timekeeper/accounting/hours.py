"""Where on the clock a pod's charges lie: each charge split by the UTC hour its GPU time was used in, exactly (the
hours of a charge add up to it, to the micro-GPU-second), for the capacity ledger and the FOCUS export
(docs/chargeback.md, "By the hour").

A pod's bill is its share held from its recorded start on: its first B micro-GPU-seconds are the time from the start
to where the share has made B. A charge that takes the bill from B0 to B1 is that stretch of the clock, cut at each
hour; the cuts are the bill's own integer at each hour boundary, so the parts telescope to B1 - B0 whatever the
rounding. A bill the clock cannot hold (a meter's claim before the start was recorded) lies in the hour it was made.
"""

from __future__ import annotations

import datetime as dt

from gpusharing.units.weights import MICROS_PER_SECOND
from timekeeper.accounting.ledger import share_time

HOUR = dt.timedelta(hours=1)


def hour_of(at: dt.datetime) -> dt.datetime:
    """The UTC hour `at` lies in (an aware datetime)."""
    return at.astimezone(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)


def charge_hours(
    before: int, after: int, started_at: dt.datetime | None, share: float | None, now: dt.datetime
) -> dict[dt.datetime, int]:
    """The charge that took a pod's bill from `before` to `after` micro-GPU-seconds (made at `now`; negative for a
    correction), by the hour its time was used in; none for no charge."""
    if after == before:
        return {}
    if after < before:
        return {hour: -part for hour, part in charge_hours(after, before, started_at, share, now).items()}
    if started_at is None or not share or started_at > now:
        return {hour_of(now): after - before}
    first, last = _position(before, started_at, share, now), _position(after, started_at, share, now)
    parts: dict[dt.datetime, int] = {}
    hour, cut = hour_of(first), before
    while hour < hour_of(last):
        boundary = hour + HOUR
        reached = min(after, max(cut, share_time(share, started_at, boundary)))
        if reached > cut:
            parts[hour] = reached - cut
        hour, cut = boundary, reached
    if after > cut:
        parts[hour] = after - cut
    return parts


def _position(billed: int, started_at: dt.datetime, share: float, now: dt.datetime) -> dt.datetime:
    """Where a bill of `billed` micro-GPU-seconds reaches on the clock, no later than `now`."""
    seconds = billed / MICROS_PER_SECOND / share
    return now if seconds >= (now - started_at).total_seconds() else started_at + dt.timedelta(seconds=seconds)


def apportion(total: int, weights: list[int]) -> list[int]:
    """`total` split in proportion to `weights` (of one sign, not all zero) in integers that add up to it: each part
    rounded down, and what rounding left given one by one to the largest remainders (the first of equal ones)."""
    if total < 0:
        return [-part for part in apportion(-total, weights)]
    magnitudes = [abs(weight) for weight in weights]
    whole = sum(magnitudes)
    parts = [total * weight // whole for weight in magnitudes]
    left = total - sum(parts)
    order = sorted(range(len(weights)), key=lambda index: (-(total * magnitudes[index] % whole), index))
    for index in order[:left]:
        parts[index] += 1
    return parts
