"""Decayed usage (timekeeper/fairshare/decay.py): exact against a numerical integral of the ledger, whatever the
half-life, across a leap day, linear in model weights, and the same whatever order the intervals come in."""

from __future__ import annotations

import datetime as dt
import math
import random

import pytest

from timekeeper.fairshare.decay import DecayedUsage, interval_worth

UTC = dt.timezone.utc
T0 = dt.datetime(2027, 1, 1, tzinfo=UTC)
HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)

Interval = tuple[float, dt.datetime, dt.datetime]  # GPU-seconds billed at a constant rate over [start, end]


def ledger(seed: int, count: int, span: dt.timedelta, longest: dt.timedelta) -> list[Interval]:
    """Overlapping intervals of many lengths (instants among them) over `span` from T0."""
    rng = random.Random(seed)
    intervals = []
    for _ in range(count):
        start = T0 + dt.timedelta(seconds=rng.uniform(0, span.total_seconds()))
        length = dt.timedelta(
            seconds=rng.choice([0.0, 1e-6, rng.uniform(0, 60), rng.uniform(0, longest.total_seconds())])
        )
        intervals.append((rng.uniform(0, 8) * max(length.total_seconds(), 1.0), start, start + length))
    return intervals


def fold(intervals: list[Interval], half_life: dt.timedelta, when: dt.datetime) -> float:
    usage = DecayedUsage.zero(T0)
    for gpu_seconds, start, end in intervals:
        usage = usage.plus(gpu_seconds, start, end, half_life)
    return usage.at(when, half_life).gpu_seconds


def simpson(f, a: float, b: float, steps: int) -> float:
    steps += steps % 2
    width = (b - a) / steps
    inner = sum((4 if k % 2 else 2) * f(a + k * width) for k in range(1, steps))
    return width / 3 * (f(a) + inner + f(b))


def numerical_integral(intervals: list[Interval], half_life: dt.timedelta, when: dt.datetime) -> float:
    """The integral of the ledger's total rate times 2^(-(T - t)/h), by Simpson's rule between the ledger's
    breakpoints (where the rate is constant and the kernel smooth), fine enough for every segment; instants summed."""
    h = half_life.total_seconds()
    seconds = [((start - T0).total_seconds(), (end - T0).total_seconds(), g) for g, start, end in intervals]
    horizon = (when - T0).total_seconds()
    kernel = lambda t: 2 ** (-(horizon - t) / h)  # noqa: E731
    total = sum(g * kernel(s) for s, e, g in seconds if e == s)
    points = sorted({p for s, e, _ in seconds if e > s for p in (s, e)})
    for a, b in zip(points, points[1:]):
        rate = sum(g / (e - s) for s, e, g in seconds if e > s and s <= a and b <= e)
        if rate:
            total += rate * simpson(kernel, a, b, steps=max(64, 2 * math.ceil(64 * (b - a) / h)))
    return total


@pytest.mark.parametrize("half_life", [dt.timedelta(minutes=30), HOUR * 6, DAY, DAY * 30, DAY * 365], ids=str)
def test_a_ledger_of_many_intervals_decays_exactly_as_its_integral(half_life: dt.timedelta) -> None:
    intervals = ledger(seed=32, count=150, span=DAY * 5, longest=DAY)
    when = T0 + DAY * 6
    assert fold(intervals, half_life, when) == pytest.approx(numerical_integral(intervals, half_life, when), rel=1e-9)


def test_a_half_life_halves() -> None:
    instant = DecayedUsage.zero(T0).plus(100.0, T0, T0, DAY)
    assert instant.gpu_seconds == 100.0
    assert instant.at(T0 + DAY, DAY).gpu_seconds == pytest.approx(50.0, rel=1e-15)
    assert instant.at(T0 + DAY * 3, DAY).gpu_seconds == pytest.approx(12.5, rel=1e-15)
    assert instant.at(T0 - DAY, DAY) is instant, "usage is never decayed backwards"


def test_an_interval_is_worth_its_closed_form() -> None:
    """A GPU for one half-life: the integral of 2^(-(h - t)/h) over [0, h] is h / (2 ln 2) GPU-seconds at its end."""
    usage = DecayedUsage.zero(T0).plus(86_400.0, T0, T0 + DAY, DAY)
    assert usage.as_of == T0 + DAY
    assert usage.gpu_seconds == pytest.approx(86_400 / (2 * math.log(2)), rel=1e-15)


def test_a_microsecond_under_a_year_long_half_life_keeps_its_digits() -> None:
    """Where 1 - 2^(-x) would cancel to a few digits, the worth is 1 - x/2 to the last bit."""
    h = 365 * 86_400.0
    x = 1e-6 * math.log(2) / h
    assert interval_worth(1e-6, h) == pytest.approx(1 - x / 2 + x * x / 6, rel=1e-16)
    assert interval_worth(1e-6, h) < 1.0
    assert interval_worth(0.0, h) == 1.0


def test_a_year_of_history_under_a_half_life_of_seconds_neither_overflows_nor_keeps_the_past() -> None:
    half_life = dt.timedelta(seconds=1)
    usage = DecayedUsage.zero(T0)
    for hour in range(24 * 365):
        usage = usage.plus(3600.0, T0 + HOUR * hour, T0 + HOUR * (hour + 1), half_life)
    # What is left is the last seconds of the last hour: one GPU for ever, decayed with h = 1 s, is h / ln 2.
    assert usage.gpu_seconds == pytest.approx(1 / math.log(2), rel=1e-12)
    assert usage.at(usage.as_of + DAY, half_life).gpu_seconds == 0.0
    late = usage.plus(3600.0, T0, T0 + HOUR, half_life)  # a report of the first hour, a year late
    assert late.gpu_seconds == usage.gpu_seconds and late.as_of == usage.as_of


def test_a_leap_day_is_a_day() -> None:
    """From noon on 28 February 2028 to noon on 1 March is two days: two half-lives of a day, a quarter left."""
    feb_28 = dt.datetime(2028, 2, 28, 12, tzinfo=UTC)
    mar_1 = dt.datetime(2028, 3, 1, 12, tzinfo=UTC)
    assert DecayedUsage.zero(feb_28).plus(100.0, feb_28, feb_28, DAY).at(mar_1, DAY).gpu_seconds == pytest.approx(
        25.0, rel=1e-15
    )
    # One GPU across the leap day, billed as 48 hours, is worth the integral over 48 hours.
    across = DecayedUsage.zero(feb_28).plus(48 * 3600.0, feb_28, mar_1, DAY)
    assert across.gpu_seconds == pytest.approx(86_400 / math.log(2) * (1 - 2 ** -2), rel=1e-14)
    intervals = [
        (48 * 3600.0, feb_28, mar_1),
        (3600.0, dt.datetime(2028, 2, 29, 23, 30, tzinfo=UTC), dt.datetime(2028, 3, 1, 0, 30, tzinfo=UTC)),
    ]
    when = mar_1 + HOUR * 5
    assert fold(intervals, DAY, when) == pytest.approx(numerical_integral(intervals, DAY, when), rel=1e-9)


def test_model_weights_scale_usage_linearly() -> None:
    """The caller passes weighted GPU-seconds: an A100 weighed 2.5 counts 2.5 times, and models add up."""
    intervals = ledger(seed=7, count=80, span=DAY * 3, longest=HOUR * 8)
    when = T0 + DAY * 4
    plain = fold(intervals, DAY, when)
    assert fold([(2.5 * g, s, e) for g, s, e in intervals], DAY, when) == pytest.approx(2.5 * plain, rel=1e-13)
    weights = [1.0 if i % 3 else 4.0 for i in range(len(intervals))]
    mixed = fold([(w * g, s, e) for w, (g, s, e) in zip(weights, intervals)], DAY, when)
    by_model = sum(w * fold([iv for v, iv in zip(weights, intervals) if v == w], DAY, when) for w in (1.0, 4.0))
    assert mixed == pytest.approx(by_model, rel=1e-12)


def test_the_order_of_intervals_does_not_change_the_usage_at_a_common_time() -> None:
    intervals = ledger(seed=11, count=200, span=DAY * 10, longest=DAY)
    when = T0 + DAY * 11
    in_order = fold(sorted(intervals, key=lambda iv: iv[2]), DAY, when)
    rng = random.Random(3)
    for _ in range(5):
        shuffled = intervals[:]
        rng.shuffle(shuffled)
        assert fold(shuffled, DAY, when) == pytest.approx(in_order, rel=1e-12)
    # Passes that decay what they hold to their own time before adding, as the controller's do, agree too.
    usage = DecayedUsage.zero(T0)
    for day in range(12):
        usage = usage.at(T0 + DAY * day, DAY)
        for g, s, e in intervals:
            if T0 + DAY * (day - 1) < e <= T0 + DAY * day:
                usage = usage.plus(g, s, e, DAY)
    assert usage.at(when, DAY).gpu_seconds == pytest.approx(in_order, rel=1e-12)


@pytest.mark.parametrize(("call", "message"), [
    (lambda u: u.plus(-1.0, T0, T0 + HOUR, DAY), "GPU-seconds must be a finite number, at least 0"),
    (lambda u: u.plus(math.nan, T0, T0 + HOUR, DAY), "GPU-seconds must be a finite number"),
    (lambda u: u.plus(math.inf, T0, T0 + HOUR, DAY), "GPU-seconds must be a finite number"),
    (lambda u: u.plus(1.0, T0 + HOUR, T0, DAY), "cannot end .* before it starts"),
    (lambda u: u.plus(1.0, T0, T0 + HOUR, dt.timedelta(0)), "half-life must be positive, not 0:00:00"),
    (lambda u: u.plus(1.0, T0, T0 + HOUR, -DAY), "half-life must be positive"),
    (lambda u: u.at(T0 + DAY, dt.timedelta(0)), "half-life must be positive"),
    (lambda u: u.plus(1.0, T0.replace(tzinfo=None), T0 + HOUR, DAY), "an interval's start must be an aware time"),
    (lambda u: u.at(T0.replace(tzinfo=None), DAY), "must be an aware time"),
    (lambda u: DecayedUsage(-0.5, T0), "decayed usage must be a finite number"),
    (lambda u: DecayedUsage.zero(T0.replace(tzinfo=None)), "must be an aware time"),
])
def test_bad_input_is_refused_with_what_to_give(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(DecayedUsage.zero(T0))
