"""Slurm's Fair Tree over the budget hierarchy: at each level siblings are ranked by how much of their share they used
lately (their ratio, usage over share: 0 for nothing used), and every namespace below a lighter sibling ranks above
every namespace below a heavier one. A namespace's band follows its ratio at the decisive level, the highest one off
parity. docs/fair-share.md (Fair Tree) tells why, and what follows for departments, split teams and idle clusters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_PARITY_TOLERANCE = 0.05


@dataclass(frozen=True)
class ShareNode:
    """One node of the budget hierarchy as fair share sees it."""

    name: str  # a namespace, or a group's (ClusterGPUBudget's) name
    parent: str | None  # None: a child of the root
    weight: float  # spec.fairShare.weight, else the budget's GPU-minutes (resolved by the caller); > 0
    usage: float  # decayed GPU-seconds of the namespace's own pods (a group: 0; its subtree adds up)
    is_namespace: bool


@dataclass(frozen=True)
class LevelStanding:
    """A node among its siblings, as `sshare -l` shows it."""

    level: int  # 1: a child of the root
    node: str
    share: float  # weight normalised among siblings
    usage: float  # the subtree's decayed usage normalised among siblings (0 when they used nothing)
    ratio: float  # usage / share (0: used nothing), what siblings are ranked by (Fair Tree's S/U inverted)
    rank: int  # 1-based among siblings, lightest first; ties broken by name
    siblings: int
    weight: float = 0.0  # the node's own weight, as given
    decayed_usage: float = 0.0  # the subtree's decayed GPU-seconds
    siblings_usage: float = 0.0  # the decayed GPU-seconds of the node and its siblings together

    def at_parity(self, tolerance: float) -> bool:
        """Whether this level decides nothing: the siblings used nothing at all, or the ratio is within the tolerance of
        1."""
        return not self.siblings_usage > 0 or abs(self.ratio - 1.0) <= tolerance


@dataclass(frozen=True)
class NamespaceStanding:
    """Where a namespace stands: its rank over every namespace, and why."""

    namespace: str
    rank: int  # over every namespace, Fair Tree order (depth-first by sibling rank), lightest = 1
    of: int
    share_of_cluster: float  # product of the normalised shares along its path: its fair share of the cluster's GPUs
    # the ratio at the decisive level: the highest level whose ratio is off parity (|ratio-1| > tolerance); 1.0 if none
    ratio: float
    decisive_level: int  # that level (0: none, at parity everywhere)
    path: tuple[LevelStanding, ...]  # level 1 first
    parity_tolerance: float = DEFAULT_PARITY_TOLERANCE  # what the decisive level was chosen with


def decisive(path: Sequence[LevelStanding], tolerance: float) -> tuple[int, float]:
    """The decisive level along a path and its ratio: the first level off parity, else (0, 1.0)."""
    for standing in path:
        if not standing.at_parity(tolerance):
            return standing.level, standing.ratio
    return 0, 1.0


def rank_fair_tree(
    nodes: Sequence[ShareNode], parity_tolerance: float = DEFAULT_PARITY_TOLERANCE
) -> dict[str, NamespaceStanding]:
    """Every namespace's standing under Fair Tree, by namespace name (in rank order). Refuses (ValueError) a
    hierarchy that is not a tree of namespaces under groups, a weight that is not positive, a usage below zero."""
    if not (math.isfinite(parity_tolerance) and parity_tolerance >= 0):
        raise ValueError(f"the parity tolerance must be a finite number, at least 0, not {parity_tolerance!r}")
    by_name = _checked(nodes)
    children: dict[str | None, list[ShareNode]] = {}
    for node in by_name.values():
        children.setdefault(node.parent, []).append(node)
    order = _top_down(children, len(by_name))
    # Sums by math.fsum, correctly rounded: the same figures, to the bit, whatever order the nodes came in.
    subtree_usage: dict[str, float] = {}
    namespaces_below: dict[str, int] = {}
    for node in reversed(order):
        below = children.get(node.name, [])
        subtree_usage[node.name] = math.fsum([node.usage, *(subtree_usage[child.name] for child in below)])
        namespaces_below[node.name] = int(node.is_namespace) + sum(namespaces_below[child.name] for child in below)

    standings: dict[str, NamespaceStanding] = {}
    count = sum(1 for node in order if node.is_namespace)
    # Depth-first, lightest sibling first: a stack of (node, its path, its share of the cluster), the lightest on top.
    stack: list[tuple[str, tuple[LevelStanding, ...], float]] = []

    def push_children(parent: str | None, path: tuple[LevelStanding, ...], parent_share: float) -> None:
        # a group with no namespace below takes no part: its weight would only shrink its siblings' shares
        kept = [child for child in children.get(parent, []) if namespaces_below[child.name]]
        ranked = _ranked_siblings(kept, subtree_usage, len(path) + 1)
        stack.extend((level.node, (*path, level), parent_share * level.share) for level in reversed(ranked))

    push_children(None, (), 1.0)
    while stack:
        name, path, share = stack.pop()
        if by_name[name].is_namespace:
            decisive_level, ratio = decisive(path, parity_tolerance)
            standings[name] = NamespaceStanding(
                name, len(standings) + 1, count, share, ratio, decisive_level, path, parity_tolerance
            )
        else:
            push_children(name, path, share)
    return standings


def _ranked_siblings(siblings: list[ShareNode], subtree_usage: dict[str, float], level: int) -> list[LevelStanding]:
    total_weight = math.fsum(node.weight for node in siblings)
    total_usage = math.fsum(subtree_usage[node.name] for node in siblings)
    rows = []
    for node in siblings:
        share = node.weight / total_weight
        usage = subtree_usage[node.name] / total_usage if total_usage > 0 else 0.0
        rows.append((usage / share, node.name, node, share, usage))
    rows.sort(key=lambda row: (row[0], row[1]))  # lightest first, ties by name: never the input's order
    return [
        LevelStanding(level, name, share, usage, ratio, rank, len(rows), node.weight, subtree_usage[name], total_usage)
        for rank, (ratio, name, node, share, usage) in enumerate(rows, start=1)
    ]


def _checked(nodes: Sequence[ShareNode]) -> dict[str, ShareNode]:
    by_name: dict[str, ShareNode] = {}
    for node in nodes:
        if node.name in by_name:
            raise ValueError(f"{node.name} appears twice in the hierarchy")
        if not (math.isfinite(node.weight) and node.weight > 0):
            raise ValueError(f"the fair-share weight of {node.name} must be a positive number, not {node.weight!r}")
        if not (math.isfinite(node.usage) and node.usage >= 0):
            raise ValueError(
                f"the decayed usage of {node.name} must be a finite number, at least 0, not {node.usage!r}"
            )
        by_name[node.name] = node
    for node in nodes:
        if node.parent is None:
            continue
        parent = by_name.get(node.parent)
        if parent is None:
            raise ValueError(f"the parent {node.parent} of {node.name} is not in the hierarchy")
        if parent.is_namespace:
            raise ValueError(f"the parent {node.parent} of {node.name} is a namespace: only groups hold other nodes")
    return by_name


def _top_down(children: dict[str | None, list[ShareNode]], total: int) -> list[ShareNode]:
    """Every node, each after its parent; refuses nodes that no walk from the root reaches (a cycle)."""
    order: list[ShareNode] = []
    frontier: list[str | None] = [None]
    while frontier:
        below = [child for parent in frontier for child in children.get(parent, [])]
        order.extend(below)
        frontier = [child.name for child in below]
    if len(order) != total:
        reached = {node.name for node in order}
        stranded = sorted(node.name for kids in children.values() for node in kids if node.name not in reached)
        raise ValueError(f"the hierarchy has a cycle through {', '.join(stranded[:5])}")
    return order
