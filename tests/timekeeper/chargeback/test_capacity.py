"""The capacity ledger's arithmetic (timekeeper/chargeback/capacity.py): a GPU node's capacity split exactly by UTC
hour whatever the observations that cut it, its down time split at the Ready condition's transition, the cursor's
rules (first seen, gone, re-created, an older observation), and each node-hour's identity: allocated − over +
unallocated + down = capacity, to the micro-GPU-second."""

from __future__ import annotations

import datetime as dt
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusharing.gpu.capacity import NodeGpus
from gpusharing.gpu.catalogue import shipped_catalogue
from timekeeper.chargeback.capacity import (
    GONE_AFTER,
    CapacityFigures,
    Cursor,
    NodeHour,
    NodeTime,
    Stretch,
    Utilisation,
    advance,
    micro_gpus,
    node_hour_figures,
    node_time,
    offered,
    stretches,
    summed,
    utilisation,
)

UTC = dt.timezone.utc
CATALOGUE = shipped_catalogue()
A100 = CATALOGUE.default
H = dt.datetime(2026, 11, 25, 10, tzinfo=UTC)
MICRO = 1_000_000
GPU = MICRO  # a GPU, in micro-GPUs


def at(minutes: float) -> dt.datetime:
    return H + dt.timedelta(minutes=minutes)


def hour(offset: int) -> dt.datetime:
    return H + dt.timedelta(hours=offset)


def up(capacity: int) -> NodeTime:
    return NodeTime(capacity, 0)


def test_a_node_s_capacity_is_its_gpus_times_its_time_split_at_each_hour() -> None:
    assert node_time(8 * GPU, [Stretch(at(-10), at(70), False)]) == {
        hour(-1): up(8 * 600 * MICRO), hour(0): up(8 * 3600 * MICRO), hour(1): up(8 * 600 * MICRO)}


def test_down_time_is_capacity_too_and_counted_apart() -> None:
    split = node_time(2 * GPU, [Stretch(at(0), at(30), False), Stretch(at(30), at(90), True)])
    assert split == {hour(0): NodeTime(2 * 3600 * MICRO, 2 * 1800 * MICRO), hour(1): NodeTime(2 * 1800 * MICRO,
                                                                                                 2 * 1800 * MICRO)}


@given(
    micro=st.integers(0, 64 * GPU),
    start=st.integers(0, 10**12),  # microseconds after H
    cuts=st.lists(st.integers(1, 3 * 3600 * MICRO), min_size=1, max_size=12),
)
def test_however_observations_cut_a_node_s_time_its_hours_are_the_same_and_add_up_to_the_whole(
    micro: int, start: int, cuts: list[int]
) -> None:
    """Each observation adds the time since the last; the cumulative integer makes the hours independent of when they
    came, and nothing is lost to rounding (a MIG slice of 1/7 of a GPU offers no whole micro-GPU-seconds per
    microsecond)."""
    instants = [H + dt.timedelta(microseconds=start)]
    for cut in cuts:
        instants.append(instants[-1] + dt.timedelta(microseconds=cut))
    observed: dict[dt.datetime, NodeTime] = {}
    for first, last in zip(instants, instants[1:]):
        for key, time in node_time(micro, [Stretch(first, last, False)]).items():
            observed[key] = observed.get(key, up(0)) + time
    whole = node_time(micro, [Stretch(instants[0], instants[-1], False)])
    assert observed == whole
    assert sum(time.capacity for time in whole.values()) == offered(micro, instants[-1]) - offered(micro, instants[0])
    exact = Fraction(micro) * Fraction((instants[-1] - instants[0]) // dt.timedelta(microseconds=1), MICRO)
    assert abs(sum(time.capacity for time in whole.values()) - exact) < 1


def test_a_mig_slice_counts_as_its_fraction() -> None:
    assert micro_gpus(2 / 7) == 285_714
    assert sum(t.capacity for t in node_time(micro_gpus(1 / 7), [Stretch(at(0), at(60 * 7), False)]).values()) == (
        142_857 * 7 * 3600)


@pytest.mark.parametrize(
    ("ready", "changed_at", "expected"),
    [
        (True, at(-5), [Stretch(at(0), at(30), False)]),  # ready since before: all up
        (False, None, [Stretch(at(0), at(30), True)]),  # no transition recorded: as it reads now
        (True, at(12), [Stretch(at(0), at(12), True), Stretch(at(12), at(30), False)]),  # became Ready inside
        (False, at(12), [Stretch(at(0), at(12), False), Stretch(at(12), at(30), True)]),  # went NotReady inside
        (True, at(31), [Stretch(at(0), at(30), True)]),  # the API server's clock a little ahead: not Ready until then
    ],
)
def test_down_is_split_at_the_ready_condition_s_last_transition(
    ready: bool, changed_at: dt.datetime | None, expected: list[Stretch]
) -> None:
    assert stretches(at(0), at(30), ready, changed_at) == expected
    assert stretches(at(30), at(30), ready, changed_at) == []


def gpu_node(uid: str = "uid-1", gpus: float = 8, ready: bool = True, changed_at: dt.datetime | None = None,
             created_at: dt.datetime | None = None) -> NodeGpus:
    return NodeGpus(gpus, A100, True, None, gpus > 0, uid, gpus, ready, changed_at, created_at)


def cursor(until: dt.datetime, uid: str = "uid-1", gpus: int = 8, gone_at: dt.datetime | None = None) -> Cursor:
    return Cursor("gpu-1", uid, A100.name, gpus * GPU, True, until, gone_at)


def added(micro: int, start: dt.datetime, end: dt.datetime, down: bool = False) -> dict[tuple[dt.datetime, str],
                                                                                        NodeTime]:
    return {(key, A100.name): time for key, time in node_time(micro, [Stretch(start, end, down)]).items()}


def test_a_node_seen_first_starts_from_its_creation_within_the_hour_else_from_now() -> None:
    new = advance("gpu-1", None, gpu_node(created_at=at(-20)), at(0))
    assert new is not None and new.new and new.cursor == Cursor("gpu-1", "uid-1", A100.name, 8 * GPU, True, at(0))
    assert new.added == added(8 * GPU, at(-20), at(0))
    old = advance("gpu-1", None, gpu_node(created_at=at(-61)), at(0))  # there before the ledger: not guessed
    assert old is not None and old.new and old.added == {} and old.cursor.observed_until == at(0)
    assert advance("gpu-1", None, gpu_node(gpus=0, created_at=at(-5)), at(0)) is None  # no GPUs: not recorded


def test_a_cursor_advances_to_now_and_never_back() -> None:
    moved = advance("gpu-1", cursor(at(0)), gpu_node(), at(1))
    assert moved is not None and not moved.new and moved.added == added(8 * GPU, at(0), at(1))
    assert moved.cursor.observed_until == at(1)
    assert advance("gpu-1", cursor(at(1)), gpu_node(), at(1)) is None  # the same observation again
    assert advance("gpu-1", cursor(at(1)), gpu_node(), at(0.5)) is None  # an older one
    assert advance("gpu-1", cursor(at(1)), None, at(0.5)) is None


def test_a_node_absent_from_the_cache_is_gone_after_a_while_its_time_since_down() -> None:
    assert advance("gpu-1", cursor(at(0)), None, at(0) + GONE_AFTER / 2) is None  # a cache not caught up: it waits
    gone = advance("gpu-1", cursor(at(0)), None, at(0) + GONE_AFTER)
    assert gone is not None and gone.gone and gone.cursor.gone_at == gone.cursor.observed_until == at(0) + GONE_AFTER
    assert gone.added == added(8 * GPU, at(0), at(0) + GONE_AFTER, down=True)
    closed = cursor(at(5), gone_at=at(5))
    assert advance("gpu-1", closed, None, at(20)) is None  # gone for good
    assert advance("gpu-1", closed, gpu_node(), at(20)) is None  # a cache far behind brings nothing back


def test_a_node_re_created_under_its_name_closes_the_old_cursor_down_and_starts_anew() -> None:
    fresh = gpu_node(uid="uid-2", gpus=4, created_at=at(3))
    again = advance("gpu-1", cursor(at(0)), fresh, at(5))
    assert again is not None and not again.new and again.cursor.uid == "uid-2" and again.cursor.micro_gpus == 4 * GPU
    expected = added(8 * GPU, at(0), at(3), down=True)
    for key, time in added(4 * GPU, at(3), at(5)).items():
        expected[key] = expected[key] + time
    assert again.added == expected
    after_gone = advance("gpu-1", cursor(at(0), gone_at=at(0)), fresh, at(5))  # the old one closed already
    assert after_gone is not None and after_gone.added == added(4 * GPU, at(3), at(5))


recorded_down = st.integers(0, 10**13).flatmap(lambda c: st.tuples(st.just(c), st.integers(0, c)))


@given(recorded=recorded_down, allocated=st.integers(0, 2 * 10**13), idle=st.integers(0, 10**13))
def test_every_node_hour_splits_exactly_into_allocated_unallocated_and_down(
    recorded: tuple[int, int], allocated: int, idle: int
) -> None:
    capacity, down = recorded
    figures = node_hour_figures(capacity, down, allocated, idle)
    assert figures.allocated - figures.over + figures.unallocated + figures.down == capacity
    assert min(figures.unallocated, figures.down, figures.over) >= 0 and figures.down <= down
    assert figures.over == 0 or figures.unallocated == figures.down == 0
    assert (figures.capacity, figures.allocated, figures.idle) == (capacity, allocated, idle)


@pytest.mark.parametrize(
    ("capacity", "down", "allocated", "expected"),
    [
        (100, 0, 60, CapacityFigures(100, 60, 0, 40, 0, 0)),
        (100, 30, 60, CapacityFigures(100, 60, 0, 10, 30, 0)),
        (100, 30, 90, CapacityFigures(100, 90, 0, 0, 10, 0)),  # a pod billed while its node was NotReady holds it
        (100, 30, 130, CapacityFigures(100, 130, 0, 0, 0, 30)),  # billed beyond the node: over
        (0, 0, 50, CapacityFigures(0, 50, 0, 0, 0, 50)),  # capacity not recorded
    ],
)
def test_what_the_pods_hold_comes_first_then_down_then_unallocated(
    capacity: int, down: int, allocated: int, expected: CapacityFigures
) -> None:
    assert node_hour_figures(capacity, down, allocated, 0) == expected


def test_a_window_s_figures_are_the_sums_of_its_node_hours_by_model_and_in_all() -> None:
    lines = [
        NodeHour("gpu-1", hour(0), "A100", node_hour_figures(100, 20, 35, 10)),
        NodeHour("gpu-1", hour(1), "A100", node_hour_figures(100, 0, 0, 0)),
        NodeHour("gpu-2", hour(0), "T4", node_hour_figures(50, 0, 0, 0)),
        NodeHour("gpu-3", hour(0), "L4", node_hour_figures(0, 0, 7, 0)),  # no capacity recorded
        NodeHour(None, hour(1), "A100", node_hour_figures(0, 0, 9, 1)),  # pods on no node
    ]
    totals = utilisation(lines)
    assert totals.models == {"A100": CapacityFigures(200, 44, 11, 145, 20, 9), "L4": CapacityFigures(0, 7, 0, 0, 0, 7),
                             "T4": CapacityFigures(50, 0, 0, 50, 0, 0)}
    cluster = totals.cluster
    assert cluster == summed(line.figures for line in lines) == CapacityFigures(250, 51, 11, 195, 20, 16)
    assert cluster.allocated - cluster.over + cluster.unallocated + cluster.down == cluster.capacity
    assert utilisation([]) == Utilisation(CapacityFigures(), {})
