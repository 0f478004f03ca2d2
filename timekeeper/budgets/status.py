"""A budget and its status: what an admin set, what was used, and the state that follows. Plain data, no Flask, no
SQL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpusharing.contract import AdmissionMode, BudgetState, Period, Shortfall
from gpusharing.idle.policy import IdlePolicy, PolicyInForce
from gpusharing.listing import BudgetWarning, DefaultBudget, FairShareStanding, IdleHold, ListedBudget, Uncommitted
from gpusharing.names import is_group
from gpusharing.thresholds import DEFAULT_WARNING_THRESHOLDS
from gpusharing.units.weights import MICROS_PER_GPU_MINUTE
from timekeeper.budgets.periods import PeriodWindow, iso_utc

# How bad a state is: a namespace's effective state is the worst of its own budget's and its ancestors'.
SEVERITY = {BudgetState.UNKNOWN: 0, BudgetState.UNLIMITED: 1, BudgetState.IN_BUDGET: 2, BudgetState.WARNING: 3,
            BudgetState.OVER_BUDGET: 4}


@dataclass(frozen=True)
class Budget:
    """What an admin set for a namespace, or for a group (`namespace` is then the group's name, e.g. team.vision);
    gpu_minutes None means no limit."""

    namespace: str
    gpu_minutes: float | None
    period: Period
    evict_on_exhaustion: bool = False
    parent: str | None = None  # a group budget's name
    warning_thresholds: tuple[int, ...] = DEFAULT_WARNING_THRESHOLDS
    # Safe admission's settings: they act on a namespace's own budget; a group's may carry them, to no effect.
    admission: AdmissionMode = AdmissionMode.OPEN
    on_shortfall: Shortfall = Shortfall.DEMOTE
    idle: IdlePolicy | None = None  # its idle policy; None: the nearest ancestor's, else the default budget's


@dataclass(frozen=True)
class BudgetStatus:
    """A budget in its current period. `used` is the namespace's use, or for a group its descendants' use summed
    in the group's own period; `ancestors` (parent first) carry their own use, and decide the effective `state`."""

    namespace: str
    gpu_minutes: float | None
    period: Period
    window: PeriodWindow
    used_micro_gpu_seconds: int
    top_up_gpu_minutes: float
    evict_on_exhaustion: bool
    parent: str | None = None
    warning_thresholds: tuple[int, ...] = DEFAULT_WARNING_THRESHOLDS
    managed_by: str | None = None  # the GPUBudget or ClusterGPUBudget that owns it (the REST API may not change it)
    ancestors: tuple[BudgetStatus, ...] = ()
    admission: AdmissionMode = AdmissionMode.OPEN
    on_shortfall: Shortfall = Shortfall.DEMOTE
    idle: IdlePolicy | None = None  # its own idle policy
    idle_in_force: PolicyInForce | None = None  # the one that applies: its own, an ancestor's or the default budget's

    @property
    def used_gpu_minutes(self) -> float:
        return self.used_micro_gpu_seconds / MICROS_PER_GPU_MINUTE

    @property
    def allowance_gpu_minutes(self) -> float | None:
        """The budget plus this period's top-ups; None when unlimited."""
        return None if self.gpu_minutes is None else self.gpu_minutes + self.top_up_gpu_minutes

    @property
    def remaining_gpu_minutes(self) -> float | None:
        allowance = self.allowance_gpu_minutes
        return None if allowance is None else max(0.0, allowance - self.used_gpu_minutes)

    @property
    def percent_used(self) -> float | None:
        """Use as a percent of the allowance; None when unlimited, 100 for a budget of 0 (it allows nothing)."""
        allowance = self.allowance_gpu_minutes
        if allowance is None:
            return None
        return 100.0 if allowance <= 0 else 100.0 * self.used_gpu_minutes / allowance

    @property
    def crossed_thresholds(self) -> tuple[int, ...]:
        """The warning thresholds this period's use has reached."""
        return crossed_thresholds(self.allowance_gpu_minutes, self.used_micro_gpu_seconds, self.warning_thresholds)

    @property
    def own_state(self) -> BudgetState:
        """The state of this budget alone."""
        return state_for(self.allowance_gpu_minutes, self.used_micro_gpu_seconds, self.warning_thresholds)

    @property
    def state(self) -> BudgetState:
        """The effective state: the worst of its own and its ancestors' (over budget when any of them is)."""
        return max((status.own_state for status in (self, *self.ancestors)), key=SEVERITY.__getitem__)

    @property
    def limited_by(self) -> str | None:
        """The budget (this one, or the nearest ancestor) whose own state is the effective state; None when
        unlimited."""
        state = self.state
        if state is BudgetState.UNLIMITED:
            return None
        return next(status.namespace for status in (self, *self.ancestors) if status.own_state is state)

    @property
    def kind(self) -> str:
        return "group" if is_group(self.namespace) else "namespace"

    def warning(self) -> BudgetWarning:
        """What the webhook and the Events say of a budget above a warning threshold (gpusharing.thresholds)."""
        allowance = self.allowance_gpu_minutes  # a budget at a warning threshold has one
        return BudgetWarning(self.namespace, round(self.percent_used or 0.0, 1),
                             0.0 if allowance is None else allowance, self.period, iso_utc(self.window.start))

    def listed(
        self, committed_gpu_minutes: float | None = None, uncommitted: Uncommitted | None = None,
        idle_holds: Sequence[IdleHold] = (), fair_share: FairShareStanding | None = None,
    ) -> ListedBudget:
        """The status as the listing carries it (gpusharing.listing), with what the services know of now: its pods'
        commitments, its owners held out of budget, its fair-share band. The one place a status becomes the
        contract's, for the listing, a budget read alone and the audit log alike."""
        percent = self.percent_used
        return ListedBudget(
            namespace=self.namespace,
            kind=self.kind,
            gpu_minutes=self.gpu_minutes,
            period=self.period,
            period_start=iso_utc(self.window.start),
            period_end=iso_utc(self.window.end) if self.window.end else None,
            used_gpu_minutes=self.used_gpu_minutes,
            remaining_gpu_minutes=self.remaining_gpu_minutes,
            top_up_gpu_minutes=self.top_up_gpu_minutes,
            percent_used=None if percent is None else round(percent, 1),
            evict_on_exhaustion=self.evict_on_exhaustion,
            warning_thresholds=self.warning_thresholds,
            admission=self.admission,
            on_shortfall=self.on_shortfall,
            idle=None if self.idle is None else self.idle.listed(),
            idle_in_force=None if self.idle_in_force is None else self.idle_in_force.listed(),
            parent=self.parent,
            ancestors=tuple(status.namespace for status in self.ancestors),
            managed_by=self.managed_by,
            own_state=self.own_state,
            state=self.state,
            limited_by=self.limited_by,
            warnings=tuple(status.warning() for status in (self, *self.ancestors)
                           if status.own_state is BudgetState.WARNING),
            committed_gpu_minutes=committed_gpu_minutes,
            uncommitted=uncommitted,
            idle_holds=tuple(idle_holds),
            fair_share=fair_share,
        )

    def to_json(self) -> dict[str, Any]:
        """The budget as the audit log records it: the listing's status without what changes as pods start and end."""
        return self.listed().to_json(current=False)


def state_for(
    allowance_gpu_minutes: float | None, used_micro_gpu_seconds: int, warning_thresholds: tuple[int, ...] = ()
) -> BudgetState:
    """Over budget once the use reaches the allowance (budget plus top-ups; a zero budget allows nothing); a warning
    from the lowest warning threshold on."""
    if allowance_gpu_minutes is None:
        return BudgetState.UNLIMITED
    if used_micro_gpu_seconds >= allowance_gpu_minutes * MICROS_PER_GPU_MINUTE:
        return BudgetState.OVER_BUDGET
    if crossed_thresholds(allowance_gpu_minutes, used_micro_gpu_seconds, warning_thresholds[:1]):
        return BudgetState.WARNING
    return BudgetState.IN_BUDGET


def crossed_thresholds(
    allowance_gpu_minutes: float | None, used_micro_gpu_seconds: int, warning_thresholds: tuple[int, ...]
) -> tuple[int, ...]:
    """The thresholds (percent of the allowance) that the use has reached; none when unlimited."""
    if allowance_gpu_minutes is None:
        return ()
    allowance = allowance_gpu_minutes * MICROS_PER_GPU_MINUTE
    return tuple(t for t in warning_thresholds if used_micro_gpu_seconds * 100 >= t * allowance)


def default_budget(gpu_minutes: float | None, period: Period) -> DefaultBudget:
    """The default budget as `GET /api/v1/budgets` tells it: what holds for every namespace the listing leaves out
    (no budget of its own, no use and no top-up this period), whose state is that of no use at all."""
    return DefaultBudget(gpu_minutes, period, state_for(gpu_minutes, 0))


def effective_budget(
    namespace: str, budget: Budget | None, default_gpu_minutes: float | None, default_period: Period
) -> Budget:
    """The namespace's own budget, or the default one (unlimited when no default is configured; its idle policy, the
    default budget's settings, comes to it as to every namespace without one, see hierarchy.roll_up)."""
    if budget is not None:
        return budget
    return Budget(namespace, default_gpu_minutes, default_period)


def crossed(before: BudgetStatus, after: BudgetStatus) -> bool:
    """Whether the change from `before` to `after` deserves the controller's attention at once: the effective state
    changed, or the budget reached a warning threshold it had not."""
    return before.state is not after.state or before.crossed_thresholds != after.crossed_thresholds

