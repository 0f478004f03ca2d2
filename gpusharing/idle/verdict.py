"""Idle GPUs, pod by pod: each pod's idle streak from its readings, and what the idle policy in force says of it now.
Plain functions over plain data; no Flask, no SQL, no Kubernetes client.

A streak lasts while every reading is under the policy's threshold, with no gap longer than two meter intervals; a
busy reading or one without utilisation ends it (what cannot be seen is never idle). It is as long as the readings
prove it, never to now, so a meter that falls silent stops it growing (docs/budgets.md, the streak).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gpusharing.compat import StrEnum
from gpusharing.idle.policy import IdleAction, PolicyInForce
from gpusharing.units.duration import format_duration
from gpusharing.utilisation import UtilisationSource


@dataclass(frozen=True)
class Streak:
    """A pod's idle streak as its ledger keeps it."""

    since: dt.datetime | None = None  # the first idle report of the streak; None: not idle
    warned_at: dt.datetime | None = None  # GPUIdleWarning sent for this streak
    acted_at: dt.datetime | None = None  # the policy's action taken for this streak


NO_STREAK = Streak()


def next_streak(
    streak: Streak, last_report_at: dt.datetime | None, utilisation: float | None, threshold_percent: float,
    now: dt.datetime, max_gap_seconds: float,
) -> Streak:
    """The streak after one accepted report received `now` that read `utilisation` (None: no NVML data)."""
    if utilisation is None or utilisation >= threshold_percent:
        return NO_STREAK
    consecutive = last_report_at is not None and (now - last_report_at).total_seconds() <= max_gap_seconds
    if streak.since is None or not consecutive:
        return Streak(since=now)
    return streak


class IdleState(StrEnum):
    IDLE = "idle"
    BUSY = "busy"
    UNKNOWN = "unknown"  # no reading, no recent reading, or no NVML data: never treated as idle


@dataclass(frozen=True)
class PodFacts:
    """What the API server's record says of the pod that the policy looks at."""

    started_at: dt.datetime | None
    exempt: bool = False  # gpusharing.io/idle-exempt: "true"


@dataclass(frozen=True)
class Reading:
    """A pod's latest word on its GPU's utilisation: what it read (None: no data), when it came (None: never), whose
    word it is, and until when it is fresh (None: `fresh_seconds` after it came, as a meter's)."""

    utilisation: float | None
    reported_at: dt.datetime | None
    source: UtilisationSource = UtilisationSource.METER
    fresh_until: dt.datetime | None = None

    def fresh(self, now: dt.datetime, fresh_seconds: float) -> bool:
        if self.reported_at is None:
            return False
        if self.fresh_until is not None:
            return now <= self.fresh_until
        return (now - self.reported_at).total_seconds() <= fresh_seconds

    def outranks(self, source: UtilisationSource, now: dt.datetime) -> bool:
        """Whether this reading stands against one from `source` received `now`: it is fresh and its source outranks
        (a meter's reading counts only where no node agent or Prometheus has a fresh one)."""
        return self.fresh_until is not None and now <= self.fresh_until and self.source.outranks(source)

    def next_streak(
        self,
        streak: Streak,
        source: UtilisationSource,
        utilisation: float | None,
        threshold_percent: float,
        now: dt.datetime,
        max_gap_seconds: float,
    ) -> Streak:
        """The streak after a reading from `source` that takes this one's place: a streak goes on only from readings
        of one source, so that where the node's word replaces the meter's, idle policies act on the node's alone."""
        last = self.reported_at if self.source is source else None
        return next_streak(streak, last, utilisation, threshold_percent, now, max_gap_seconds)


NO_READING = Reading(None, None)
_WHOSE = {UtilisationSource.METER: "its meter", UtilisationSource.NODE: "the node agent",
          UtilisationSource.PROMETHEUS: "Prometheus (DCGM)"}
_LAST = {UtilisationSource.METER: "its last report", UtilisationSource.NODE: "the node agent's last reading",
         UtilisationSource.PROMETHEUS: "the last reading from Prometheus (DCGM)"}
_EVERY = {UtilisationSource.METER: "every report", UtilisationSource.NODE: "every reading of the node agent",
          UtilisationSource.PROMETHEUS: "every reading from Prometheus (DCGM)"}


@dataclass(frozen=True)
class IdleVerdict:
    """What the policy in force says of a pod now, and when it warns of it and acts on it."""

    state: IdleState
    idle_seconds: float  # the streak, as long as the reports prove it
    policy: PolicyInForce | None
    warn_at: dt.datetime | None  # when the warning is due; None: none (no policy, none asked, exempt, not idle)
    act_at: dt.datetime | None  # when the policy's action is due; None: never, as things stand
    why: str  # the state in words
    streak_end: dt.datetime | None = None  # the streak's last idle report: how far the reports prove it
    source: UtilisationSource = UtilisationSource.METER  # whose readings the streak stands on

    @property
    def warning_due(self) -> bool:
        return self.warn_at is not None and self.act_at is not None and self._proven(self.warn_at)

    @property
    def action_due(self) -> bool:
        return self.act_at is not None and self._proven(self.act_at)

    def _proven(self, at: dt.datetime) -> bool:
        """Whether the streak, as the reports prove it, reaches `at`."""
        return self.state is IdleState.IDLE and self.streak_end is not None and self.streak_end >= at


def verdict(
    streak: Streak,
    reading: Reading,
    policy: PolicyInForce | None,
    pod: PodFacts,
    now: dt.datetime,
    fresh_seconds: float,
) -> IdleVerdict:
    """What the policy in force says of a pod now. A reading older than `fresh_seconds` (a silent meter) is unknown."""
    threshold = policy.policy.utilisation_percent if policy is not None else None
    whose = _WHOSE[reading.source]
    if reading.reported_at is None:
        return IdleVerdict(IdleState.UNKNOWN, 0.0, policy, None, None,
                           "unknown: its meter has not reported yet; never treated as idle")
    if not reading.fresh(now, fresh_seconds):
        return IdleVerdict(IdleState.UNKNOWN, 0.0, policy, None, None,
                           f"unknown: {whose} has not reported since {_iso(reading.reported_at)} (silent); never "
                           "treated as idle")
    if reading.utilisation is None:
        blind = (
            "no NVML data: no driver, an older driver, or the pod's GPU processes out of its sight"
            if reading.source is UtilisationSource.METER
            else "no device of the pod found, or a MIG instance it cannot read"
        )
        return IdleVerdict(IdleState.UNKNOWN, 0.0, policy, None, None,
                           f"unknown: {whose} reads no GPU utilisation ({blind}); never treated as idle")
    if streak.since is None or (threshold is not None and reading.utilisation >= threshold):
        under = f" (idle is under {threshold:g} %)" if threshold is not None else ""
        return IdleVerdict(IdleState.BUSY, 0.0, policy, None, None,
                           f"busy: {_LAST[reading.source]} read {reading.utilisation:g} % GPU utilisation{under}")
    idle_seconds = max(0.0, (reading.reported_at - streak.since).total_seconds())
    below = f"under {threshold:g} %" if threshold is not None else "idle"
    why = (
        f"idle for {format_duration(round(idle_seconds))}: {_EVERY[reading.source]} since {_iso(streak.since)} "
        f"read GPU utilisation {below}"
    )
    if policy is None or pod.exempt:
        if pod.exempt:
            why += "; exempt (gpusharing.io/idle-exempt: \"true\"): never acted on"
        return IdleVerdict(IdleState.IDLE, idle_seconds, policy, None, None, why, reading.reported_at, reading.source)
    rule = policy.policy
    act_at = streak.since + dt.timedelta(seconds=rule.after_seconds)
    if pod.started_at is not None and rule.min_age_seconds:
        act_at = max(act_at, pod.started_at + dt.timedelta(seconds=rule.min_age_seconds))
    warn_at = act_at - dt.timedelta(seconds=rule.warn_before_seconds) if rule.warn_before_seconds else None
    return IdleVerdict(IdleState.IDLE, idle_seconds, policy, warn_at, act_at, why, reading.reported_at, reading.source)


def outlook(verdict: IdleVerdict, streak: Streak) -> str | None:
    """When the pod is (or was) warned and acted on, in words; None when the policy does nothing to it."""
    if verdict.act_at is None or verdict.policy is None:
        return None
    action = verdict.policy.policy.action
    done = {IdleAction.WARN: "GPUIdle Event", IdleAction.DEMOTE: "demoted", IdleAction.EVICT: "evicted"}[action]
    parts = []
    if verdict.warn_at is not None:
        parts.append(f"warned at {_iso(streak.warned_at)}" if streak.warned_at else
                     f"to be warned (GPUIdleWarning) once idle to {_iso(verdict.warn_at)}")
    parts.append(f"acted on ({done}) at {_iso(streak.acted_at)}" if streak.acted_at else
                 f"to be acted on ({action}) once idle to {_iso(verdict.act_at)}")
    return "; ".join(parts)


def _iso(at: dt.datetime | None) -> str:
    return "-" if at is None else at.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
