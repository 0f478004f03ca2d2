"""Bands (timekeeper/fairshare/bands.py): the band of a ratio with hysteresis and a minimum time in band, the one-line
reason, and when the band would change at zero use. The bands' shape and the burst guard:
tests/gpusharing/test_fairshare.py."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from timekeeper.fairshare.bands import (
    BandState,
    FairShareBands,
    band_reason,
    next_band,
    zero_use_change,
    zero_use_standing,
)
from timekeeper.fairshare.decay import DecayedUsage
from timekeeper.fairshare.tree import NamespaceStanding, ShareNode, rank_fair_tree

UTC = dt.timezone.utc
T0 = dt.datetime(2027, 3, 1, 9, tzinfo=UTC)
DAY = dt.timedelta(days=1)
MINUTE = dt.timedelta(minutes=1)
CLASSES = ("gpusharing-in-budget-light", "gpusharing-in-budget", "gpusharing-in-budget-heavy")
BANDS = FairShareBands(CLASSES, (0.8, 1.25), hysteresis=0.1, min_time_in_band=dt.timedelta(minutes=10))


def ns(name: str, parent: str | None, usage: float, weight: float = 1.0) -> ShareNode:
    return ShareNode(name, parent, weight, usage, is_namespace=True)


def group(name: str, parent: str | None, weight: float = 1.0) -> ShareNode:
    return ShareNode(name, parent, weight, 0.0, is_namespace=False)


def flat(ratio_of_a: float) -> NamespaceStanding:
    """Namespace a's standing beside b, equal weights, a's ratio as given (from 0 to 2)."""
    return rank_fair_tree([ns("a", None, ratio_of_a), ns("b", None, 2.0 - ratio_of_a)])["a"]


def test_a_ratio_falls_in_the_band_whose_bounds_hold_it() -> None:
    assert [BANDS.band_of(r) for r in (0.0, 0.79, 0.8, 1.0, 1.249, 1.25, 40.0)] == [0, 0, 1, 1, 1, 2, 2]
    assert next_band(BANDS, None, flat(0.5), T0) == BandState(0, T0)
    assert next_band(BANDS, None, flat(1.0), T0) == BandState(1, T0)
    assert next_band(BANDS, None, flat(1.5), T0) == BandState(2, T0)
    single = FairShareBands(("gpusharing-in-budget",), (), 0.0, dt.timedelta(0))
    assert next_band(single, None, flat(1.9), T0).band == 0


def test_a_ratio_hovering_about_a_bound_does_not_flap() -> None:
    state = next_band(BANDS, None, flat(1.0), T0)
    seen = []
    for minute, ratio in enumerate([1.2, 1.3, 1.2, 1.35, 1.24, 1.3, 1.37]):
        state = next_band(BANDS, state, flat(ratio), T0 + dt.timedelta(hours=1) + MINUTE * 20 * minute)
        seen.append(state.band)
    assert seen == [1] * 7, "never past 1.25 x 1.1"
    moved_at = T0 + dt.timedelta(hours=4)
    state = next_band(BANDS, state, flat(1.4), moved_at)
    assert state == BandState(2, moved_at)
    for minute, ratio in enumerate([1.2, 1.13, 1.2]):
        state = next_band(BANDS, state, flat(ratio), moved_at + dt.timedelta(hours=1) + MINUTE * 20 * minute)
    assert state == BandState(2, moved_at), "back down only below 1.25 x 0.9"
    state = next_band(BANDS, state, flat(1.1), moved_at + dt.timedelta(hours=3))
    assert state == BandState(1, moved_at + dt.timedelta(hours=3))
    state = next_band(BANDS, state, flat(0.0), moved_at + dt.timedelta(hours=4))
    assert state.band == 0, "a ratio far past several bounds moves straight to its band"


def test_a_band_is_kept_the_minimum_time() -> None:
    state = BandState(1, T0)
    assert next_band(BANDS, state, flat(1.9), T0 + dt.timedelta(minutes=9, seconds=59)) is state
    assert next_band(BANDS, state, flat(1.9), T0 + dt.timedelta(minutes=10)) == BandState(
        2, T0 + dt.timedelta(minutes=10)
    )
    assert next_band(BANDS, state, flat(1.9), T0 - DAY) is state, "a clock that went back changes nothing"


def test_a_band_the_settings_no_longer_have_starts_afresh() -> None:
    assert next_band(BANDS, BandState(7, T0), flat(1.0), T0 + MINUTE) == BandState(1, T0 + MINUTE)


def research() -> dict[str, NamespaceStanding]:
    """dept-research holds a quarter of the weight and used 52.5% of the GPU time: 2.1x its fair share."""
    return rank_fair_tree(
        [
            group("dept-research", None, weight=1.0),
            group("dept-infra", None, weight=3.0),
            ns("team-ml", "dept-research", 40.0),
            ns("team-cv", "dept-research", 12.5),
            ns("team-ops", "dept-infra", 47.5),
            ns("team-idle", "dept-infra", 0.0, weight=0.5),
            ns("team-db", "dept-infra", 0.0),
        ]
    )


def test_the_reason_names_the_decisive_level_the_ratio_and_the_half_life() -> None:
    standings = research()
    assert band_reason(standings["team-ml"], CLASSES[2], DAY) == (
        "team-ml used 2.1x its fair share at the level of dept-research over a 24h half-life; light teams first: "
        "gpusharing-in-budget-heavy"
    )
    alone = rank_fair_tree([ns("team-a", None, 30.0), ns("team-b", None, 10.0), ns("team-c", None, 0.0)])
    assert band_reason(alone["team-a"], CLASSES[2], dt.timedelta(hours=1, minutes=30)) == (
        "team-a used 2.2x its fair share among its siblings over a 1h30m half-life; light teams first: "
        "gpusharing-in-budget-heavy"
    )
    assert band_reason(alone["team-c"], CLASSES[0], DAY).startswith(
        "team-c used none of its fair share among its siblings over a 24h"
    )
    tiny = rank_fair_tree([ns("a", None, 1.0), ns("b", None, 1e6)])["a"]
    assert "a used under 0.1x its fair share" in band_reason(tiny, CLASSES[0], DAY)
    near = rank_fair_tree([ns("a", None, 52.0), ns("b", None, 48.0)], parity_tolerance=0.01)["a"]
    assert "a used 1.04x its fair share" in band_reason(near, CLASSES[1], DAY)
    even = rank_fair_tree([ns("a", None, 5.0), ns("b", None, 5.0)])["a"]
    assert (
        band_reason(even, CLASSES[1], DAY)
        == "a used about its fair share at every level over a 24h half-life; light teams first: gpusharing-in-budget"
    )


def scaled(nodes: list[ShareNode], name: str, factor: float) -> list[ShareNode]:
    return [
        ShareNode(n.name, n.parent, n.weight, n.usage * factor, n.is_namespace) if n.name == name else n for n in nodes
    ]


def test_zero_use_standing_is_the_tree_with_only_the_namespaces_usage_decayed() -> None:
    nodes = [group("d", None), group("e", None, weight=2.0), group("d.t", "d"),
             ns("a", "d.t", 600.0), ns("b", "d.t", 100.0), ns("c", "d", 50.0), ns("x", "e", 300.0), ns("y", "e", 20.0)]
    before = rank_fair_tree(nodes)["a"]
    for factor in (1.0, 0.5, 0.1, 1e-6):
        expected = rank_fair_tree(scaled(nodes, "a", factor))["a"]
        got = zero_use_standing(before, factor)
        assert (got.decisive_level, got.ratio) == (expected.decisive_level, pytest.approx(expected.ratio, rel=1e-9))
        for mine, theirs in zip(got.path, expected.path):
            assert (mine.usage, mine.ratio, mine.decayed_usage) == (
                pytest.approx(theirs.usage, rel=1e-9),
                pytest.approx(theirs.ratio, rel=1e-9),
                pytest.approx(theirs.decayed_usage, rel=1e-9),
            )
    assert zero_use_standing(before, 1.0) is before


def band_at(nodes: list[ShareNode], name: str, state: BandState, usage: DecayedUsage, when: dt.datetime) -> int:
    """The band by the tree recomputed with the namespace's usage decayed to `when` and nobody else's."""
    factor = usage.at(when, DAY).gpu_seconds / usage.gpu_seconds
    return next_band(BANDS, state, rank_fair_tree(scaled(nodes, name, factor))[name], when).band


def test_zero_use_change_is_when_the_ratio_falls_past_the_bound_less_the_hysteresis() -> None:
    """a used 3 of 4 on half the weight: ratio 1.5, heavy. With its usage f of what it is, 3f / (3f + 1) / 0.5
    falls below 1.25 x 0.9 at f = 0.5625 / (3 x 0.4375): log2(1 / f) half-lives on."""
    nodes = [ns("a", None, 3.0), ns("b", None, 1.0)]
    standing = rank_fair_tree(nodes)["a"]
    state = BandState(2, T0 - DAY)
    usage = DecayedUsage(3.0, T0)
    when = zero_use_change(BANDS, state, standing, usage, DAY, T0)
    expected = T0 + DAY * math.log2(3 * 0.4375 / 0.5625)
    assert when is not None and abs((when - expected).total_seconds()) < 1e-3
    assert band_at(nodes, "a", state, usage, when - dt.timedelta(seconds=1)) == 2
    assert band_at(nodes, "a", state, usage, when + dt.timedelta(seconds=1)) == 1
    # Asked later, from a later now, the same time; asked while the minimum time holds the band, its end.
    assert zero_use_change(BANDS, state, standing, usage, DAY, T0 + dt.timedelta(hours=5)) == when
    recent = BandState(2, when - dt.timedelta(minutes=3))
    assert zero_use_change(BANDS, recent, standing, usage, DAY, T0) == recent.since + BANDS.min_time_in_band


def test_zero_use_change_follows_the_decision_down_a_level() -> None:
    """A department a little heavy (middle band, decided at level 1) whose namespace is its heavy user: as the
    namespace stops, the department falls to parity first and the namespace's own level decides."""
    nodes = [
        group("d", None),
        group("e", None),
        ns("d-heavy", "d", 58.0),
        ns("d-light", "d", 2.0),
        ns("e-1", "e", 50.0),
    ]
    standing = rank_fair_tree(nodes)["d-heavy"]
    assert (standing.decisive_level, standing.ratio) == (1, pytest.approx(60 / 110 / 0.5))
    state = BandState(1, T0 - DAY)
    usage = DecayedUsage(58.0, T0)
    when = zero_use_change(BANDS, state, standing, usage, DAY, T0)
    assert when is not None and when > T0
    before, after = (
        band_at(nodes, "d-heavy", state, usage, when + d) for d in (-dt.timedelta(seconds=1), dt.timedelta(seconds=1))
    )
    assert (before, after) == (1, 2), "heavier: its own level, 1.9x, decides once its department is at parity"


def test_zero_use_change_is_none_when_nothing_would_change() -> None:
    standings = research()
    light = BandState(0, T0 - DAY)
    assert zero_use_change(BANDS, light, standings["team-ops"], DecayedUsage(47.5, T0), DAY, T0) is None, (
        "already in the top band"
    )
    alone = rank_fair_tree([ns("a", None, 10.0), ns("b", None, 0.0)])["a"]
    assert zero_use_change(BANDS, BandState(2, T0 - DAY), alone, DecayedUsage(10.0, T0), DAY, T0) is None, (
        "alone in using GPUs it stays at twice its share however little it used")
    idle = rank_fair_tree(
        [group("h", None), group("g", None), ns("h1", "h", 30.0), ns("h0", "h", 0.0), ns("g1", "g", 5.0)]
    )["h0"]
    assert zero_use_change(BANDS, BandState(2, T0 - DAY), idle, DecayedUsage.zero(T0), DAY, T0) is None, (
        "a namespace that uses nothing already changes nothing by stopping")
    held = BandState(2, T0 - MINUTE)
    assert zero_use_change(BANDS, held, idle, DecayedUsage.zero(T0), DAY, T0) is None
    waiting = BandState(1, T0 - MINUTE)
    assert zero_use_change(BANDS, waiting, idle, DecayedUsage.zero(T0), DAY, T0) == T0 + dt.timedelta(minutes=9), (
        "its department's weight makes it heavy as soon as the minimum time allows")
