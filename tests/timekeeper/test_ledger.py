"""Exactly-once accounting of one pod's reports, without HTTP or a database."""

from __future__ import annotations

import random

import pytest

from gpusharing.report import MeterReport, ReportError
from timekeeper.accounting.ledger import NEW_POD, Accounting, Outcome, PodLedger, account, billed_micro_gpu_seconds


def report(seq: int, gpu_seconds: float, share: float = 0.5, final: bool = False) -> MeterReport:
    return MeterReport("uid-1", "team-a", "trainer", share, seq, gpu_seconds, final)


def test_the_first_report_charges_its_whole_cumulative_whatever_its_seq() -> None:
    assert account(NEW_POD, 0, 5, False).charge_micro_gpu_seconds == 5
    assert account(NEW_POD, 3, 90_000_000, False) == Accounting(Outcome.CHARGED, PodLedger(3, 90_000_000, False), 90_000_000)


def test_only_growth_is_charged_and_a_lost_report_is_recovered_by_the_next() -> None:
    ledger = PodLedger(1, 30_000_000, False)
    # seq 2 was lost; seq 3 carries the whole cumulative, so seq 2's time is charged now.
    result = account(ledger, 3, 90_000_000, False)
    assert result == Accounting(Outcome.CHARGED, PodLedger(3, 90_000_000, False), 60_000_000)


@pytest.mark.parametrize("seq", [1, 2])
def test_a_repeated_or_overtaken_report_changes_nothing(seq: int) -> None:
    ledger = PodLedger(2, 60_000_000, False)
    assert account(ledger, seq, 99_000_000, False) == Accounting(Outcome.DUPLICATE, ledger, 0)


def test_a_smaller_cumulative_is_never_a_refund() -> None:
    ledger = PodLedger(2, 60_000_000, False)
    assert account(ledger, 3, 10_000_000, False) == Accounting(Outcome.REGRESSED, ledger, 0)


def test_nothing_changes_after_the_final_report() -> None:
    final = account(PodLedger(2, 60_000_000, False), 3, 61_000_000, True)
    assert final.outcome is Outcome.CHARGED and final.ledger.final
    assert account(final.ledger, 4, 900_000_000, False) == Accounting(Outcome.AFTER_FINAL, final.ledger, 0)


def test_any_order_and_any_repetition_charges_the_highest_cumulative_once() -> None:
    reports = [(seq, seq * 7_000_000) for seq in range(1, 60)]
    stream = reports * 3
    random.Random(7).shuffle(stream)
    ledger, charged = NEW_POD, 0
    for seq, cumulative in stream:
        result = account(ledger, seq, cumulative, False)
        ledger, charged = result.ledger, charged + result.charge_micro_gpu_seconds
    # Whatever arrived first and last, the total charged is what the ledger holds, and never more than the truth.
    assert charged == ledger.micro_gpu_seconds <= 59 * 7_000_000
    assert ledger.last_seq == 59 or ledger.micro_gpu_seconds < 59 * 7_000_000


def test_reports_in_order_charge_exactly_the_truth() -> None:
    ledger, charged = NEW_POD, 0
    for seq in range(1, 101):
        result = account(ledger, seq, seq * 1_500_000, seq == 100)
        ledger, charged = result.ledger, charged + result.charge_micro_gpu_seconds
    assert charged == 150_000_000


def test_the_cumulative_is_billed_at_the_trusted_share() -> None:
    # The meter claims a quarter of a GPU; the webhook recorded half a GPU on the pod.
    assert billed_micro_gpu_seconds(report(1, 25.0, share=0.25), trusted_share=0.5) == 50_000_000
    assert billed_micro_gpu_seconds(report(1, 25.0, share=0.25), trusted_share=None) == 25_000_000
    assert billed_micro_gpu_seconds(report(1, 0.0, share=0.0), trusted_share=0.5) == 0


def test_re_billing_cannot_make_an_absurd_cumulative() -> None:
    # A meter claiming a billionth of a GPU: at the pod's real share its cumulative would exceed any possible use.
    with pytest.raises(ReportError, match="more than"):
        billed_micro_gpu_seconds(report(1, 3e8, share=1e-9), trusted_share=1.0)


@pytest.mark.parametrize("trusted_share", [0.5, None])
def test_a_zero_share_with_time_is_refused(trusted_share: float | None) -> None:
    with pytest.raises(ReportError, match="gpuShare is 0 but gpuSeconds is not"):
        billed_micro_gpu_seconds(report(1, 10.0, share=0.0), trusted_share)
