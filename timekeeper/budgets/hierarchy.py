"""Budget hierarchies (Slurm's Grp* limits): ancestors, what may be a parent, and statuses rolled up a group. Plain
data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gpusharing.contract import Period
from gpusharing.idle.policy import IdlePolicy, PolicyInForce, in_force
from gpusharing.names import is_group
from timekeeper.budgets.periods import PeriodWindow
from timekeeper.budgets.status import Budget, BudgetStatus

# Ancestors above a namespace's budget (a team, a department, an organisation, ...): bounds every walk up a chain.
MAX_ANCESTORS = 4

def ancestry(budgets: Mapping[str, Budget], name: str) -> list[str]:
    """The names above `name`, parent first, as far as they have budgets; at most MAX_ANCESTORS, never a loop."""
    chain: list[str] = []
    parent = budgets[name].parent if name in budgets else None
    while (
        parent is not None
        and parent in budgets
        and parent != name
        and parent not in chain
        and len(chain) < MAX_ANCESTORS
    ):
        chain.append(parent)
        parent = budgets[parent].parent
    return chain


def idle_policy_of(budgets: Mapping[str, Budget], name: str, default: IdlePolicy | None) -> PolicyInForce | None:
    """The idle policy in force for `name`: its budget's, else the nearest ancestor's that sets one, else `default`
    (the default budget's settings)."""
    chain = [name, *ancestry(budgets, name)] if name in budgets else []
    return in_force([(n, budgets[n].idle) for n in chain], default)


def hierarchy_problem(
    budgets: Mapping[str, Budget], name: str, parent: str | None, parent_must_exist: bool = True
) -> str | None:
    """Why `name` may not have `parent` among `budgets` (the other budgets' parents as they are), or None.

    A parent is a group budget; no budget is its own ancestor; no chain is longer than MAX_ANCESTORS above a
    namespace, counting the groups below `name` too.
    """
    if parent is None:
        return None
    if not is_group(parent):
        return (f"the parent {parent!r} of {name} is a namespace: a parent is a group budget (a name with a dot, "
                "e.g. team.vision)")
    if parent == name:
        return f"{name} cannot be its own parent: {name} -> {name} is a cycle"
    if parent not in budgets:
        return (
            f"the parent of {name} is {parent}, which has no budget: set the group's budget first"
            if parent_must_exist
            else None
        )
    chain = [parent]
    while True:
        if chain[-1] == name:
            return f"{name} cannot have the parent {parent}: {' -> '.join([name, *chain])} is a cycle"
        above = budgets[chain[-1]].parent if chain[-1] in budgets else None
        if above is None or above in chain:
            break
        chain.append(above)
    # A group is itself above the namespaces below it, with the groups between them.
    levels = len(chain) + (1 + _height(budgets, name) if is_group(name) else 0)
    if levels > MAX_ANCESTORS:
        return (f"{name} cannot have the parent {parent}: {levels} levels of budgets above a namespace, "
                f"more than {MAX_ANCESTORS}")
    return None


def _height(budgets: Mapping[str, Budget], name: str, depth: int = 0) -> int:
    """How many levels of group budgets lie below `name` (0 for a namespace or a group without children)."""
    if depth > MAX_ANCESTORS:
        return depth
    children = [child for child, budget in budgets.items() if budget.parent == name and child != name]
    return max((1 + _height(budgets, child, depth + 1) for child in children), default=0)


UsageByPeriod = Mapping[str, Mapping[Period, int]]  # name -> kind of period -> micro-GPU-seconds in its current one
TopUpsByPeriod = Mapping[str, Mapping[Period, float]]


def roll_up(
    budgets: Mapping[str, Budget],
    used: UsageByPeriod,
    topped: TopUpsByPeriod,
    windows: Mapping[Period, PeriodWindow],
    managed_by: Mapping[str, str] | None = None,
    default_idle: IdlePolicy | None = None,
) -> dict[str, BudgetStatus]:
    """Every budget's status: a namespace's use is its own, a group's the sum of its descendants' in the group's
    own period; each status carries its ancestors' (Slurm's Grp* limits: a namespace is over budget when it or any
    ancestor is), and the idle policy in force: the nearest up its chain, else `default_idle`. A parent without a
    budget is no ancestor."""
    chains = {name: ancestry(budgets, name) for name in budgets}
    group_used: dict[str, int] = {}
    for name, chain in chains.items():
        if is_group(name):
            continue
        for ancestor in chain:
            kind = budgets[ancestor].period
            group_used[ancestor] = group_used.get(ancestor, 0) + used.get(name, {}).get(kind, 0)
    alone = {
        name: BudgetStatus(
            name,
            budget.gpu_minutes,
            budget.period,
            windows[budget.period],
            group_used.get(name, 0) if is_group(name) else used.get(name, {}).get(budget.period, 0),
            topped.get(name, {}).get(budget.period, 0.0),
            budget.evict_on_exhaustion,
            budget.parent,
            budget.warning_thresholds,
            (managed_by or {}).get(name),
            admission=budget.admission,
            on_shortfall=budget.on_shortfall,
            idle=budget.idle,
        )
        for name, budget in budgets.items()
    }
    return {
        name: replace(status, ancestors=tuple(alone[a] for a in chains[name]),
                      idle_in_force=idle_policy_of(budgets, name, default_idle))
        for name, status in alone.items()
    }
