"""Safe admission's local reservations: what this webhook process has committed of each namespace's uncommitted
budget since the timekeeper last counted.

The timekeeper's listing says what a namespace has left uncommitted, as of the pods it has seen. Between two
listings a burst of pods would each find the same figure, so every pod admitted in budget reserves its commitment
here, and the next pod only gets what is left. A reservation ends when a listing counts its pod (its admission id
is among the listing's), or after `keep_seconds` when no pod ever came of it (the API server refused it after the
webhook, say). Each of the `slices` webhook processes (replicas x workers) reserves against its own equal slice of
the uncommitted budget, so that together they cannot overrun it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

# A reinvoked webhook sees the pod it patched moments earlier, with the admission id it gave it.
REINVOCATION_SECONDS = 30.0


@dataclass(frozen=True)
class Grant:
    granted: bool
    available: int  # micro-GPU-seconds this process could commit in the namespace before this pod


@dataclass
class _Reservation:
    micro_gpu_seconds: int
    at: float


class Reservations:
    def __init__(self, slices: int = 1, keep_seconds: float = 300.0, clock: Callable[[], float] = time.monotonic):
        self.slices = slices
        self.keep_seconds = keep_seconds
        self.clock = clock
        self.lock = threading.Lock()  # held by the budget cache while it swaps in a listing and settles
        self._held: dict[str, dict[str, _Reservation]] = {}
        self._totals: dict[str, int] = {}  # the sum of each namespace's reservations: a burst's pods add in O(1)

    def reserve(self, namespace: str, admission_id: str, micro_gpu_seconds: int, uncommitted: int, hold: bool = True) -> Grant:
        """Reserves the pod's commitment if this process's slice of `uncommitted`, less its reservations, covers it
        (the caller holds `lock`, and read `uncommitted` under it); `hold` False only answers (a dry run)."""
        now = self.clock()
        held = self._held.setdefault(namespace, {})
        available = uncommitted // self.slices - self._totals.get(namespace, 0)
        earlier = held.get(admission_id)
        if earlier is not None:
            if earlier.micro_gpu_seconds == micro_gpu_seconds and now - earlier.at < REINVOCATION_SECONDS:
                return Grant(True, available + micro_gpu_seconds)
            available += earlier.micro_gpu_seconds  # the pod's earlier reservation, which this one replaces
        if micro_gpu_seconds > available:
            return Grant(False, max(0, available))
        if hold:
            if earlier is not None:  # the same id again, later or for another amount: it replaces the earlier
                self._totals[namespace] -= earlier.micro_gpu_seconds
            held[admission_id] = _Reservation(micro_gpu_seconds, now)
            self._totals[namespace] = self._totals.get(namespace, 0) + micro_gpu_seconds
        return Grant(True, available)

    def settle(self, counted: Mapping[str, frozenset[str]]) -> None:
        """Gives up what a new listing counts (admission ids by namespace), and what has waited too long (under `lock`)."""
        expired = self.clock() - self.keep_seconds
        for namespace in list(self._held):
            ids = counted.get(namespace, frozenset())
            kept = {i: r for i, r in self._held[namespace].items() if i not in ids and r.at > expired}
            if kept:
                self._held[namespace] = kept
                self._totals[namespace] = sum(r.micro_gpu_seconds for r in kept.values())
            else:
                del self._held[namespace]
                self._totals.pop(namespace, None)

    def held(self, namespace: str) -> int:
        with self.lock:
            return self._totals.get(namespace, 0)
