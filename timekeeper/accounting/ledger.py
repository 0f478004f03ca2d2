"""Exactly-once accounting of meter reports against a pod's ledger. Plain data, no Flask, no SQL.

A meter reports the pod's cumulative billed GPU-seconds with a rising sequence number. The ledger keeps the
highest sequence number and cumulative seen; only the growth of the cumulative is charged. So a retried or
duplicated report (same or lower seq) charges nothing, a lost report's time is carried by the next one, and a
cumulative that goes down is never turned into a refund.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpusharing.compat import StrEnum
from gpusharing.report import MAX_GPU_SECONDS, MeterReport, ReportError
from gpusharing.units.weights import MICROS_PER_SECOND


class Outcome(StrEnum):
    CHARGED = "charged"  # the report was accepted; its growth (possibly zero) was charged
    DUPLICATE = "duplicate"  # seq not above the last accepted one: a retry or a report overtaken by a later one
    REGRESSED = "regressed"  # a later seq with a smaller cumulative: ignored, the ledger never goes back
    AFTER_FINAL = "after-final"  # the pod's final report was already accepted


@dataclass(frozen=True)
class PodLedger:
    last_seq: int
    micro_gpu_seconds: int  # cumulative billed, as accepted
    final: bool


@dataclass(frozen=True)
class Accounting:
    outcome: Outcome
    ledger: PodLedger  # the ledger after the report (unchanged unless charged)
    charge_micro_gpu_seconds: int  # what the namespace's usage grows by (0 unless charged)


def billed_micro_gpu_seconds(report: MeterReport, trusted_share: float | None) -> int:
    """The report's cumulative, in micro-GPU-seconds, re-billed at the trusted share when there is one.

    The meter computes `gpuSeconds` as its share times wall time; the timekeeper bills the share the webhook
    recorded on the pod, so a meter claiming a smaller share cannot lower its bill (nor a larger one raise it).
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


# A pod's ledger before its first report: any report is above its seq (seqs start at 0) and all of it is growth.
NEW_POD = PodLedger(last_seq=-1, micro_gpu_seconds=0, final=False)


def account(ledger: PodLedger, seq: int, cumulative_micro: int, final: bool) -> Accounting:
    """What one report does to a pod's ledger."""
    if ledger.final:
        return Accounting(Outcome.AFTER_FINAL, ledger, 0)
    if seq <= ledger.last_seq:
        return Accounting(Outcome.DUPLICATE, ledger, 0)
    if cumulative_micro < ledger.micro_gpu_seconds:
        return Accounting(Outcome.REGRESSED, ledger, 0)
    charge = cumulative_micro - ledger.micro_gpu_seconds
    return Accounting(Outcome.CHARGED, PodLedger(seq, cumulative_micro, final), charge)
