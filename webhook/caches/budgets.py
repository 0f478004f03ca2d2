"""Namespace budget states, kept in memory and refreshed in the background: never a network call per request."""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpusharing.contract import AdmissionMode, BudgetState, Shortfall
from gpusharing.serving.jsonhttp import JsonClient, Unreachable
from gpusharing.thresholds import usage_warning
from webhook.caches.reservations import Grant, Reservations

log = logging.getLogger(__name__)

LISTING_PATH = "/api/v1/budgets"


MAX_ADMISSION_IDS = 100_000  # per namespace in one listing: more running pods than any namespace has


@dataclass(frozen=True)
class Uncommitted:
    """What the tightest budget over a namespace has left once its running pods' deadlines are counted."""

    micro_gpu_seconds: int
    budget: str  # the namespace's own budget, or the ancestor whose is tighter
    remaining_gpu_minutes: float
    committed_gpu_minutes: float


@dataclass(frozen=True)
class NamespaceBudget:
    """What admission needs of a namespace's budget: its effective state (over budget through an ancestor too),
    the warnings every GPU pod admitted there gets (its own budget's or an ancestor's, above a threshold), and for
    safe admission what is left uncommitted (None: unlimited, or `commitments_known` False: not known)."""

    state: BudgetState
    warnings: tuple[str, ...] = ()
    admission: AdmissionMode = AdmissionMode.OPEN
    on_shortfall: Shortfall = Shortfall.DEMOTE
    commitments_known: bool = False
    uncommitted: Uncommitted | None = None
    admission_ids: frozenset[str] = field(default_factory=frozenset)  # the reservations the timekeeper has counted


UNKNOWN = NamespaceBudget(BudgetState.UNKNOWN)


@dataclass(frozen=True)
class BudgetStates:
    """The timekeeper's listing as the webhook keeps it: one dictionary lookup per admission."""

    listed: Mapping[str, NamespaceBudget]
    default: NamespaceBudget = UNKNOWN  # every namespace the listing leaves out
    listed_at: float = 0.0  # the timekeeper's stamp on the listing (its database's time), told back on the next poll

    def of(self, namespace: str) -> NamespaceBudget:
        return self.listed.get(namespace, self.default)


def states_from_listing(body: object) -> BudgetStates:
    """The states and warnings in the timekeeper's `GET /api/v1/budgets` answer; unknown states read as unknown,
    and warnings the webhook cannot read are left out. The sentences are made here, once per poll.

    A namespace the listing leaves out is under the default budget with no use: `default.state`. A timekeeper
    that does not say (before it did) leaves such namespaces unknown. Group budgets (names with a dot) are listed
    too; no namespace has such a name, so they are never looked up.
    """
    if not isinstance(body, Mapping) or not isinstance(body.get("items"), list):
        raise ValueError("expected an object with an 'items' list")
    listed: dict[str, NamespaceBudget] = {}
    for item in body["items"]:
        if isinstance(item, Mapping) and isinstance(item.get("namespace"), str):
            namespace = item["namespace"]
            listed[namespace] = NamespaceBudget(
                _state(item.get("state")), _warnings(namespace, item.get("warnings")), **_admission(item)
            )
    default, listed_at = body.get("default"), body.get("listedAt")
    return BudgetStates(listed, NamespaceBudget(_state(default.get("state"))) if isinstance(default, Mapping) else UNKNOWN,
                        float(listed_at) if isinstance(listed_at, (int, float)) and math.isfinite(listed_at) else 0.0)


def _warnings(namespace: str, raw: object) -> tuple[str, ...]:
    if not isinstance(raw, list):
        return ()
    warnings = []
    for warning in raw:
        try:
            warnings.append(usage_warning(namespace, warning))
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(warnings)


def _admission(item: Mapping[str, Any]) -> dict[str, Any]:
    """Safe admission's part of a listed budget; what the webhook cannot read leaves the budget open (as before)."""
    try:
        mode, shortfall = AdmissionMode(item.get("admission", "open")), Shortfall(item.get("onShortfall", "demote"))
    except ValueError:
        return {}
    known = isinstance(item.get("committedGpuMinutes"), (int, float))
    raw, ids = item.get("uncommitted"), item.get("admissionIds")
    uncommitted = None
    if isinstance(raw, Mapping):
        try:
            uncommitted = Uncommitted(int(raw["microGpuSeconds"]), str(raw["budget"]), float(raw["remainingGpuMinutes"]),
                                      float(raw["committedGpuMinutes"]))
        except (KeyError, TypeError, ValueError):
            known = False
    admission_ids = frozenset(i for i in ids[:MAX_ADMISSION_IDS] if isinstance(i, str)) if isinstance(ids, list) else frozenset()
    return {"admission": mode, "on_shortfall": shortfall, "commitments_known": known, "uncommitted": uncommitted,
            "admission_ids": admission_ids}


def _state(raw: object) -> BudgetState:
    try:
        return BudgetState(raw)
    except ValueError:
        return BudgetState.UNKNOWN


class BudgetStateCache:
    """The last known state of every namespace, and of those the timekeeper did not list; before the first answer
    every namespace is unknown (treated as in budget).

    Each poll names this process and the listing it holds in force, so that the timekeeper evicts a namespace's
    pods only once every webhook process admits its new pods as over budget (timekeeper.cluster.webhooks)."""

    def __init__(
        self,
        timekeeper_url: str | None,
        token_file: str | None = None,
        refresh_seconds: float = 5.0,
        on_refresh: Any = None,
        reservations: Reservations | None = None,
    ):
        self._http = JsonClient(timekeeper_url, timeout=5, connect_timeout=2) if timekeeper_url else None
        self._url = f"{timekeeper_url}{LISTING_PATH}"
        self._token_file = token_file
        self._refresh_seconds = refresh_seconds
        self._on_refresh = on_refresh  # called with True/False after each attempt (metrics)
        self._states = BudgetStates({})
        self.reservations = reservations or Reservations()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.name = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"[-253:]

    def state_of(self, namespace: str) -> BudgetState:
        return self._states.of(namespace).state

    def budget_of(self, namespace: str) -> NamespaceBudget:
        return self._states.of(namespace)

    def reserve(self, namespace: str, admission_id: str, micro_gpu_seconds: int, hold: bool = True) -> Grant:
        """Safe admission's reservation of a pod's commitment against what the namespace has left uncommitted now
        (`hold` False: only whether it would be granted)."""
        with self.reservations.lock:
            uncommitted = self._states.of(namespace).uncommitted
            left = uncommitted.micro_gpu_seconds if uncommitted is not None else 0
            return self.reservations.reserve(namespace, admission_id, micro_gpu_seconds, left, hold)

    def swap(self, states: BudgetStates) -> None:
        """Puts a listing in force, and gives up the reservations it counts, at once (no pod sees one without the other)."""
        with self.reservations.lock:
            self._states = states
            self.reservations.settle({ns: budget.admission_ids for ns, budget in states.listed.items()})

    def refresh(self) -> bool:
        """One poll; on failure the last known states stay in force."""
        if self._http is None:
            return False
        try:
            held = {"webhook": self.name, "inForce": repr(self._states.listed_at), "refreshSeconds": str(self._refresh_seconds)}
            answer = self._http.request("GET", LISTING_PATH, token=self._token(), query=held)
            if answer.status != 200:
                raise ValueError(f"HTTP {answer.status}: {answer.message}")
            states = states_from_listing(answer.json())
        except (Unreachable, ValueError, OSError) as exc:
            log.warning("budget states not refreshed from %s, keeping the last known: %s", self._url, exc)
            self._report(False)
            return False
        self.swap(states)
        self._report(True)
        return True

    def start(self) -> None:
        if self._http is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="budget-state-refresh", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:  # an unforeseen failure must not end the polling: the states would never change again
                log.exception("budget states not refreshed from %s, keeping the last known", self._url)
            self._stop.wait(self._refresh_seconds)

    def _token(self) -> str | None:
        if not self._token_file:
            return None
        with open(self._token_file, encoding="utf-8") as handle:  # read afresh: the kubelet rotates it
            return handle.read().strip()

    def _report(self, ok: bool) -> None:
        # A stopping worker's metrics files may already be gone: a poll that ends after stop() counts nothing.
        if self._on_refresh is not None and not self._stop.is_set():
            self._on_refresh(ok)
