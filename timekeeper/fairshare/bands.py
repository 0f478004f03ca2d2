"""The priority band of a namespace's new GPU pods, from its fair-share standing: a few PriorityClasses inside the
in-budget range, lightest on top, chosen by the ratio at its decisive level (`tree.py`) against ascending bounds. A
margin (hysteresis) and a minimum time in band keep priorities from flapping around a bound (docs/fair-share.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from gpusharing.fairshare import FairShareBands, admission_band
from gpusharing.units.duration import format_duration
from timekeeper.fairshare.decay import DecayedUsage, decay_factor, half_life_seconds
from timekeeper.fairshare.tree import LevelStanding, NamespaceStanding, decisive

# The bands and the burst guard live in the core, where the webhook reads them too; named here as the interface has
# them.
__all__ = [
    "BandState",
    "FairShareBands",
    "admission_band",
    "band_reason",
    "next_band",
    "zero_use_change",
    "zero_use_standing",
]

# How far past the last event zero_use_change looks: 2^-64 of the namespace's usage is none of it.
_LAST_LOOK_HALF_LIVES = 64


@dataclass(frozen=True)
class BandState:
    """A namespace's band and since when it holds it."""

    band: int  # index into classes, 0 = top
    since: datetime


def next_band(
    bands: FairShareBands, previous: BandState | None, standing: NamespaceStanding, now: datetime
) -> BandState:
    """The namespace's band after this pass. The first pass (or a band the settings no longer have) takes the plain
    band of the ratio; after that the band moves only once the minimum time in it is over, and only to a band whose
    bound the ratio crossed by the hysteresis (heavier: above bound x (1 + h); lighter: below bound x (1 - h))."""
    if previous is None or not 0 <= previous.band < len(bands.classes):
        return BandState(bands.band_of(standing.ratio), now)
    if now - previous.since < bands.min_time_in_band:
        return previous
    heavier = bands.band_of(standing.ratio, bands.hysteresis)
    if heavier > previous.band:
        return BandState(heavier, now)
    lighter = bands.band_of(standing.ratio, -bands.hysteresis)
    if lighter < previous.band:
        return BandState(lighter, now)
    return previous


def band_reason(standing: NamespaceStanding, band_class: str, half_life: timedelta) -> str:
    """One line on why the namespace's pods get `band_class`, e.g. "team-ml used 2.1x its fair share at the level of
    dept-research over a 24h half-life; light teams first: gpusharing-in-budget-heavy"."""
    over = f"over a {format_duration(half_life_seconds(half_life))} half-life; light teams first: {band_class}"
    if standing.decisive_level == 0:
        return f"{standing.namespace} used about its fair share at every level {over}"
    node = standing.path[standing.decisive_level - 1].node
    parent = standing.path[standing.decisive_level - 2].node if standing.decisive_level > 1 else None
    where = (f"at the level of {node}" if node != standing.namespace else
             f"among its siblings in {parent}" if parent else "among its siblings")
    return f"{standing.namespace} used {_times(standing.ratio)} its fair share {where} {over}"


def _times(ratio: float) -> str:
    if ratio == 0:
        return "none of"
    if ratio < 0.1:
        return "under 0.1x"
    text = f"{ratio:.1f}"
    return f"{ratio:.2f}x" if text == "1.0" else f"{text}x"


def zero_use_standing(standing: NamespaceStanding, factor: float) -> NamespaceStanding:
    """The standing if the namespace's own decayed usage were `factor` of what it is and everyone else's the same:
    every level's ratio along its path, and the decisive level, again (ranks are kept as they were)."""
    own = standing.path[-1].decayed_usage if standing.path else 0.0
    if own <= 0 or factor == 1.0:
        return standing
    path = tuple(_with_own(level, own, own * factor) for level in standing.path)
    decisive_level, ratio = decisive(path, standing.parity_tolerance)
    return replace(standing, path=path, ratio=ratio, decisive_level=decisive_level)


def _with_own(level: LevelStanding, own: float, left: float) -> LevelStanding:
    # The others' part first, then what is left of the namespace's: no cancellation when it is nearly all of it.
    decayed = max(0.0, level.decayed_usage - own) + left
    siblings = max(0.0, level.siblings_usage - own) + left
    usage = decayed / siblings if siblings > 0 else 0.0
    return replace(level, decayed_usage=decayed, siblings_usage=siblings, usage=usage, ratio=usage / level.share)


def zero_use_change(bands: FairShareBands, state: BandState, standing: NamespaceStanding, usage: DecayedUsage,
                    half_life: timedelta, now: datetime) -> datetime | None:
    """When the namespace's band would change if it used nothing from now on (for `explain`); None: never.

    Approximated as docs/fair-share.md (bands) says: from `usage.as_of` (the pass the standing was computed in) the
    namespace's own usage halves every half-life while everyone else's stays as it is, which is exact for a namespace
    alone in using GPUs and early where its siblings keep running. The band is piecewise constant between the times
    at which some level's ratio crosses a parity limit, a bound, or a bound moved by the hysteresis (each solved in
    closed form), and the end of the minimum time in band: the answer is the first of those times after which the
    band differs.
    """
    h = half_life_seconds(half_life)
    own = standing.path[-1].decayed_usage if standing.path else 0.0
    events = {now}
    if state.since + bands.min_time_in_band > now:
        events.add(state.since + bands.min_time_in_band)
    if own > 0:
        for level in standing.path:
            for target in _critical_ratios(bands, standing.parity_tolerance):
                factor = _factor_at(level, own, target)
                if factor is not None:
                    when = _later(usage.as_of, h * -math.log2(factor))
                    if when is not None and when > now:
                        events.add(when)
    times = sorted(events)
    probes = [(t, t) for t in times]
    probes += [(a, a + (b - a) / 2) for a, b in zip(times, times[1:])]
    last = _later(times[-1], h * _LAST_LOOK_HALF_LIVES)
    if last is not None:
        probes.append((times[-1], last))
    for event, probe in sorted(probes, key=lambda pair: pair[1]):
        factor = decay_factor(max(0.0, (probe - usage.as_of).total_seconds()), h)
        if next_band(bands, state, zero_use_standing(standing, factor), probe).band != state.band:
            return event
    return None


def _critical_ratios(bands: FairShareBands, tolerance: float) -> Sequence[float]:
    margins = (0.0, bands.hysteresis, -bands.hysteresis)
    return [1 - tolerance, 1 + tolerance, *(bound * (1 + m) for bound in bands.ratio_bounds for m in margins)]


def _factor_at(level: LevelStanding, own: float, target: float) -> float | None:
    """The factor of the namespace's own usage at which this level's ratio is `target`, if it falls there:
    (d - x) / (S - x) = target x share, with x = own x (1 - factor)."""
    scaled = target * level.share
    if scaled == 1.0:
        return None
    dropped = (scaled * level.siblings_usage - level.decayed_usage) / (scaled - 1.0)
    factor = 1.0 - dropped / own
    return factor if 0.0 < factor < 1.0 else None


def _later(when: datetime, seconds: float) -> datetime | None:
    """`seconds` after `when`, or None past the calendar's end (a change thousands of years away is no change)."""
    try:
        return when + timedelta(seconds=seconds)
    except OverflowError:
        return None
