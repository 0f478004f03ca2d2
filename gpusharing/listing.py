"""The budget listing contract between the timekeeper and its readers (`GET /api/v1/budgets`, and one budget's status,
`GET /api/v1/budgets/{name}`), as report.py is the meter's: the timekeeper builds these objects and turns them to
JSON once, where its API answers; the webhook and the admin command line read its answers back through them.

A reader reads as far as an answer goes. A body that is no listing (not an object, no list of items, more items than
any cluster has, an item that is not an object naming its budget) is refused with ListingError, which says what is
wrong. Within a listing, a field missing or unreadable reads as unsaid (None, or empty), and a nested object the
reader cannot use as a whole (a warning, an idle hold, a fair-share band) reads as absent: a timekeeper of another
version, or one budget's odd field, costs a reader that field and no more, and the webhook admits by the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, TypeGuard, TypeVar

from gpusharing.compat import from_iso
from gpusharing.contract import AdmissionMode, BudgetState, Period, Shortfall

MAX_ITEMS = 100_000  # budgets in one listing: more namespaces and groups than any cluster has
MAX_NAME = 253  # a Kubernetes name's most; budgets' names are at most 63
MAX_TEXT = 64  # an instant, a duration, a kind: a few dozen characters
MAX_REASON = 1024  # a band's one-line reason, cut there
MAX_LEVELS = 16  # a budget's ancestors, warnings or path levels: the hierarchy allows 4 levels above a namespace
MAX_THRESHOLDS = 16  # warning thresholds: at most 5 are set
MAX_IDLE_HOLDS = 100_000  # owners held in one namespace: more than any namespace has
MAX_BAND_CLASSES = 8  # fair share's bands

E = TypeVar("E", bound=Enum)
T = TypeVar("T")


class ListingError(ValueError):
    """An answer that is no budget listing (or no budget's status); the message says what is wrong with it."""


class _Json:
    """A contract object whose JSON is its FIELDS (JSON key: attribute), in the order the timekeeper writes them."""

    FIELDS: ClassVar[Mapping[str, str]]

    def to_json(self) -> dict[str, Any]:
        """The object as the API answers it: one key per field, nested objects and enums as their JSON."""
        return {key: _plain(getattr(self, attr)) for key, attr in self.FIELDS.items()}


@dataclass(frozen=True)
class BudgetWarning(_Json):
    """A budget (the namespace's own or an ancestor's) at or above a warning threshold: what the webhook words for
    every GPU pod it admits (gpusharing.thresholds.usage_warning)."""

    budget: str
    percent_used: float
    gpu_minutes: float  # the budget plus this period's top-ups
    period: Period
    period_start: str  # RFC 3339

    FIELDS: ClassVar[Mapping[str, str]] = {
        "budget": "budget", "percentUsed": "percent_used", "gpuMinutes": "gpu_minutes", "period": "period",
        "periodStart": "period_start",
    }

    @classmethod
    def read(cls, raw: object) -> BudgetWarning | None:
        """The warning, or None when any of it is unreadable: a warning is worded whole or not at all."""
        if not _is_object(raw):
            return None
        budget, start = _name(raw.get("budget")), _instant(raw.get("periodStart"))
        period = _enum(Period, raw.get("period"))
        percent, minutes = _amount(raw.get("percentUsed")), _amount(raw.get("gpuMinutes"))
        if budget is None or percent is None or minutes is None or period is None or start is None:
            return None
        return cls(budget, percent, minutes, period, start)


@dataclass(frozen=True)
class Uncommitted(_Json):
    """What is left uncommitted of the tightest budget on a namespace's path: its remaining GPU-minutes less what the
    pods below it committed and the admissions below it reserved."""

    gpu_minutes: float
    micro_gpu_seconds: int  # the same, exact: what reservations are weighed against
    budget: str  # the budget that leaves the least
    remaining_gpu_minutes: float | None
    committed_gpu_minutes: float
    reserved_gpu_minutes: float

    FIELDS: ClassVar[Mapping[str, str]] = {
        "microGpuSeconds": "micro_gpu_seconds", "gpuMinutes": "gpu_minutes", "budget": "budget",
        "remainingGpuMinutes": "remaining_gpu_minutes", "committedGpuMinutes": "committed_gpu_minutes",
        "reservedGpuMinutes": "reserved_gpu_minutes",
    }

    @classmethod
    def read(cls, raw: object) -> Uncommitted | None:
        """The figures, or None when any of them is unreadable."""
        if not _is_object(raw):
            return None
        minutes, micros = _amount(raw.get("gpuMinutes")), _whole(raw.get("microGpuSeconds"))
        budget = _name(raw.get("budget"))
        committed, reserved = _number(raw.get("committedGpuMinutes")), _number(raw.get("reservedGpuMinutes"))
        remaining = raw.get("remainingGpuMinutes")
        if minutes is None or micros is None or budget is None or committed is None or reserved is None:
            return None
        if remaining is not None and _amount(remaining) is None:
            return None
        return cls(minutes, micros, budget, _amount(remaining), committed, reserved)


_IDLE_TEXTS = ("after", "action", "warnBefore", "minAge")


@dataclass(frozen=True)
class IdleRule(_Json):
    """A budget's idle policy as the API writes it (durations as Kubernetes writes them, e.g. 4h)."""

    after: str
    action: str  # warn, demote or evict
    warn_before: str
    utilisation_percent: float
    min_age: str

    FIELDS: ClassVar[Mapping[str, str]] = {
        "after": "after", "action": "action", "warnBefore": "warn_before", "utilisationPercent": "utilisation_percent",
        "minAge": "min_age",
    }

    @classmethod
    def read(cls, raw: object) -> IdleRule | None:
        """The rule, or None when any of it is unreadable."""
        if not _is_object(raw):
            return None
        after, action, warn_before, min_age = (_text(raw.get(key)) for key in _IDLE_TEXTS)
        percent = _amount(raw.get("utilisationPercent"))
        if after is None or action is None or warn_before is None or min_age is None or percent is None:
            return None
        return cls(after, action, warn_before, percent, min_age)


@dataclass(frozen=True)
class IdleInForce(IdleRule):
    """The idle policy that applies to a budget: its own, the nearest ancestor's, or the default budget's settings."""

    source: str | None = None  # the budget it comes from; None: the default budget's settings (TIMEKEEPER_IDLE_*)

    FIELDS: ClassVar[Mapping[str, str]] = {**IdleRule.FIELDS, "from": "source"}

    def rule(self) -> IdleRule:
        """The policy alone, without where it comes from."""
        return IdleRule(self.after, self.action, self.warn_before, self.utilisation_percent, self.min_age)

    @classmethod
    def read(cls, raw: object) -> IdleInForce | None:
        """The policy in force, or None when its rule is unreadable (an unreadable source reads as the default's)."""
        if not _is_object(raw):
            return None
        after, action, warn_before, min_age = (_text(raw.get(key)) for key in _IDLE_TEXTS)
        percent = _amount(raw.get("utilisationPercent"))
        if after is None or action is None or warn_before is None or min_age is None or percent is None:
            return None
        return cls(after, action, warn_before, percent, min_age, _name(raw.get("from")))


@dataclass(frozen=True)
class IdleHold(_Json):
    """An owner held out of budget: an idle pod of its was evicted, and its next pods are admitted out of budget until
    one uses its GPU."""

    kind: str
    name: str
    uid: str
    pod: str  # the pod evicted
    held_at: str  # RFC 3339

    FIELDS: ClassVar[Mapping[str, str]] = {
        "kind": "kind", "name": "name", "uid": "uid", "pod": "pod", "heldAt": "held_at",
    }

    @classmethod
    def read(cls, raw: object) -> IdleHold | None:
        """The hold, or None when any of it is not a string (of at most MAX_NAME characters)."""
        if not _is_object(raw):
            return None
        values = [raw.get(key) for key in cls.FIELDS]
        if not all(isinstance(value, str) and len(value) <= MAX_NAME for value in values):
            return None
        kind, name, uid, pod, held_at = (str(value) for value in values)
        return cls(kind, name, uid, pod, held_at)


@dataclass(frozen=True)
class FairShareLevel(_Json):
    """A namespace's standing at one level of its path down the budget tree (Slurm's `sshare -l`)."""

    level: int
    node: str
    share: float
    usage: float
    ratio: float
    rank: int
    siblings: int

    FIELDS: ClassVar[Mapping[str, str]] = {
        "level": "level", "node": "node", "share": "share", "usage": "usage", "ratio": "ratio", "rank": "rank",
        "siblings": "siblings",
    }

    @classmethod
    def read(cls, raw: object) -> FairShareLevel | None:
        """The level, or None when any of it is unreadable."""
        if not _is_object(raw):
            return None
        level, rank, siblings = _whole(raw.get("level")), _whole(raw.get("rank")), _whole(raw.get("siblings"))
        share, usage, ratio = _number(raw.get("share")), _number(raw.get("usage")), _number(raw.get("ratio"))
        node = _name(raw.get("node"))
        if level is None or rank is None or siblings is None or share is None or usage is None or ratio is None:
            return None
        return None if node is None else cls(level, node, share, usage, ratio, rank, siblings)


@dataclass(frozen=True)
class FairShareStanding(_Json):
    """A ranked namespace's fair-share band (docs/fair-share.md): the class its GPU pods are admitted in, the class
    beyond its fair share of the cluster's GPUs (the burst guard), and where it stood when the controller ranked it.
    `path` and `zero_use_change` only a budget read alone carries (`path` None: neither is said)."""

    band: str
    burst_class: str
    share_gpus: float  # its fair share of the cluster's GPUs
    held_gpus: float  # GPUs its pods held when ranked
    ratio: float | None = None  # decayed usage over share at the level that decides
    rank: int | None = None  # among every namespace ranked, lightest 1
    reason: str | None = None
    since: str | None = None  # in this band since (RFC 3339)
    usage_gpu_seconds: float | None = None  # model-weighted GPU-seconds decayed to as_of
    as_of: str | None = None
    half_life_seconds: float | None = None
    held_as_of: float | None = None  # when held_gpus was counted (the database's time, seconds since the epoch)
    path: tuple[FairShareLevel, ...] | None = None  # level 1 first
    zero_use_change: str | None = None  # when its band would rise at zero use; None: never

    FIELDS: ClassVar[Mapping[str, str]] = {
        "band": "band", "burstClass": "burst_class", "shareGpus": "share_gpus", "heldGpus": "held_gpus",
        "ratio": "ratio", "rank": "rank", "reason": "reason", "since": "since",
        "usageGpuSeconds": "usage_gpu_seconds", "asOf": "as_of", "halfLifeSeconds": "half_life_seconds",
        "heldAsOf": "held_as_of", "path": "path", "zeroUseChange": "zero_use_change",
    }
    DETAIL: ClassVar[frozenset[str]] = frozenset({"path", "zeroUseChange"})

    def to_json(self) -> dict[str, Any]:
        """The band as the API answers it: with its path and zeroUseChange only in a budget read alone."""
        body = super().to_json()
        return body if self.path is not None else {key: value for key, value in body.items() if key not in self.DETAIL}

    @classmethod
    def read(cls, raw: object) -> FairShareStanding | None:
        """The band, or None (unranked) without its classes and figures (non-empty class names, finite GPUs not below
        0): what the webhook admits by. The rest reads as unsaid where unreadable; the reason is cut at MAX_REASON."""
        if not _is_object(raw):
            return None
        band, burst = _name(raw.get("band")), _name(raw.get("burstClass"))
        share, held = _amount(raw.get("shareGpus")), _amount(raw.get("heldGpus"))
        if not band or not burst or share is None or held is None:
            return None
        reason, path = raw.get("reason"), raw.get("path")
        return cls(
            band, burst, share, held, _number(raw.get("ratio")), _whole(raw.get("rank")),
            reason[:MAX_REASON] if isinstance(reason, str) else None, _text(raw.get("since")),
            _number(raw.get("usageGpuSeconds")), _text(raw.get("asOf")), _number(raw.get("halfLifeSeconds")),
            _number(raw.get("heldAsOf")),
            _items(path, FairShareLevel.read, MAX_LEVELS) if isinstance(path, list) else None,
            _text(raw.get("zeroUseChange")),
        )


@dataclass(frozen=True)
class ListedBudget(_Json):
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
        if not _is_object(raw):
            raise ListingError(f"{where} must be a JSON object")
        admission, shortfall = _enum(AdmissionMode, raw.get("admission")), _enum(Shortfall, raw.get("onShortfall"))
        if ("admission" in raw and admission is None) or ("onShortfall" in raw and shortfall is None):
            admission = shortfall = None
        return cls(
            namespace=_name(raw.get("namespace")) or "",
            kind=_text(raw.get("kind")),
            gpu_minutes=_amount(raw.get("gpuMinutes")),
            period=_enum(Period, raw.get("period")),
            period_start=_text(raw.get("periodStart")),
            period_end=_text(raw.get("periodEnd")),
            used_gpu_minutes=_amount(raw.get("usedGpuMinutes")),
            remaining_gpu_minutes=_amount(raw.get("remainingGpuMinutes")),
            top_up_gpu_minutes=_amount(raw.get("topUpGpuMinutes")),
            percent_used=_amount(raw.get("percentUsed")),
            evict_on_exhaustion=_flag(raw.get("evictOnExhaustion")),
            warning_thresholds=_items(raw.get("warningThresholds"), _whole, MAX_THRESHOLDS),
            admission=admission,
            on_shortfall=shortfall,
            idle=IdleRule.read(raw.get("idle")),
            idle_in_force=IdleInForce.read(raw.get("idleInForce")),
            parent=_name(raw.get("parent")),
            ancestors=_items(raw.get("ancestors"), _name, MAX_LEVELS),
            managed_by=_name(raw.get("managedBy"), 2 * MAX_NAME),  # "GPUBudget NAMESPACE/NAME"
            own_state=_enum(BudgetState, raw.get("ownState")),
            state=_enum(BudgetState, raw.get("state")) or BudgetState.UNKNOWN,
            limited_by=_name(raw.get("limitedBy")),
            warnings=_items(raw.get("warnings"), BudgetWarning.read, MAX_LEVELS),
            committed_gpu_minutes=_number(raw.get("committedGpuMinutes")),
            uncommitted=Uncommitted.read(raw.get("uncommitted")),
            idle_holds=_items(raw.get("idleHolds"), IdleHold.read, MAX_IDLE_HOLDS),
            fair_share=FairShareStanding.read(raw.get("fairShare")),
        )


@dataclass(frozen=True)
class DefaultBudget(_Json):
    """The budget of every namespace the listing leaves out (no budget of its own, neither use nor top-ups in the
    current period), and the state of such a namespace: that of no use at all."""

    gpu_minutes: float | None  # None: unlimited (or, read, unsaid)
    period: Period | None
    state: BudgetState

    FIELDS: ClassVar[Mapping[str, str]] = {"gpuMinutes": "gpu_minutes", "period": "period", "state": "state"}

    @classmethod
    def read(cls, raw: object) -> DefaultBudget | None:
        """The default budget, or None when the listing does not say (a timekeeper from before it did)."""
        if not _is_object(raw):
            return None
        state = _enum(BudgetState, raw.get("state")) or BudgetState.UNKNOWN
        return cls(_amount(raw.get("gpuMinutes")), _enum(Period, raw.get("period")), state)


@dataclass(frozen=True)
class FairShareListing(_Json):
    """What the listing says of fair share as a whole, when it is on: the bands' classes, lightest first, and the live
    webhook processes, among which the burst guard's room is shared."""

    classes: tuple[str, ...]
    webhook_processes: int | None  # None: unsaid (read as one)

    FIELDS: ClassVar[Mapping[str, str]] = {"classes": "classes", "webhookProcesses": "webhook_processes"}

    @classmethod
    def read(cls, raw: object) -> FairShareListing | None:
        """Fair share's part, or None (off) when not an object; classes beyond MAX_BAND_CLASSES, and any that is not a
        name, are left out."""
        if not _is_object(raw):
            return None
        return cls(_items(raw.get("classes"), _name, MAX_BAND_CLASSES), _whole(raw.get("webhookProcesses")))


@dataclass(frozen=True)
class BudgetListing(_Json):
    """The timekeeper's listing (`GET /api/v1/budgets`): every budget's status, the default budget, the database's time
    it was read at, and, with fair share on, the bands' classes."""

    items: tuple[ListedBudget, ...]
    default: DefaultBudget | None = None  # None: a timekeeper from before the listing told its default
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
        if not _is_object(body):
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
        return cls(tuple(listed), DefaultBudget.read(body.get("default")), _number(body.get("listedAt")),
                   FairShareListing.read(body.get("fairShare")))


def listing_of(body: object, namespace: str) -> dict[str, Any]:
    """The timekeeper's answer as it came, with only that budget's status among its items: what `-o json` prints of
    `budget ls -n`, kept as answered. ListingError when the answer is no listing (BudgetListing.from_json)."""
    BudgetListing.from_json(body)
    assert isinstance(body, Mapping)  # the listing's reader refuses anything else
    return {**body, "items": [item for item in body["items"] if item.get("namespace") == namespace]}


def _plain(value: object) -> Any:
    """A field's value as JSON: a contract object as its JSON, a tuple as a list, an enum as its value."""
    if isinstance(value, _Json):
        return value.to_json()
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if isinstance(value, Enum):
        return str(value)
    return value


# The readers below check exact types first: the webhook reads every listing every few seconds, in each process, and
# json's decoded values are exactly dict, list, str, int, float or bool.


def _is_object(raw: object) -> TypeGuard[Mapping[str, Any]]:
    """Whether it is a JSON object (a dict, or another mapping a caller built)."""
    return type(raw) is dict or isinstance(raw, Mapping)


def _items(raw: object, read: Callable[[object], T | None], most: int) -> tuple[T, ...]:
    """The first `most` entries of a list that `read` can read; none of anything else."""
    if type(raw) is not list or not raw:
        return ()
    entries = [read(entry) for entry in raw[:most]]
    return tuple(entry for entry in entries if entry is not None)


def _number(raw: object) -> float | None:
    """A finite JSON number as it came (an int stays one, so that it is written back alike); None otherwise."""
    if type(raw) is float:
        return raw if -math.inf < raw < math.inf else None  # NaN compares false
    return raw if type(raw) is int else None


def _amount(raw: object) -> float | None:
    """A finite number not below 0; None otherwise."""
    if type(raw) is float:
        return raw if 0 <= raw < math.inf else None
    return raw if type(raw) is int and raw >= 0 else None


def _whole(raw: object) -> int | None:
    """A JSON whole number (not a boolean); None otherwise."""
    return raw if type(raw) is int else None


def _flag(raw: object) -> bool | None:
    """true or false; None otherwise."""
    return raw if type(raw) is bool else None


def _name(raw: object, most: int = MAX_NAME) -> str | None:
    """A non-empty string of at most `most` characters; None otherwise."""
    return raw if type(raw) is str and 0 < len(raw) <= most else None


def _text(raw: object) -> str | None:
    """A string of at most MAX_TEXT characters; None otherwise."""
    return raw if type(raw) is str and len(raw) <= MAX_TEXT else None


def _instant(raw: object) -> str | None:
    """An RFC 3339 instant, as it came; None when it is none."""
    text = _text(raw)
    if text is None:
        return None
    try:
        from_iso(text)
    except ValueError:
        return None
    return text


def _enum(kind: type[E], raw: object) -> E | None:
    """The member of that value; None for any other."""
    if type(raw) is not str:
        return None
    try:
        return kind(raw)
    except ValueError:
        return None
