"""A namespace's band (one of a few PriorityClasses in budget) from its standing, with hysteresis; the burst guard.

Minimal version for branch `fairwire` (the wiring); the `fairshare` branch's replaces it at merge."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpusharing.units.duration import format_duration
from timekeeper.fairshare.decay import DecayedUsage
from timekeeper.fairshare.tree import NamespaceStanding


@dataclass(frozen=True)
class FairShareBands:
    classes: tuple[str, ...]  # PriorityClass names, top (lightest) first
    ratio_bounds: tuple[float, ...]  # len(classes) - 1 ascending: band i holds ratios below ratio_bounds[i]
    hysteresis: float
    min_time_in_band: timedelta


@dataclass(frozen=True)
class BandState:
    band: int  # index into classes, 0 = top
    since: datetime


def _band_of(bands: FairShareBands, ratio: float) -> int:
    return next((i for i, bound in enumerate(bands.ratio_bounds) if ratio < bound), len(bands.classes) - 1)


def next_band(bands: FairShareBands, previous: BandState | None, standing: NamespaceStanding, now: datetime) -> BandState:
    ratio = standing.ratio
    if previous is None:
        return BandState(_band_of(bands, ratio), now)
    if now - previous.since < bands.min_time_in_band:
        return previous
    heavier = _band_of(bands, ratio / (1 + bands.hysteresis))
    lighter = _band_of(bands, ratio / (1 - bands.hysteresis)) if bands.hysteresis < 1 else previous.band
    band = heavier if heavier > previous.band else lighter if lighter < previous.band else previous.band
    return previous if band == previous.band else BandState(band, now)


def admission_band(bands: FairShareBands, band: int, held_gpus: float, fair_share_gpus: float) -> int:
    return min(band + 1, len(bands.classes) - 1) if held_gpus > fair_share_gpus else band


def band_reason(standing: NamespaceStanding, band_class: str, half_life: timedelta) -> str:
    over = format_duration(half_life.total_seconds())
    if standing.decisive_level == 0:
        return f"{standing.namespace} used its fair share at every level over a {over} half-life: {band_class}"
    node = standing.path[standing.decisive_level - 1]
    level = "among the cluster's top budgets" if node.level == 1 else f"at the level of {standing.path[node.level - 2].node}"
    return (f"{standing.namespace} used {standing.ratio:.1f}x its fair share {level} ({node.node}) over a {over} "
            f"half-life: {band_class}; light teams first")


def zero_use_change(bands: FairShareBands, state: BandState, standing: NamespaceStanding, usage: DecayedUsage,
                    half_life: timedelta, now: datetime) -> datetime | None:
    """When the band would rise if the namespace used nothing from now on, taking the others' use as it stands."""
    if state.band == 0 or standing.ratio <= 0:
        return None
    target = bands.ratio_bounds[state.band - 1] * (1 - bands.hysteresis)
    if target <= 0:
        return None
    seconds = max(0.0, math.log2(standing.ratio / target) * half_life.total_seconds())
    return max(now + timedelta(seconds=seconds), state.since + bands.min_time_in_band)
