"""Fair Tree over the budget hierarchy (timekeeper/fairshare/tree.py): siblings ranked by usage over share at each
level, depth-first; a heavy department's namespaces below a light one's; splitting a team gains nothing; ties by
name."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from timekeeper.fairshare.tree import ShareNode, rank_fair_tree


def ns(name: str, parent: str | None, usage: float, weight: float = 1.0) -> ShareNode:
    return ShareNode(name, parent, weight, usage, is_namespace=True)


def group(name: str, parent: str | None, weight: float = 1.0) -> ShareNode:
    return ShareNode(name, parent, weight, 0.0, is_namespace=False)


def order(standings) -> list[str]:
    return sorted(standings, key=lambda name: standings[name].rank)


def test_flat_siblings_rank_by_usage_over_share_lightest_first() -> None:
    standings = rank_fair_tree(
        [
            ns("a", None, 60.0, weight=1),
            ns("b", None, 30.0, weight=3),
            ns("c", None, 10.0, weight=1),
            ns("idle", None, 0.0, weight=5),
        ]
    )
    # Shares 0.1, 0.3, 0.1, 0.5 of the weights; usage 0.6, 0.3, 0.1, 0 of what they used together.
    assert {name: round(s.ratio, 12) for name, s in standings.items()} == {"idle": 0.0, "c": 1.0, "b": 1.0, "a": 6.0}
    assert order(standings) == ["idle", "b", "c", "a"], "used nothing first; b and c tie at parity and go by name"
    a = standings["a"]
    assert (a.rank, a.of, a.decisive_level, a.share_of_cluster) == (4, 4, 1, pytest.approx(0.1))
    assert (a.path[0].share, a.path[0].usage, a.path[0].rank, a.path[0].siblings) == (
        pytest.approx(0.1),
        pytest.approx(0.6),
        4,
        4,
    )
    assert (standings["c"].decisive_level, standings["c"].ratio) == (0, 1.0), "at parity: no decisive level"
    assert (standings["idle"].decisive_level, standings["idle"].ratio) == (1, 0.0)


def test_a_heavy_departments_namespaces_rank_below_a_light_departments_whatever_their_own_use() -> None:
    standings = rank_fair_tree([
        group("dept-heavy", None), group("dept-light", None),
        ns("heavy-idle", "dept-heavy", 0.0), ns("heavy-busy", "dept-heavy", 900.0),
        ns("light-a", "dept-light", 100.0), ns("light-b", "dept-light", 50.0),
    ])
    assert order(standings) == ["light-b", "light-a", "heavy-idle", "heavy-busy"]
    idle = standings["heavy-idle"]
    assert idle.decisive_level == 1 and idle.ratio == pytest.approx(12 / 7), (
        "judged by its department, which used 900 of 1050 on half the weight"
    )
    assert idle.path[1].ratio == 0.0 and idle.path[0].node == "dept-heavy"
    assert standings["light-a"].ratio == pytest.approx(0.2857142857) and standings["light-a"].decisive_level == 1


def test_a_level_within_the_tolerance_hands_the_decision_to_the_level_below() -> None:
    nodes = [group("x", None), group("y", None), ns("x1", "x", 52.0), ns("x2", "x", 0.0), ns("y1", "y", 48.0)]
    standings = rank_fair_tree(nodes)
    assert standings["x1"].path[0].ratio == pytest.approx(1.04)
    assert (standings["x1"].decisive_level, standings["x1"].ratio) == (2, pytest.approx(2.0))
    assert (standings["x2"].decisive_level, standings["x2"].ratio) == (2, 0.0)
    assert (standings["y1"].decisive_level, standings["y1"].ratio) == (0, 1.0)
    strict = rank_fair_tree(nodes, parity_tolerance=0.01)
    assert (strict["x1"].decisive_level, strict["x1"].ratio) == (1, pytest.approx(1.04))


def four_levels(seed: int) -> list[ShareNode]:
    """3 divisions x 3 departments x 2 teams x 3 namespaces, random weights and usage, some namespaces idle."""
    rng = random.Random(seed)
    nodes = []
    for d in range(3):
        nodes.append(group(f"div{d}", None, rng.uniform(1, 5)))
        for p in range(3):
            nodes.append(group(f"div{d}.dept{p}", f"div{d}", rng.uniform(1, 5)))
            for t in range(2):
                nodes.append(group(f"div{d}.dept{p}.team{t}", f"div{d}.dept{p}", rng.uniform(1, 5)))
                for n in range(3):
                    nodes.append(
                        ns(
                            f"ns-{d}-{p}-{t}-{n}",
                            f"div{d}.dept{p}.team{t}",
                            rng.choice([0.0, rng.uniform(0, 1e6)]),
                            rng.uniform(1, 5),
                        )
                    )
    return nodes


def test_four_levels_rank_depth_first_by_each_levels_ratio_then_name() -> None:
    nodes = four_levels(seed=32)
    standings = rank_fair_tree(nodes)
    assert len(standings) == 54 and {s.of for s in standings.values()} == {54}
    # The same order by brute force: each namespace's key is its path's (ratio, name) from the top.
    by_key = sorted(standings, key=lambda name: [(level.ratio, level.node) for level in standings[name].path])
    assert order(standings) == by_key
    assert [s.rank for s in standings.values()] == list(range(1, 55)), "returned in rank order"
    assert math.fsum(s.share_of_cluster for s in standings.values()) == pytest.approx(1.0)
    for s in standings.values():
        assert [level.level for level in s.path] == [1, 2, 3, 4]
        assert s.share_of_cluster == pytest.approx(math.prod(level.share for level in s.path))
        for level in s.path:
            assert level.ratio == pytest.approx(level.usage / level.share)
    # Siblings' normalised shares and usage add up to 1 at every level (usage: where they used anything).
    for depth in range(4):
        groups = itertools.groupby(
            sorted(
                {(s.path[:depth], s.path[depth]) for s in standings.values()},
                key=lambda p: [lv.node for lv in p[0]] + [p[1].node],
            ),
            key=lambda p: p[0],
        )
        for _, members in groups:
            levels = [lv for _, lv in members]
            assert math.fsum(lv.share for lv in levels) == pytest.approx(1.0)
            assert {lv.siblings for lv in levels} == {len(levels)}
            assert sorted(lv.rank for lv in levels) == list(range(1, len(levels) + 1))


def test_the_order_does_not_depend_on_the_inputs_order() -> None:
    nodes = four_levels(seed=5)
    expected = rank_fair_tree(nodes)
    for seed in range(3):
        shuffled = nodes[:]
        random.Random(seed).shuffle(shuffled)
        assert rank_fair_tree(shuffled) == expected


def test_ties_are_broken_by_name() -> None:
    standings = rank_fair_tree(
        [
            group("b", None),
            group("a", None),
            ns("b2", "b", 5.0),
            ns("b1", "b", 5.0),
            ns("a1", "a", 10.0),
            ns("a0", "a", 0.0, weight=0.5),
        ]
    )
    assert order(standings) == ["a0", "a1", "b1", "b2"]
    assert standings["a0"].path[0].ratio == standings["b1"].path[0].ratio == 1.0


def test_splitting_a_team_into_many_namespaces_gains_nothing() -> None:
    """The same team as one namespace, or as a group of five splitting its use: everyone else's order is the
    same, and the five namespaces sit where the one did."""
    others = [
        group("dept-a", None),
        group("dept-b", None, weight=2.0),
        ns("a-1", "dept-a", 300.0),
        ns("a-2", "dept-a", 50.0),
        ns("b-1", "dept-b", 200.0),
        ns("b-2", "dept-b", 10.0),
    ]
    whole = rank_fair_tree([*others, ns("team", "dept-a", 400.0, weight=2.0)])
    split = rank_fair_tree(
        [
            *others,
            group("team", "dept-a", weight=2.0),
            *(
                ns(f"team-{i}", "team", u, weight=w)
                for i, (u, w) in enumerate([(390.0, 1), (2.5, 1), (2.5, 5), (5.0, 0.1), (0.0, 3)])
            ),
        ]
    )
    flattened = [name if not name.startswith("team-") else "team" for name in order(split)]
    assert [name for i, name in enumerate(flattened) if i == 0 or name != flattened[i - 1]] == order(whole)
    for name in ("a-1", "a-2", "b-1", "b-2"):
        assert split[name].path == whole[name].path
    assert {split[f"team-{i}"].path[0] for i in range(5)} == {whole["team"].path[0]}
    assert split["team-4"].ratio == whole["team"].ratio, "an idle split-off still answers for its department's use"
    # Nor does splitting a namespace's budget among several namespaces directly under the department.
    flat_split = rank_fair_tree(
        [*others, ns("team-x", "dept-a", 200.0, weight=1.0), ns("team-y", "dept-a", 200.0, weight=1.0)]
    )
    assert flat_split["team-x"].ratio == flat_split["team-y"].ratio == pytest.approx(whole["team"].ratio)
    assert [(lv.share, lv.usage, lv.ratio) for lv in flat_split["a-1"].path] == [
        (lv.share, lv.usage, lv.ratio) for lv in whole["a-1"].path
    ]


def test_a_group_without_namespaces_takes_no_share() -> None:
    nodes = [ns("a", None, 30.0), ns("b", None, 10.0)]
    with_empty = rank_fair_tree([*nodes, group("empty", None, weight=100.0), group("empty.sub", "empty", weight=5.0)])
    assert with_empty == rank_fair_tree(nodes)
    assert with_empty["a"].path[0].share == 0.5


def test_when_nobody_used_anything_everyone_is_at_parity_and_ranks_by_name() -> None:
    standings = rank_fair_tree(
        [group("d2", None), group("d1", None, weight=3), ns("z", "d1", 0.0), ns("y", "d2", 0.0), ns("x", "d2", 0.0)]
    )
    assert order(standings) == ["z", "x", "y"]
    for s in standings.values():
        assert (s.ratio, s.decisive_level) == (1.0, 0)
        assert all(level.ratio == 0.0 and level.usage == 0.0 for level in s.path)


def test_a_namespace_that_alone_used_anything_is_heavy_and_the_rest_at_parity_among_themselves() -> None:
    standings = rank_fair_tree(
        [
            group("d", None),
            group("e", None),
            ns("d1", "d", 10.0),
            ns("d2", "d", 0.0),
            ns("e1", "e", 0.0),
            ns("e2", "e", 0.0),
        ]
    )
    assert order(standings) == ["e1", "e2", "d2", "d1"]
    assert (standings["d1"].ratio, standings["d1"].decisive_level) == (2.0, 1)
    assert (standings["e1"].ratio, standings["e1"].decisive_level) == (0.0, 1)
    assert standings["e1"].path[1].at_parity(0.05), "e's namespaces used nothing among themselves"


def test_no_namespaces_no_standings() -> None:
    assert rank_fair_tree([]) == {}
    assert rank_fair_tree([group("lonely", None)]) == {}


@pytest.mark.parametrize(("nodes", "message"), [
    ([ns("a", None, 1.0, weight=0.0)], "weight of a must be a positive number, not 0.0"),
    ([ns("a", None, 1.0, weight=-2.0)], "weight of a must be a positive number"),
    ([ns("a", None, 1.0, weight=math.nan)], "weight of a must be a positive number"),
    ([group("g", None, weight=math.inf)], "weight of g must be a positive number"),
    ([ns("a", None, -1.0)], "decayed usage of a must be a finite number, at least 0"),
    ([ns("a", None, math.nan)], "decayed usage of a must be a finite number"),
    ([ns("a", None, 1.0), ns("a", None, 2.0)], "a appears twice"),
    ([ns("a", "nowhere", 1.0)], "parent nowhere of a is not in the hierarchy"),
    ([ns("a", None, 1.0), ns("b", "a", 1.0)], "parent a of b is a namespace"),
    ([group("g", "h"), group("h", "g"), ns("a", "g", 1.0)], "cycle through a, g, h"),
    ([group("g", "g"), ns("a", None, 1.0)], "cycle through g"),
])
def test_a_hierarchy_that_is_not_a_tree_of_positive_weights_is_refused(nodes: list[ShareNode], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rank_fair_tree(nodes)


@pytest.mark.parametrize("tolerance", [-0.1, math.nan, math.inf])
def test_a_parity_tolerance_out_of_range_is_refused(tolerance: float) -> None:
    with pytest.raises(ValueError, match="parity tolerance must be a finite number"):
        rank_fair_tree([ns("a", None, 1.0)], parity_tolerance=tolerance)
