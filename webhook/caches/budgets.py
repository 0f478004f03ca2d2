"""Namespace budget states, kept in memory and refreshed in the background: never a network call per request."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpusharing.contract import (
    DEFAULT_BUDGET_REFRESH_SECONDS,
    MIN_BUDGET_REFRESH_SECONDS,
    AdmissionMode,
    BudgetState,
    Shortfall,
)
from gpusharing.fairshare import MAX_WEBHOOK_PROCESSES
from gpusharing.listing import BudgetListing, IdleHold, ListedBudget
from gpusharing.outage import Outage
from gpusharing.serving.jsonhttp import JsonClient, Unreachable
from gpusharing.thresholds import usage_warning

log = logging.getLogger(__name__)

LISTING_PATH = "/api/v1/budgets"


@dataclass(frozen=True)
class FairShareBand:
    """A namespace's fair-share band as the timekeeper's `fairshare` task ranked it (docs/fair-share.md)."""

    band_class: str  # its band's PriorityClass
    # the class a pod gets beyond its fair share of the cluster's GPUs (the burst guard): one band lower
    burst_class: str
    share_gpus: float  # its fair share of the cluster's GPUs
    held_gpus: float  # GPUs its pods held when ranked
    reason: str  # one line: why this band
    held_as_of: float = 0.0  # when held_gpus was counted (the timekeeper's database's time)


@dataclass(frozen=True)
class NamespaceBudget:
    """What admission needs of a namespace's budget: its effective state (over budget through an ancestor too),
    the warnings every GPU pod admitted there gets (its own budget's or an ancestor's, above a threshold), and how
    its own budget admits (safe admission reserves with the timekeeper, webhook.caches.reservations)."""

    state: BudgetState
    warnings: tuple[str, ...] = ()
    admission: AdmissionMode = AdmissionMode.OPEN
    on_shortfall: Shortfall = Shortfall.DEMOTE
    # Owners held out of budget (uid -> what the timekeeper says of the hold): an idle pod of theirs was evicted.
    idle_holds: Mapping[str, str] = field(default_factory=dict)
    fair_share: FairShareBand | None = None  # None: fair share is off, or the namespace is not ranked


UNKNOWN = NamespaceBudget(BudgetState.UNKNOWN)


@dataclass(frozen=True)
class BudgetStates:
    """The timekeeper's listing as the webhook keeps it: one dictionary lookup per admission."""

    listed: Mapping[str, NamespaceBudget]
    default: NamespaceBudget = UNKNOWN  # every namespace the listing leaves out
    listed_at: float = 0.0  # the timekeeper's stamp on the listing (its database's time), told back on the next poll
    band_classes: tuple[str, ...] = ()  # fair share's bands' PriorityClasses, lightest first; none: fair share is off
    webhook_processes: int = 1  # live webhook processes, which share the burst guard's room between counts

    def of(self, namespace: str) -> NamespaceBudget:
        return self.listed.get(namespace, self.default)


def states_from_listing(body: object) -> BudgetStates:
    """The states and warnings in the timekeeper's `GET /api/v1/budgets` answer, read through the listing's contract
    (gpusharing.listing: ListingError, a ValueError, for an answer that is no listing); unknown states read as
    unknown, and what the contract cannot read is left out. The sentences are made here, once per poll.

    A namespace the listing leaves out is under the default budget with no use: `default.state`. A listing that
    does not tell its default (an older timekeeper's) leaves such namespaces unknown. Group budgets (names with a
    dot) are listed too; no namespace has such a name, so they are never looked up.
    """
    listing = BudgetListing.from_json(body)
    listed = {item.namespace: _namespace_budget(item) for item in listing.items}
    default = UNKNOWN if listing.default is None else NamespaceBudget(listing.default.state)
    fair_share = listing.fair_share
    classes = () if fair_share is None else fair_share.classes
    processes = 1 if fair_share is None or fair_share.webhook_processes is None else fair_share.webhook_processes
    return BudgetStates(listed, default, float(listing.listed_at or 0.0), classes,
                        max(1, min(processes, MAX_WEBHOOK_PROCESSES)))


def _namespace_budget(item: ListedBudget) -> NamespaceBudget:
    """What admission needs of a listed budget; safe admission's settings the contract could not read leave the
    budget under open admission, admitting by its state alone."""
    band = item.fair_share
    return NamespaceBudget(
        item.state, tuple(usage_warning(item.namespace, warning) for warning in item.warnings),
        item.admission or AdmissionMode.OPEN, item.on_shortfall or Shortfall.DEMOTE,
        idle_holds={hold.uid: _held(hold) for hold in item.idle_holds},
        fair_share=None if band is None else FairShareBand(
            band.band, band.burst_class, float(band.share_gpus), float(band.held_gpus), band.reason or "",
            float(band.held_as_of or 0.0)),
    )


def _held(hold: IdleHold) -> str:
    """The sentence a pod of a held owner is admitted with."""
    return (f"{hold.kind} {hold.name} is held out of budget since {hold.held_at}: its pod {hold.pod} left its GPU idle "
            "and was evicted, and it is back in budget once one of its pods uses its GPU")


@dataclass(frozen=True)
class FairShareAdmission:
    """What admission needs of fair share beyond a namespace's band: the bands' classes (the webhook's own, as its
    two budget classes are), and the GPUs this process admitted in a band since the timekeeper counted a namespace's
    (namespace, the review's uid: a reinvocation's own earlier admission is not counted against it)."""

    classes: tuple[str, ...] = ()
    admitted: Callable[[str, str], float] = lambda namespace, uid: 0.0
    processes: int = 1  # the live webhook processes the timekeeper listed: each fills its part of the guard's room


NO_FAIR_SHARE = FairShareAdmission()
MAX_ADMITTED = 100_000  # admissions remembered between two rankings: more than any cluster makes in that time


class AdmittedSinceCounted:
    """GPUs this webhook process admitted in a fair-share band that the timekeeper's count of what each namespace
    holds may not show yet (the burst guard counts them too). An admission made while one listing was in force
    happened before the next listing was stamped; once a namespace's GPUs were counted after that stamp, it is in
    the count and is forgotten here."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[str, float, float | None]] = {}  # uid -> namespace, GPUs, admitted before

    def add(self, uid: str, namespace: str, gpus: float) -> None:
        with self._lock:
            if len(self._entries) >= MAX_ADMITTED:
                self._entries.pop(next(iter(self._entries)))
            self._entries[uid] = (namespace, gpus, None)

    def admitted(self, namespace: str, excluding_uid: str) -> float:
        with self._lock:
            return sum(gpus for uid, (ns, gpus, _) in self._entries.items() if ns == namespace and uid != excluding_uid)

    def listed(self, states: BudgetStates) -> None:
        """A new listing in force: what was admitted before it is dropped once its namespace's count is later."""
        with self._lock:
            kept: dict[str, tuple[str, float, float | None]] = {}
            for uid, (namespace, gpus, before) in self._entries.items():
                before = states.listed_at if before is None else before
                band = states.of(namespace).fair_share
                if band is not None and band.held_as_of < before:
                    kept[uid] = (namespace, gpus, before)
            self._entries = kept


class BudgetStateCache:
    """The last known state of every namespace, and of those the timekeeper did not list; before the first answer
    every namespace is unknown (treated as in budget).

    Each poll names this process and the listing it holds in force, so that the timekeeper evicts a namespace's
    pods only once every webhook process admits its new pods as over budget (timekeeper.database.cluster.listings)."""

    def __init__(
        self,
        timekeeper_url: str | None,
        token_file: str | None = None,
        refresh_seconds: float = DEFAULT_BUDGET_REFRESH_SECONDS,
        on_refresh: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._http = JsonClient(timekeeper_url, timeout=5, connect_timeout=2) if timekeeper_url else None
        self._url = f"{timekeeper_url}{LISTING_PATH}"
        self._token_file = token_file
        self._refresh_seconds = refresh_seconds
        self._on_refresh = on_refresh  # called with True/False after each attempt (metrics)
        self._states = BudgetStates({})
        self._listed = False  # whether the timekeeper has ever answered
        self._outage = Outage(log, f"the timekeeper's budget listing {self._url}", "polls", clock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.name = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"[-253:]
        self.admitted = AdmittedSinceCounted()

    def state_of(self, namespace: str) -> BudgetState:
        return self._states.of(namespace).state

    def budget_of(self, namespace: str) -> NamespaceBudget:
        return self._states.of(namespace)

    def fair_share(self) -> FairShareAdmission:
        classes = self._states.band_classes
        return (
            FairShareAdmission(classes, self.admitted.admitted, self._states.webhook_processes)
            if classes
            else NO_FAIR_SHARE
        )

    def refresh(self, refresh_seconds: float | None = None) -> bool:
        """One poll, saying this process polls every `refresh_seconds` (default: its interval); on failure the last
        known states stay in force."""
        if self._http is None:
            return False
        try:
            every = self._refresh_seconds if refresh_seconds is None else refresh_seconds
            held = {"webhook": self.name, "inForce": repr(self._states.listed_at), "refreshSeconds": str(every)}
            answer = self._http.request("GET", LISTING_PATH, token=self._token(), query=held)
            if answer.status != 200:
                raise ValueError(f"HTTP {answer.status}" + (f": {answer.message}" if answer.message else ""))
            states = states_from_listing(answer.json())
        except (Unreachable, ValueError, OSError) as exc:
            meanwhile = ("GPU pods are admitted on the budget states it last listed" if self._listed else
                         "no budget state is known yet: every namespace is unknown, its GPU pods admitted as in budget")
            self._outage.failed(exc, meanwhile)
            self._report(False)
            return False
        self._states = states
        self.admitted.listed(states)
        self._listed = True
        self._outage.succeeded("budget states are current again")
        self._report(True)
        return True

    def start(self) -> None:
        if self._http is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="budget-state-refresh", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops polling, and says so with a last poll at the shortest interval the timekeeper takes: it then holds
        no crossing's evictions back for this process beyond a few seconds, rather than a few of its poll intervals."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            if self._listed:
                self.refresh(MIN_BUDGET_REFRESH_SECONDS)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:  # an unforeseen failure must not end the polling: the states would never change again
                log.exception("budget states not refreshed from %s, keeping the last known", self._url)
            self._stop.wait(self._refresh_seconds)

    def _token(self) -> str | None:
        return read_token(self._token_file)

    def _report(self, ok: bool) -> None:
        # A stopping worker's metrics files may already be gone: a poll that ends after stop() counts nothing.
        if self._on_refresh is not None and not self._stop.is_set():
            self._on_refresh(ok)


def read_token(path: str | None) -> str | None:
    """The bearer token the webhook presents to the timekeeper, read afresh: the kubelet rotates it."""
    if not path:
        return None
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip()
