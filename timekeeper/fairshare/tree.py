"""Slurm's Fair Tree over the budget hierarchy: siblings ranked level by level by usage over share.

Minimal version for branch `fairwire` (the wiring); the `fairshare` branch's replaces it at merge."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ShareNode:
    name: str  # a namespace, or a group's (ClusterGPUBudget's) name
    parent: str | None  # None: a child of the root
    weight: float  # > 0
    usage: float  # decayed GPU-seconds of the namespace's own pods (a group: 0)
    is_namespace: bool


@dataclass(frozen=True)
class LevelStanding:
    level: int
    node: str
    share: float
    usage: float
    ratio: float
    rank: int
    siblings: int


@dataclass(frozen=True)
class NamespaceStanding:
    namespace: str
    rank: int
    of: int
    share_of_cluster: float
    ratio: float
    decisive_level: int
    path: tuple[LevelStanding, ...]


def rank_fair_tree(nodes: Sequence[ShareNode], parity_tolerance: float = 0.05) -> dict[str, NamespaceStanding]:
    by_name = {node.name: node for node in nodes}
    children: dict[str | None, list[str]] = {}
    for node in nodes:
        parent = node.parent if node.parent in by_name and node.parent != node.name else None
        children.setdefault(parent, []).append(node.name)
    subtree: dict[str, float] = {}

    def usage_of(name: str, depth: int = 0) -> float:
        if name not in subtree:
            below = children.get(name, []) if depth < 16 else []
            subtree[name] = by_name[name].usage + sum(usage_of(child, depth + 1) for child in below)
        return subtree[name]

    standings: dict[str, LevelStanding] = {}
    ordered: list[tuple[str, tuple[LevelStanding, ...]]] = []

    def walk(parent: str | None, path: tuple[LevelStanding, ...]) -> None:
        names = children.get(parent, [])
        weights = sum(by_name[n].weight for n in names)
        used = sum(usage_of(n) for n in names)
        level = []
        for name in names:
            share = by_name[name].weight / weights
            usage = usage_of(name) / used if used > 0 else 0.0
            level.append((usage / share, name, share, usage))
        level.sort()
        for rank, (ratio, name, share, usage) in enumerate(level, 1):
            standings[name] = LevelStanding(len(path) + 1, name, share, usage, ratio, rank, len(level))
            here = (*path, standings[name])
            if by_name[name].is_namespace:
                ordered.append((name, here))
            if len(here) < 16:
                walk(name, here)

    walk(None, ())
    result = {}
    for rank, (name, path) in enumerate(ordered, 1):
        decisive = next((s for s in path if abs(s.ratio - 1.0) > parity_tolerance), None)
        cluster_share = 1.0
        for standing in path:
            cluster_share *= standing.share
        result[name] = NamespaceStanding(name, rank, len(ordered), cluster_share,
                                         decisive.ratio if decisive else 1.0, decisive.level if decisive else 0, path)
    return result
