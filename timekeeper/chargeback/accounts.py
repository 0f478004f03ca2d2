"""The budget hierarchy's GPU-hours and costs over a window, as Slurm's `sreport cluster AccountUtilizationByUser`
gives them (docs/chargeback.md, "Reports"): each namespace's own, each group's its subtree's, from the very rows of
the FOCUS export, so that the two agree. Plain data.

Costs are summed exactly (micro-GPU-seconds × price in millionths, integers) and rounded once, for the total shown.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpusharing.names import is_group
from timekeeper.budgets.hierarchy import ancestry
from timekeeper.budgets.status import Budget
from timekeeper.chargeback.focus import MICRO_GPU_SECONDS_PER_GPU_HOUR, FocusCharge
from timekeeper.chargeback.prices import AMOUNT_PLACES

CLUSTER = "(cluster)"  # the tree's root
UNALLOCATED = "(unallocated)"  # the capacity nobody held, kept as the cluster's own line
_PRICE_UNITS = 10**AMOUNT_PLACES
_COST = Decimal(1).scaleb(-AMOUNT_PLACES)


@dataclass
class Account:
    """One level of the tree: its own GPU time and cost, and its subtree's (its own included)."""

    name: str
    kind: str  # cluster, group, namespace, or unallocated
    parent: str | None
    depth: int
    own_micro_gpu_seconds: int = 0
    own_cost_units: int = 0  # micro-GPU-seconds × contracted price in millionths
    micro_gpu_seconds: int = 0
    cost_units: int = 0
    # Of the time, the corrections: late time booked in the window for hours of periods closed before it.
    own_correction_micro_gpu_seconds: int = 0
    correction_micro_gpu_seconds: int = 0

    def to_json(self, priced: bool) -> dict[str, Any]:
        return {
            "name": self.name, "kind": self.kind, "parent": self.parent, "depth": self.depth,
            "ownGpuHours": _hours(self.own_micro_gpu_seconds), "gpuHours": _hours(self.micro_gpu_seconds),
            "ownCost": _cost(self.own_cost_units) if priced else None,
            "cost": _cost(self.cost_units) if priced else None,
            "ownMicroGpuSeconds": self.own_micro_gpu_seconds, "microGpuSeconds": self.micro_gpu_seconds,
            "ownCorrectionGpuHours": _hours(self.own_correction_micro_gpu_seconds),
            "correctionGpuHours": _hours(self.correction_micro_gpu_seconds),
            "ownCorrectionMicroGpuSeconds": self.own_correction_micro_gpu_seconds,
            "correctionMicroGpuSeconds": self.correction_micro_gpu_seconds,
        }


def accounts(rows: Iterable[FocusCharge], budgets: Mapping[str, Budget], scope: str | None) -> list[Account]:
    """The tree of `rows` (an export's), in depth-first order, children by name: the cluster, its groups as the
    budgets nest them, each namespace under its parent; only `scope`'s subtree when one is given (a namespace or a
    group)."""
    own: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # micro-GPU-seconds, cost units, of it corrections
    for row in rows:
        name = UNALLOCATED if row.namespace is None else row.namespace
        price = row.contracted_per_gpu_hour
        own[name][0] += row.micro_gpu_seconds
        own[name][1] += row.micro_gpu_seconds * (0 if price is None else int(price.scaleb(AMOUNT_PLACES)))
        own[name][2] += row.micro_gpu_seconds if row.correction else 0
    parents = {name: (ancestry(budgets, name) or [CLUSTER])[0] for name in own if name != UNALLOCATED}
    parents |= {group: (ancestry(budgets, group) or [CLUSTER])[0] for name in list(parents)
                for group in ancestry(budgets, name)}
    if UNALLOCATED in own:
        parents[UNALLOCATED] = CLUSTER
    children: dict[str, list[str]] = defaultdict(list)
    for name, parent in parents.items():
        children[parent].append(name)
    tree: list[Account] = []

    def walk(name: str, parent: str | None, depth: int) -> Account:
        kind = ("cluster" if name == CLUSTER else "unallocated" if name == UNALLOCATED
                else "group" if is_group(name) else "namespace")
        micro, units, corrections = own.get(name, (0, 0, 0))
        account = Account(name, kind, parent, depth, micro, units, micro, units, corrections, corrections)
        tree.append(account)
        for child in sorted(children.get(name, [])):
            below = walk(child, name, depth + 1)
            account.micro_gpu_seconds += below.micro_gpu_seconds
            account.cost_units += below.cost_units
            account.correction_micro_gpu_seconds += below.correction_micro_gpu_seconds
        return account

    walk(CLUSTER, None, 0)
    if scope is None:
        return tree
    top = next((index for index, account in enumerate(tree) if account.name == scope), None)
    if top is None:
        return []
    depth = tree[top].depth
    end = next((index for index in range(top + 1, len(tree)) if tree[index].depth <= depth), len(tree))
    return tree[top:end]


def _hours(micro: int) -> float:
    return micro / MICRO_GPU_SECONDS_PER_GPU_HOUR


def _cost(units: int) -> str:
    """The cost of `units` (micro-GPU-seconds × millionths of a price per GPU-hour), to the price sheet's places."""
    exact = Decimal(units) / (MICRO_GPU_SECONDS_PER_GPU_HOUR * _PRICE_UNITS)
    return f"{exact.quantize(_COST):f}"
