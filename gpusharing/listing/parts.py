"""The nested parts of a listed budget: warnings, commitments, idle rules and holds, fair-share standing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gpusharing.contract import Period
from gpusharing.listing.values import (
    MAX_LEVELS,
    MAX_NAME,
    MAX_REASON,
    JsonRecord,
    is_object,
    read_amount,
    read_enum,
    read_instant,
    read_items,
    read_name,
    read_number,
    read_text,
    read_whole,
)


@dataclass(frozen=True)
class BudgetWarning(JsonRecord):
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
        if not is_object(raw):
            return None
        budget, start = read_name(raw.get("budget")), read_instant(raw.get("periodStart"))
        period = read_enum(Period, raw.get("period"))
        percent, minutes = read_amount(raw.get("percentUsed")), read_amount(raw.get("gpuMinutes"))
        if budget is None or percent is None or minutes is None or period is None or start is None:
            return None
        return cls(budget, percent, minutes, period, start)


@dataclass(frozen=True)
class Uncommitted(JsonRecord):
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
        if not is_object(raw):
            return None
        minutes, micros = read_amount(raw.get("gpuMinutes")), read_whole(raw.get("microGpuSeconds"))
        budget = read_name(raw.get("budget"))
        committed, reserved = read_number(raw.get("committedGpuMinutes")), read_number(raw.get("reservedGpuMinutes"))
        remaining = raw.get("remainingGpuMinutes")
        if minutes is None or micros is None or budget is None or committed is None or reserved is None:
            return None
        if remaining is not None and read_amount(remaining) is None:
            return None
        return cls(minutes, micros, budget, read_amount(remaining), committed, reserved)


_IDLE_TEXTS = ("after", "action", "warnBefore", "minAge")


@dataclass(frozen=True)
class IdleRule(JsonRecord):
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
        if not is_object(raw):
            return None
        after, action, warn_before, min_age = (read_text(raw.get(key)) for key in _IDLE_TEXTS)
        percent = read_amount(raw.get("utilisationPercent"))
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
        if not is_object(raw):
            return None
        after, action, warn_before, min_age = (read_text(raw.get(key)) for key in _IDLE_TEXTS)
        percent = read_amount(raw.get("utilisationPercent"))
        if after is None or action is None or warn_before is None or min_age is None or percent is None:
            return None
        return cls(after, action, warn_before, percent, min_age, read_name(raw.get("from")))


@dataclass(frozen=True)
class IdleHold(JsonRecord):
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
        if not is_object(raw):
            return None
        values = [raw.get(key) for key in cls.FIELDS]
        if not all(isinstance(value, str) and len(value) <= MAX_NAME for value in values):
            return None
        kind, name, uid, pod, held_at = (str(value) for value in values)
        return cls(kind, name, uid, pod, held_at)


@dataclass(frozen=True)
class FairShareLevel(JsonRecord):
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
        if not is_object(raw):
            return None
        level, rank, siblings = (
            read_whole(raw.get("level")),
            read_whole(raw.get("rank")),
            read_whole(raw.get("siblings")),
        )
        share, usage, ratio = (
            read_number(raw.get("share")),
            read_number(raw.get("usage")),
            read_number(raw.get("ratio")),
        )
        node = read_name(raw.get("node"))
        if level is None or rank is None or siblings is None or share is None or usage is None or ratio is None:
            return None
        return None if node is None else cls(level, node, share, usage, ratio, rank, siblings)


@dataclass(frozen=True)
class FairShareStanding(JsonRecord):
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
        if not is_object(raw):
            return None
        band, burst = read_name(raw.get("band")), read_name(raw.get("burstClass"))
        share, held = read_amount(raw.get("shareGpus")), read_amount(raw.get("heldGpus"))
        if not band or not burst or share is None or held is None:
            return None
        reason, path = raw.get("reason"), raw.get("path")
        return cls(
            band,
            burst,
            share,
            held,
            read_number(raw.get("ratio")),
            read_whole(raw.get("rank")),
            reason[:MAX_REASON] if isinstance(reason, str) else None,
            read_text(raw.get("since")),
            read_number(raw.get("usageGpuSeconds")),
            read_text(raw.get("asOf")),
            read_number(raw.get("halfLifeSeconds")),
            read_number(raw.get("heldAsOf")),
            read_items(path, FairShareLevel.read, MAX_LEVELS) if isinstance(path, list) else None,
            read_text(raw.get("zeroUseChange")),
        )


