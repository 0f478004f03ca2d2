"""A pod's bill from its two sources, exactly once, without HTTP or a database: the API server's record (observations)
and the meter's reports (evidence, which may add but never lower, stop or end a bill)."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from gpusharing.report import MeterReport, ReportError
from timekeeper.accounting.ledger import (
    NEW_POD,
    Observation,
    Outcome,
    PodLedger,
    billed_micro_gpu_seconds,
    close,
    meter_ceiling,
    observe,
    report,
)

START = dt.datetime(2026, 11, 25, 10, 0, tzinfo=dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    return START + dt.timedelta(seconds=seconds)


def meter_report(seq: int, gpu_seconds: float, share: float = 0.5, final: bool = False) -> MeterReport:
    return MeterReport("uid-1", "team-a", "trainer", share, seq, gpu_seconds, final)


def running(until: float, share: float = 0.5) -> Observation:
    return Observation(share, START, at(until), ended=False)


# -- the meter's reports, where nothing else is known (off a cluster)
# ---------------------------------------------------

def test_the_first_report_charges_its_whole_cumulative_whatever_its_seq() -> None:
    assert report(NEW_POD, 0, 5, False, None).charge_micro_gpu_seconds == 5
    result = report(NEW_POD, 3, 90_000_000, False, None)
    assert (result.outcome, result.ledger.last_seq, result.ledger.billed, result.charge_micro_gpu_seconds) == (
        Outcome.CHARGED, 3, 90_000_000, 90_000_000)


def test_only_growth_is_charged_and_a_lost_report_is_recovered_by_the_next() -> None:
    ledger = PodLedger(last_seq=1, metered=30_000_000, billed=30_000_000)
    # seq 2 was lost; seq 3 carries the whole cumulative, so seq 2's time is charged now.
    assert report(ledger, 3, 90_000_000, False, None).charge_micro_gpu_seconds == 60_000_000


@pytest.mark.parametrize("seq", [1, 2])
def test_a_repeated_or_overtaken_report_changes_nothing(seq: int) -> None:
    ledger = PodLedger(last_seq=2, metered=60_000_000, billed=60_000_000)
    result = report(ledger, seq, 99_000_000, False, None)
    assert (result.outcome, result.ledger, result.charge_micro_gpu_seconds) == (Outcome.DUPLICATE, ledger, 0)


def test_a_smaller_cumulative_is_never_a_refund() -> None:
    ledger = PodLedger(last_seq=2, metered=60_000_000, billed=60_000_000)
    assert report(ledger, 3, 10_000_000, False, None).outcome is Outcome.REGRESSED


def test_reports_after_the_meters_final_one_change_nothing() -> None:
    final = report(PodLedger(last_seq=2, metered=60_000_000, billed=60_000_000), 3, 61_000_000, True, None)
    assert final.outcome is Outcome.CHARGED and final.ledger.final
    assert report(final.ledger, 4, 900_000_000, False, None).outcome is Outcome.AFTER_FINAL


def test_any_order_and_any_repetition_charges_the_highest_cumulative_once() -> None:
    stream = [(seq, seq * 7_000_000) for seq in range(1, 60)] * 3
    random.Random(7).shuffle(stream)
    ledger, charged = NEW_POD, 0
    for seq, cumulative in stream:
        result = report(ledger, seq, cumulative, False, None)
        ledger, charged = result.ledger, charged + result.charge_micro_gpu_seconds
    # Whatever arrived first and last, the total charged is what the ledger holds, and never more than the truth.
    assert charged == ledger.billed <= 59 * 7_000_000


# -- the API server's record ------------------------------------------------------------------------------------------

def test_each_observation_bills_the_share_for_the_time_since_the_last() -> None:
    first = observe(NEW_POD, running(10))
    assert first.charge_micro_gpu_seconds == 5_000_000  # 0.5 GPU x 10 s since the recorded start
    second = observe(first.ledger, running(40))
    assert second.charge_micro_gpu_seconds == 15_000_000
    assert second.ledger.observed == second.ledger.billed == 20_000_000 and second.ledger.observed_until == at(40)


def test_an_interval_is_billed_once_however_many_processes_observe_it_in_any_order() -> None:
    ledger, charged = NEW_POD, 0
    times = [10, 40, 25, 40, 70, 55, 70, 100]  # two timekeepers' passes, interleaved, one clock a little behind
    for until in times:
        result = observe(ledger, running(until))
        ledger, charged = result.ledger, charged + result.charge_micro_gpu_seconds
    assert charged == ledger.billed == 50_000_000  # 0.5 x 100 s, exactly


def test_an_ended_pod_is_billed_to_its_end_and_closed() -> None:
    ended = observe(observe(NEW_POD, running(30)).ledger, Observation(0.5, START, at(45), ended=True))
    assert ended.ledger.closed and ended.ledger.ended_at == at(45) and ended.ledger.billed == 22_500_000
    late = observe(ended.ledger, running(900))  # a process that still saw it running: too late to add anything
    assert (late.outcome, late.charge_micro_gpu_seconds) == (Outcome.CLOSED, 0)


def test_a_share_that_changes_bills_each_interval_at_its_own_share() -> None:
    # A DRA pod whose claim was allocated more devices: priced by the allocation from then on, never backwards.
    first = observe(NEW_POD, Observation(1.0, START, at(10), ended=False))
    second = observe(first.ledger, Observation(4.0, START, at(20), ended=False))
    assert second.ledger.billed == 10_000_000 + 40_000_000


def test_a_pod_lost_from_sight_closes_as_last_observed() -> None:
    seen = observe(NEW_POD, running(60)).ledger
    closed = close(seen, at(600))
    assert closed.ledger.ended_at == at(60) and closed.charge_micro_gpu_seconds == 0


# -- the two together: billed = max(record, meter as capped) ---------------------------------------------------------

def test_a_forged_final_or_a_huge_seq_cannot_stop_the_bill() -> None:
    ledger = observe(NEW_POD, running(10)).ledger
    ledger = report(ledger, 2**62, 1_000_000, True, meter_ceiling(ledger, 0.5, at(12))).ledger  # final, seq 2^62
    result = observe(ledger, running(44))
    assert result.ledger.billed == 22_000_000  # the whole 44 s at 0.5 GPU, as recorded
    assert report(result.ledger, 5, 30_000_000, False, None).outcome is Outcome.AFTER_FINAL  # the meter is just ignored


def test_a_silent_meter_lowers_nothing() -> None:
    ledger = NEW_POD
    for until in range(30, 150, 30):
        ledger = observe(ledger, running(until)).ledger
    assert ledger.billed == 60_000_000 and ledger.metered == 0


def test_the_meter_fills_what_the_record_has_not_seen_yet_and_is_not_charged_twice() -> None:
    ledger = observe(NEW_POD, running(30)).ledger  # billed 15 GPU-s
    ledger = report(ledger, 1, 25_000_000, False, meter_ceiling(ledger, 0.5, at(50))).ledger  # the meter, 20 s later
    assert ledger.billed == 25_000_000
    result = observe(ledger, running(60))  # the record catches up: only what goes beyond the bill is charged
    assert (result.ledger.billed, result.charge_micro_gpu_seconds) == (30_000_000, 5_000_000)


def test_the_meter_may_claim_no_more_than_its_share_since_the_recorded_start() -> None:
    ledger = observe(NEW_POD, running(10)).ledger
    inflated = report(ledger, 1, 10**15, False, meter_ceiling(ledger, 0.5, at(20)))
    assert inflated.ledger.billed == 10_000_000  # 0.5 x 20 s, not a billion GPU-seconds that would exhaust a group
    assert inflated.ledger.metered == 10**15  # kept as reported, for the record


def test_after_the_end_the_meter_is_capped_at_the_recorded_end() -> None:
    ledger = observe(NEW_POD, Observation(0.5, START, at(40), ended=True)).ledger
    assert meter_ceiling(ledger, 0.5, at(4000)) == 20_000_000


def test_off_a_cluster_the_meter_stands_alone() -> None:
    assert meter_ceiling(NEW_POD, 0.5, at(100)) is None


def test_the_cumulative_is_billed_at_the_trusted_share() -> None:
    # The meter claims a quarter of a GPU; the webhook recorded half a GPU on the pod.
    assert billed_micro_gpu_seconds(meter_report(1, 25.0, share=0.25), trusted_share=0.5) == 50_000_000
    assert billed_micro_gpu_seconds(meter_report(1, 25.0, share=0.25), trusted_share=None) == 25_000_000
    assert billed_micro_gpu_seconds(meter_report(1, 0.0, share=0.0), trusted_share=0.5) == 0


def test_re_billing_cannot_make_an_absurd_cumulative() -> None:
    # A meter claiming a billionth of a GPU: at the pod's real share its cumulative would exceed any possible use.
    with pytest.raises(ReportError, match="more than"):
        billed_micro_gpu_seconds(meter_report(1, 3e8, share=1e-9), trusted_share=1.0)


@pytest.mark.parametrize("trusted_share", [0.5, None])
def test_a_zero_share_with_time_is_refused(trusted_share: float | None) -> None:
    with pytest.raises(ReportError, match="gpuShare is 0 but gpuSeconds is not"):
        billed_micro_gpu_seconds(meter_report(1, 10.0, share=0.0), trusted_share)


def test_time_billed_past_the_recorded_end_is_taken_back_when_the_end_arrives() -> None:
    # A pass billed the pod to 50 s; its kubelet then wrote that its containers finished at 45 s.
    billed = observe(NEW_POD, running(50)).ledger
    ended = observe(billed, Observation(0.5, START, at(45), ended=True))
    assert ended.charge_micro_gpu_seconds == -2_500_000  # the 5 s at 0.5 GPU nobody used
    assert (ended.ledger.billed, ended.ledger.observed, ended.ledger.ended_at) == (22_500_000, 22_500_000, at(45))
    late = observe(ended.ledger, running(900))
    assert (late.outcome, late.charge_micro_gpu_seconds) == (Outcome.CLOSED, 0)


def test_the_meter_is_capped_at_the_recorded_end_when_the_end_arrives_late() -> None:
    ledger = observe(NEW_POD, running(30)).ledger
    ledger = report(ledger, 1, 25_000_000, False, meter_ceiling(ledger, 0.5, at(50))).ledger  # 50 s, by its meter
    ended = observe(ledger, Observation(0.5, START, at(40), ended=True))
    assert (ended.ledger.billed, ended.charge_micro_gpu_seconds) == (20_000_000, -5_000_000)  # 0.5 x 40 s, exactly
