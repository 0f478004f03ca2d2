"""A listed budget, the default budget, fair share's settings and the whole listing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gpusharing.contract import AdmissionMode, BudgetState, Period, Shortfall
from gpusharing.listing.parts import BudgetWarning, FairShareStanding, IdleHold, IdleInForce, IdleRule, Uncommitted
from gpusharing.listing.values import (
    MAX_BAND_CLASSES,
    MAX_IDLE_HOLDS,
    MAX_ITEMS,
    MAX_LEVELS,
    MAX_NAME,
    MAX_THRESHOLDS,
    JsonRecord,
    ListingError,
    is_object,
    read_amount,
    read_enum,
    read_flag,
    read_items,
    read_name,
    read_number,
    read_text,
    read_whole,
)


@dataclass(frozen=True)
class ListedBudget(JsonRecord):
    """A budget's status, a namespace's or a group's, as the listing carries it and one budget's read answers it: its
    figures in the current period, its effective state, its terms, and (in every answer on a budget as it is now) what
    its pods committed, its owners held out of budget and its fair-share band."""

    namespace: str  # the namespace, or the group's name ('' when a budget read alone does not say)
    kind: str | None = None  # namespace or group
    gpu_minutes: float | None = None  # the budget per period; None: unlimited
    period: Period | None = None
    period_start: str | None = None
    period_end: str | None = None  # None for period none
    used_gpu_minutes: float | None = None
    remaining_gpu_minutes: float | None = None  # None: unlimited
    top_up_gpu_minutes: float | None = None
    percent_used: float | None = None  # None: unlimited
    evict_on_exhaustion: bool | None = None
    warning_thresholds: tuple[int, ...] = ()
    admission: AdmissionMode | None = None
    on_shortfall: Shortfall | None = None
    idle: IdleRule | None = None  # its own idle policy
    idle_in_force: IdleInForce | None = None
    parent: str | None = None
    ancestors: tuple[str, ...] = ()  # parent first
    managed_by: str | None = None
    own_state: BudgetState | None = None
    state: BudgetState = BudgetState.UNKNOWN  # the effective state: the worst of its own and its ancestors'
    limited_by: str | None = None
    warnings: tuple[BudgetWarning, ...] = ()
    committed_gpu_minutes: float | None = None  # None: the timekeeper cannot count its pods' commitments now
    uncommitted: Uncommitted | None = None
    idle_holds: tuple[IdleHold, ...] = ()
    fair_share: FairShareStanding | None = None  # None: fair share is off, or the namespace is not ranked

    FIELDS: ClassVar[Mapping[str, str]] = {
        "namespace": "namespace", "kind": "kind", "gpuMinutes": "gpu_minutes", "period": "period",
        "periodStart": "period_start", "periodEnd": "period_end", "usedGpuMinutes": "used_gpu_minutes",
        "remainingGpuMinutes": "remaining_gpu_minutes", "topUpGpuMinutes": "top_up_gpu_minutes",
        "percentUsed": "percent_used", "evictOnExhaustion": "evict_on_exhaustion",
        "warningThresholds": "warning_thresholds", "admission": "admission", "onShortfall": "on_shortfall",
        "idle": "idle", "idleInForce": "idle_in_force", "parent": "parent", "ancestors": "ancestors",
        "managedBy": "managed_by", "ownState": "own_state", "state": "state", "limitedBy": "limited_by",
        "warnings": "warnings", "committedGpuMinutes": "committed_gpu_minutes", "uncommitted": "uncommitted",
        "idleHolds": "idle_holds", "fairShare": "fair_share",
    }
    # What changes as pods start and end, not with the budget: the audit log's record of a budget leaves it out.
    CURRENT: ClassVar[frozenset[str]] = frozenset({"committedGpuMinutes", "uncommitted", "idleHolds", "fairShare"})

    def to_json(self, current: bool = True) -> dict[str, Any]:
        """The status as the API answers it (`fairShare` only for a ranked namespace); `current` False: the budget as
        the audit log records it, without its commitments, idle holds and band."""
        body = super().to_json()
        return {key: value for key, value in body.items()
                if (current or key not in self.CURRENT) and (key != "fairShare" or self.fair_share is not None)}

    @classmethod
    def from_json(cls, raw: object, where: str = "the budget's status") -> ListedBudget:
        """The status from its JSON; ListingError when it is not an object. Its fields read as far as they go (see the
        module's docstring): a state the reader does not know is unknown; safe admission's two settings are read
        together (either one unreadable leaves both unsaid)."""
        if not is_object(raw):
            raise ListingError(f"{where} must be a JSON object")
        admission, shortfall = (
            read_enum(AdmissionMode, raw.get("admission")),
            read_enum(Shortfall, raw.get("onShortfall")),
        )
        if ("admission" in raw and admission is None) or ("onShortfall" in raw and shortfall is None):
            admission = shortfall = None
        return cls(
            namespace=read_name(raw.get("namespace")) or "",
            kind=read_text(raw.get("kind")),
            gpu_minutes=read_amount(raw.get("gpuMinutes")),
            period=read_enum(Period, raw.get("period")),
            period_start=read_text(raw.get("periodStart")),
            period_end=read_text(raw.get("periodEnd")),
            used_gpu_minutes=read_amount(raw.get("usedGpuMinutes")),
            remaining_gpu_minutes=read_amount(raw.get("remainingGpuMinutes")),
            top_up_gpu_minutes=read_amount(raw.get("topUpGpuMinutes")),
            percent_used=read_amount(raw.get("percentUsed")),
            evict_on_exhaustion=read_flag(raw.get("evictOnExhaustion")),
            warning_thresholds=read_items(raw.get("warningThresholds"), read_whole, MAX_THRESHOLDS),
            admission=admission,
            on_shortfall=shortfall,
            idle=IdleRule.read(raw.get("idle")),
            idle_in_force=IdleInForce.read(raw.get("idleInForce")),
            parent=read_name(raw.get("parent")),
            ancestors=read_items(raw.get("ancestors"), read_name, MAX_LEVELS),
            managed_by=read_name(raw.get("managedBy"), 2 * MAX_NAME),  # "GPUBudget NAMESPACE/NAME"
            own_state=read_enum(BudgetState, raw.get("ownState")),
            state=read_enum(BudgetState, raw.get("state")) or BudgetState.UNKNOWN,
            limited_by=read_name(raw.get("limitedBy")),
            warnings=read_items(raw.get("warnings"), BudgetWarning.read, MAX_LEVELS),
            committed_gpu_minutes=read_number(raw.get("committedGpuMinutes")),
            uncommitted=Uncommitted.read(raw.get("uncommitted")),
            idle_holds=read_items(raw.get("idleHolds"), IdleHold.read, MAX_IDLE_HOLDS),
            fair_share=FairShareStanding.read(raw.get("fairShare")),
        )


@dataclass(frozen=True)
class DefaultBudget(JsonRecord):
    """The budget of every namespace the listing leaves out (no budget of its own, neither use nor top-ups in the
    current period), and the state of such a namespace: that of no use at all."""

    gpu_minutes: float | None  # None: unlimited (or, read, unsaid)
    period: Period | None
    state: BudgetState

    FIELDS: ClassVar[Mapping[str, str]] = {"gpuMinutes": "gpu_minutes", "period": "period", "state": "state"}

    @classmethod
    def read(cls, raw: object) -> DefaultBudget | None:
        """The default budget, or None when the listing does not say (an older timekeeper's does not)."""
        if not is_object(raw):
            return None
        state = read_enum(BudgetState, raw.get("state")) or BudgetState.UNKNOWN
        return cls(read_amount(raw.get("gpuMinutes")), read_enum(Period, raw.get("period")), state)


@dataclass(frozen=True)
class FairShareListing(JsonRecord):
    """What the listing says of fair share as a whole, when it is on: the bands' classes, lightest first, and the live
    webhook processes, among which the burst guard's room is shared."""

    classes: tuple[str, ...]
    webhook_processes: int | None  # None: unsaid (read as one)

    FIELDS: ClassVar[Mapping[str, str]] = {"classes": "classes", "webhookProcesses": "webhook_processes"}

    @classmethod
    def read(cls, raw: object) -> FairShareListing | None:
        """Fair share's part, or None (off) when not an object; classes beyond MAX_BAND_CLASSES, and any that is not a
        name, are left out."""
        if not is_object(raw):
            return None
        return cls(read_items(raw.get("classes"), read_name, MAX_BAND_CLASSES), read_whole(raw.get("webhookProcesses")))


@dataclass(frozen=True)
class BudgetListing(JsonRecord):
    """The timekeeper's listing (`GET /api/v1/budgets`): every budget's status, the default budget, the database's time
    it was read at, and, with fair share on, the bands' classes."""

    items: tuple[ListedBudget, ...]
    default: DefaultBudget | None = None  # None: unsaid (an older timekeeper's listing does not tell its default)
    listed_at: float | None = None  # seconds since the epoch, the database's time; the webhook says it back
    fair_share: FairShareListing | None = None  # None: fair share is off

    FIELDS: ClassVar[Mapping[str, str]] = {
        "items": "items", "default": "default", "listedAt": "listed_at", "fairShare": "fair_share",
    }

    def to_json(self) -> dict[str, Any]:
        """The listing as the API answers it (`fairShare` only with fair share on)."""
        body = super().to_json()
        if self.fair_share is None:
            del body["fairShare"]
        return body

    @classmethod
    def from_json(cls, body: object) -> BudgetListing:
        """The listing from the timekeeper's answer; ListingError naming the first thing that makes it no listing."""
        if not is_object(body):
            raise ListingError("the budget listing must be a JSON object")
        items = body.get("items")
        if not isinstance(items, list):
            raise ListingError("the budget listing must have a list of items")
        if len(items) > MAX_ITEMS:
            raise ListingError(f"the budget listing has {len(items)} items, more than the {MAX_ITEMS} any cluster has")
        listed = []
        for index, item in enumerate(items):
            budget = ListedBudget.from_json(item, f"items[{index}]")
            if not budget.namespace:
                raise ListingError(f"items[{index}] must name its budget: a namespace of 1 to {MAX_NAME} characters")
            listed.append(budget)
        return cls(tuple(listed), DefaultBudget.read(body.get("default")), read_number(body.get("listedAt")),
                   FairShareListing.read(body.get("fairShare")))


def listing_of(body: object, namespace: str) -> dict[str, Any]:
    """The timekeeper's answer as it came, with only that budget's status among its items: what `-o json` prints of
    `budget ls -n`, kept as answered. ListingError when the answer is no listing (BudgetListing.from_json)."""
    BudgetListing.from_json(body)
    assert isinstance(body, Mapping)  # the listing's reader refuses anything else
    return {**body, "items": [item for item in body["items"] if item.get("namespace") == namespace]}


