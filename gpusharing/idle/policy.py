"""A budget's idle policy: what is done with GPU pods whose GPU nobody uses. Plain data, no Flask, no SQL.

A policy is set on a namespace's budget, on a group's (for the namespaces below it), or as the default budget's
settings (TIMEKEEPER_IDLE_*); the nearest one up a namespace's chain is in force. It says after how long a streak
of idle meter readings (utilisation under `utilisationPercent`) a pod is acted on, and how (`warn`, `demote`,
`evict`), `warnBefore` that a warning comes first, and `minAge` that younger pods are left alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpusharing.compat import StrEnum
from gpusharing.listing import IdleInForce, IdleRule
from gpusharing.units.duration import DurationError, format_duration, parse_duration

# A pod with this label set to "true" is never acted on for idleness (its streak is still kept and shown).
DEFAULT_UTILISATION_PERCENT = 1.0
MAX_DURATION_SECONDS = 365 * 24 * 3600.0
FIELDS = ("after", "action", "warnBefore", "utilisationPercent", "minAge")


class IdleAction(StrEnum):
    WARN = "warn"  # Events on the pod and its owner, a condition on the budget, a metric
    # evicted through the Eviction API (PDBs honoured) if in budget; its owner's next pods out of budget
    DEMOTE = "demote"
    EVICT = "evict"  # evicted whatever its class, bare pods too; its owner's next pods out of budget


class IdlePolicyError(ValueError):
    """An idle policy that cannot be one; the message says what to give."""


@dataclass(frozen=True)
class IdlePolicy:
    """What is done with a pod whose GPU has been idle for `after_seconds`, and when it is left alone."""

    after_seconds: float  # a streak this long is acted on
    action: IdleAction = IdleAction.WARN
    warn_before_seconds: float = 0.0  # a GPUIdleWarning this long before the action; 0: none
    utilisation_percent: float = DEFAULT_UTILISATION_PERCENT  # a reading under this is idle
    min_age_seconds: float = 0.0  # pods younger than this (since their recorded start) are never acted on

    def listed(self) -> IdleRule:
        """The policy as the budget listing carries it (gpusharing.listing): durations as Kubernetes writes them."""
        return IdleRule(format_duration(self.after_seconds), str(self.action),
                        format_duration(self.warn_before_seconds), self.utilisation_percent,
                        format_duration(self.min_age_seconds))

    def to_json(self) -> dict[str, Any]:
        """The policy's JSON, as the budgets table stores it: the listing's, so that both say it alike."""
        return self.listed().to_json()

    def describe(self) -> str:
        """In words: `evict after 4h idle (under 1 % utilisation), warned 30m before, pods older than 1h`."""
        warned = f", warned {format_duration(self.warn_before_seconds)} before" if self.warn_before_seconds else ""
        aged = f", pods older than {format_duration(self.min_age_seconds)}" if self.min_age_seconds else ""
        return (f"{self.action} after {format_duration(self.after_seconds)} idle (under {self.utilisation_percent:g} % "
                f"utilisation){warned}{aged}")


@dataclass(frozen=True)
class PolicyInForce:
    """The policy that applies to a namespace, and the budget it comes from ('' for the default budget's settings)."""

    policy: IdlePolicy
    source: str

    def listed(self) -> IdleInForce:
        """The policy in force as the budget listing carries it: its rule, and its source (None: the default's)."""
        rule = self.policy.listed()
        return IdleInForce(rule.after, rule.action, rule.warn_before, rule.utilisation_percent, rule.min_age,
                           self.source or None)


def idle_policy_from_json(
    raw: object, name: str = "idle", labels: Mapping[str, str] | None = None
) -> IdlePolicy | None:
    """A policy from its JSON (a budget's `idle`, a GPUBudget's `spec.idle`); None for null: no policy of its own.
    Refusals name each field `name.field`, or as `labels` call it (the settings' names)."""
    def label(key: str) -> str:
        return (labels or {}).get(key, f"{name}.{key}")

    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise IdlePolicyError(f"{name} must be an object with after (e.g. 4h) and optionally action, warnBefore, "
                              "utilisationPercent and minAge, or null for none")
    unknown = sorted(str(key) for key in set(raw) - set(FIELDS))
    if unknown:
        raise IdlePolicyError(f"{name} has unknown field(s): {', '.join(unknown)[:200]}")
    if "after" not in raw:
        raise IdlePolicyError(f"{label('after')} is missing: how long a GPU may stay idle, e.g. 4h")
    try:
        after = parse_duration(raw["after"], label("after"), low=1.0, high=MAX_DURATION_SECONDS)
        warn_before = parse_duration(raw.get("warnBefore", "0"), label("warnBefore"), high=MAX_DURATION_SECONDS)
        min_age = parse_duration(raw.get("minAge", "0"), label("minAge"), high=MAX_DURATION_SECONDS)
    except DurationError as exc:
        raise IdlePolicyError(str(exc)) from None
    if warn_before >= after:
        raise IdlePolicyError(
            f"{label('warnBefore')} ({format_duration(warn_before)}) must be shorter than {label('after')} "
            f"({format_duration(after)}): the warning comes before the action"
        )
    action = raw.get("action", IdleAction.WARN.value)
    if action not in tuple(IdleAction):
        raise IdlePolicyError(f"{label('action')} must be one of {', '.join(IdleAction)}, not {str(action)[:40]!r}")
    percent = raw.get("utilisationPercent", DEFAULT_UTILISATION_PERCENT)
    if isinstance(percent, bool) or not isinstance(percent, (int, float)) or not 0 < percent <= 100:  # NaN fails too
        raise IdlePolicyError(
            f"{label('utilisationPercent')} must be a number above 0 and at most 100, not {str(percent)[:40]}"
        )
    return IdlePolicy(after, IdleAction(action), warn_before, float(percent), min_age)


def stored(policy: IdlePolicy | None) -> str | None:
    """The policy as the budgets table keeps it (its JSON), None for none."""
    return None if policy is None else json.dumps(policy.to_json(), sort_keys=True)


def from_stored(text: str | None) -> IdlePolicy | None:
    """The policy the budgets table keeps as JSON text; None for none."""
    return None if not text else idle_policy_from_json(json.loads(text))


def in_force(chain: Sequence[tuple[str, IdlePolicy | None]], default: IdlePolicy | None) -> PolicyInForce | None:
    """The nearest policy up a chain of budgets (the namespace's own first, then its ancestors), else the default
    budget's; None when there is none."""
    for name, policy in chain:
        if policy is not None:
            return PolicyInForce(policy, name)
    return None if default is None else PolicyInForce(default, "")
