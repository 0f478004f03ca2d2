"""Exactly-once accounting of a pod's bill from its two sources, plain data: the API server's record, whose every
observation bills the time since the last (`observe`), and the meter's cumulative reports, evidence that may fill what
the record could not see but never lower, stop or end a bill (`report`). Only growth is charged: a retried report
charges nothing, a lost one's time is carried by the next. The one thing that goes back is time billed past the
record's end, which the end corrects when it arrives (docs/budgets.md, accounting).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

from gpusharing.compat import StrEnum
from gpusharing.report import MAX_GPU_SECONDS, MeterReport, ReportError
from gpusharing.units.weights import MICROS_PER_SECOND


class Outcome(StrEnum):
    """What became of one report or observation."""

    CHARGED = "charged"  # accepted; its growth (possibly zero) was charged
    DUPLICATE = "duplicate"  # seq not above the last accepted one: a retry or a report overtaken by a later one
    REGRESSED = "regressed"  # a later seq with a smaller cumulative: ignored, the ledger never goes back
    AFTER_FINAL = "after-final"  # the meter's final report was already accepted
    CLOSED = "closed"  # an observation of a pod whose bill the record already closed


@dataclass(frozen=True)
class PodLedger:
    """A pod's bill as the ledger keeps it, in micro-GPU-seconds: what each source said and what was charged."""

    last_seq: int = -1  # seqs start at 0: any report is above a new pod's
    metered: int = 0  # the meter's cumulative, micro-GPU-seconds at the trusted share
    observed: int = 0  # the API server's record, billed up to observed_until
    billed: int = 0  # charged so far: max(observed, metered as capped), never less
    final: bool = False  # the meter's final report came
    started_at: dt.datetime | None = None  # the record's start: caps what the meter may claim
    observed_until: dt.datetime | None = None
    ended_at: dt.datetime | None = None  # the record's end: the bill is closed
    # the share billed: the record's, else (off a cluster) what the pod's meter was trusted with
    share: float | None = None
    model: str | None = None  # the GPU model billed, fixed at the first charge: one model for the pod's life
    node: str | None = None  # the node it was bound to, fixed with its model

    @property
    def closed(self) -> bool:
        return self.ended_at is not None


NEW_POD = PodLedger()


@dataclass(frozen=True)
class Accounting:
    """What one report or observation did: its outcome, the ledger after it, and the charge."""

    outcome: Outcome
    ledger: PodLedger  # the ledger after the report or observation
    charge_micro_gpu_seconds: int  # what the namespace's usage grows by


@dataclass(frozen=True)
class Observation:
    """What the API server's record says of a pod now: its share and start, and whether and when it ended."""

    share: float
    started_at: dt.datetime
    until: dt.datetime  # now, or the pod's end
    ended: bool


def billed_micro_gpu_seconds(report: MeterReport, trusted_share: float | None) -> int:
    """The report's cumulative, in micro-GPU-seconds, re-billed at the trusted share when there is one.

    The meter computes `gpuSeconds` as its share times wall time; the timekeeper bills the share it recorded for the
    pod, so a meter claiming a smaller share cannot lower its bill (nor a larger one raise it).
    """
    if report.gpu_share == 0 and report.gpu_seconds > 0:
        raise ReportError("gpuShare is 0 but gpuSeconds is not: GPU-seconds are the share times the time")
    if trusted_share is None or trusted_share == report.gpu_share or report.gpu_seconds == 0:
        billed = report.gpu_seconds
    else:
        billed = report.gpu_seconds / report.gpu_share * trusted_share
        if billed > MAX_GPU_SECONDS:
            raise ReportError(
                f"gpuSeconds {report.gpu_seconds:g} at gpuShare {report.gpu_share:g} is {billed:g} GPU-seconds at the "
                f"pod's share {trusted_share:g}: more than {MAX_GPU_SECONDS:g}"
            )
    return round(billed * MICROS_PER_SECOND)


def share_time(share: float, start: dt.datetime, end: dt.datetime) -> int:
    """Micro-GPU-seconds of `share` held from start to end (nothing for an interval that does not go forward)."""
    return max(0, round(share * (end - start).total_seconds() * MICROS_PER_SECOND))


def meter_ceiling(ledger: PodLedger, share: float, now: dt.datetime) -> int | None:
    """The most a meter may claim: its share for the time since the record's start, to its end if it ended (None: the
    record's start is not known, as off a cluster, and the meter's word stands alone)."""
    if ledger.started_at is None:
        return None
    return share_time(share, ledger.started_at, ledger.ended_at or now)


def report(
    ledger: PodLedger, seq: int, cumulative_micro: int, final: bool, ceiling: int | None, share: float | None = None
) -> Accounting:
    """What one meter report does to a pod's ledger (`share`: the share it was trusted with, shown until the
    record's)."""
    if ledger.final:
        return Accounting(Outcome.AFTER_FINAL, ledger, 0)
    if seq <= ledger.last_seq:
        return Accounting(Outcome.DUPLICATE, ledger, 0)
    if cumulative_micro < ledger.metered:
        return Accounting(Outcome.REGRESSED, ledger, 0)
    evidence = cumulative_micro if ceiling is None else min(cumulative_micro, ceiling)
    after = replace(ledger, last_seq=seq, metered=cumulative_micro, final=final, share=ledger.share or share)
    return _charged(Outcome.CHARGED, ledger, after, evidence)


def observe(ledger: PodLedger, observation: Observation) -> Accounting:
    """What one observation of the API server's record does to a pod's ledger: the time since the last observed
    (since the start, the first time) is billed at the share (the largest it was observed at), and an ended pod's
    bill is closed at its end."""
    if ledger.closed:
        return Accounting(Outcome.CLOSED, ledger, 0)
    since = ledger.observed_until or observation.started_at
    share = max(observation.share, ledger.share or 0.0)  # a pod's share never goes down: no edit of it lowers a bill
    if observation.ended:
        return _ended(ledger, observation, share)
    until = max(since, observation.until)
    after = replace(
        ledger,
        observed=ledger.observed + share_time(share, since, until),
        observed_until=until,
        started_at=ledger.started_at or observation.started_at,
        share=share,
    )
    return _charged(Outcome.CHARGED, ledger, after, 0)


def _ended(ledger: PodLedger, observation: Observation, share: float) -> Accounting:
    """The pod's bill closed at its recorded end: the time since the last observation billed, or, when a pass had
    billed it past the end (a kubelet writes a container's end a moment after it stopped), that time taken back, and
    the meter capped at the end; the bill is the record's to the micro-GPU-second, and the charge of a correction
    negative."""
    started = ledger.started_at or observation.started_at
    end = max(observation.until, started)
    since = ledger.observed_until or started
    if end >= since:
        observed = ledger.observed + share_time(share, since, end)
    else:
        observed = max(0, ledger.observed - share_time(ledger.share or share, end, since))
    after = replace(ledger, observed=observed, observed_until=end, started_at=started, ended_at=end, share=share)
    billed = max(observed, min(ledger.metered, share_time(share, started, end)))
    return Accounting(Outcome.CHARGED, replace(after, billed=billed), billed - ledger.billed)


def close(ledger: PodLedger, at: dt.datetime) -> Accounting:
    """Closes the bill of a pod the record lost sight of (deleted while no watch looked): billed as last observed."""
    if ledger.closed:
        return Accounting(Outcome.CLOSED, ledger, 0)
    return Accounting(Outcome.CHARGED, replace(ledger, ended_at=ledger.observed_until or at), 0)


def _charged(outcome: Outcome, before: PodLedger, after: PodLedger, evidence: int) -> Accounting:
    billed = max(before.billed, after.observed, evidence)
    return Accounting(outcome, replace(after, billed=billed), billed - before.billed)
