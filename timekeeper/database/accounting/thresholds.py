"""The idle threshold in force per namespace, which every charge and utilisation reading judges idle streaks by."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpusharing.idle.policy import DEFAULT_UTILISATION_PERCENT
from timekeeper.budgets.hierarchy import idle_policy_of
from timekeeper.database.budgets.store import BudgetStore


class IdleThresholds:
    """The idle threshold in force per namespace (the policy's `utilisationPercent`), from every budget read at most
    every `refresh_seconds`: a policy change reaches the streaks within that time."""

    def __init__(self, budgets: BudgetStore, refresh_seconds: float, monotonic: Callable[[], float] = time.monotonic):
        self.store = budgets
        self.refresh_seconds = refresh_seconds
        self._monotonic = monotonic
        self._read_at: float | None = None
        self._budgets: dict[str, Any] = {}

    def __call__(self, namespace: str) -> float:
        if self._read_at is None or self._monotonic() - self._read_at >= self.refresh_seconds:
            self._budgets, self._read_at = self.store.budgets(), self._monotonic()
        policy = idle_policy_of(self._budgets, namespace, self.store.default_idle)
        return DEFAULT_UTILISATION_PERCENT if policy is None else policy.policy.utilisation_percent
