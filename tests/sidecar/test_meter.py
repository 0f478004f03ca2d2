"""The meter's arithmetic and bookkeeping, without processes: billing, the retry schedule, reports and their numbers."""

import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from demo.reportsink import ReportSink
from sidecar.client import Delivery, TimekeeperClient
from sidecar.config import MeterConfig
from sidecar.meter import Meter, retry_delay
from sidecar.state import MeterState, StateFile
from tests.sidecar import fake_gpu

UID = "0b8a3c1e-2f4d-4c55-9d0e-6a7b8c9d0e1f"
START = 1_700_000_000.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def receiver() -> Iterator[ReportSink]:
    sink = ReportSink()
    yield sink
    sink.close()


@pytest.fixture
def config(tmp_path: Path, receiver: ReportSink) -> MeterConfig:
    (tmp_path / "token").write_text("token-1\n")
    return MeterConfig(
        namespace="ml",
        pod_name="train-0",
        pod_uid=UID,
        gpu_share=0.25,
        timekeeper_url=receiver.url,
        token_path=tmp_path / "token",
        state_dir=tmp_path,
        interval_seconds=30.0,
    )


def make_meter(config: MeterConfig, clock: Clock, gpu: fake_gpu.FakeGpu | None = None) -> Meter:
    return Meter(
        config, TimekeeperClient(config.timekeeper_url, config.token_path), StateFile(config.state_dir), gpu, clock
    )


def test_retries_double_from_a_quarter_interval_up_to_four_intervals_with_jitter() -> None:
    lowest = [retry_delay(n, 30.0, lambda: 0.0) for n in range(1, 9)]
    highest = [retry_delay(n, 30.0, lambda: 1.0) for n in range(1, 9)]
    assert highest == [7.5, 15.0, 30.0, 60.0, 120.0, 120.0, 120.0, 120.0]
    assert lowest == [d / 2 for d in highest]
    assert retry_delay(10_000, 30.0, lambda: 1.0) == 120.0


def test_the_bill_is_share_times_time_since_the_first_start(config: MeterConfig) -> None:
    clock = Clock(START)
    meter = make_meter(config, clock)
    clock.now = START + 400
    assert meter.gpu_seconds() == 100.0
    assert make_meter(replace(config, time_scale=60.0), clock).gpu_seconds() == 6000.0


def test_a_restarted_meter_continues_the_count_and_the_numbers(config: MeterConfig) -> None:
    StateFile(config.state_dir).save(MeterState(UID, START, seq=17))
    clock = Clock(START + 1000)
    meter = make_meter(config, clock)
    assert meter.gpu_seconds() == 250.0
    assert meter.build_report(meter.state.seq + 1, final=False).seq == 18


def test_a_first_start_saves_its_start_at_once(config: MeterConfig) -> None:
    make_meter(config, Clock(START))
    assert StateFile(config.state_dir).load(UID) == MeterState(UID, START, 0)


def test_a_report_carries_the_requested_memory_and_the_gpu_reading(config: MeterConfig) -> None:
    clock = Clock(START)
    meter = make_meter(replace(config, gpu_memory_requested_mib=20480.0), clock, fake_gpu.FakeGpu())
    clock.now += 40
    assert meter.build_report(5, final=True).to_json() == {
        "podUid": UID,
        "namespace": "ml",
        "pod": "train-0",
        "gpuShare": 0.25,
        "seq": 5,
        "gpuSeconds": 10.0,
        "final": True,
        "gpuMemoryUsedMiB": fake_gpu.MEMORY_USED_MIB,
        "gpuUtilizationPercent": fake_gpu.UTILIZATION_PERCENT,
        "gpuMemoryRequestedMiB": 20480.0,
        "gpuModel": fake_gpu.MODEL,
    }


def test_without_a_gpu_reader_a_report_has_no_gpu_fields(config: MeterConfig) -> None:
    body = make_meter(config, Clock(START)).build_report(1, final=False).to_json()
    assert not {"gpuMemoryUsedMiB", "gpuUtilizationPercent", "gpuMemoryRequestedMiB", "gpuModel"} & set(body)


def test_each_report_is_sent_with_the_token_as_it_is_now(config: MeterConfig, receiver: ReportSink) -> None:
    meter = make_meter(config, Clock(START))
    assert meter.report(final=False, timeout=5).delivery is Delivery.ACCEPTED
    config.token_path.write_text("token-2")
    assert meter.report(final=False, timeout=5).delivery is Delivery.ACCEPTED
    assert [(r.body["seq"], r.authorization) for r in receiver.received] == [
        (1, "Bearer token-1"),
        (2, "Bearer token-2"),
    ]


def test_a_sequence_number_is_saved_before_its_report_leaves(config: MeterConfig, receiver: ReportSink) -> None:
    meter = make_meter(config, Clock(START))
    receiver.close()
    assert meter.report(final=False, timeout=1).delivery is Delivery.UNAVAILABLE
    assert StateFile(config.state_dir).load(UID) == MeterState(UID, START, 1)


@pytest.mark.parametrize(
    ("status", "answer", "delivery", "detail"),
    [
        (200, {"state": "over-budget"}, Delivery.ACCEPTED, 'HTTP 200: {"state": "over-budget"}'),
        (400, {"error": "gpuShare must be a number"}, Delivery.REFUSED, "HTTP 400: gpuShare must be a number"),
        (403, {"message": "token is not this pod's"}, Delivery.REFUSED, "HTTP 403: token is not this pod's"),
        (500, {"error": "database is locked"}, Delivery.UNAVAILABLE, "HTTP 500: database is locked"),
        (503, {}, Delivery.UNAVAILABLE, "HTTP 503: {}"),
    ],
)
def test_answers_are_told_apart(
    config: MeterConfig, receiver: ReportSink, status: int, answer: dict[str, Any], delivery: Delivery, detail: str
) -> None:
    receiver.status, receiver.answer = status, answer
    result = make_meter(config, Clock(START)).report(final=False, timeout=5)
    assert (result.delivery, result.detail) == (delivery, detail)
    assert result.budget_state == ("over-budget" if delivery is Delivery.ACCEPTED else None)


def test_a_missing_token_is_worth_another_try_and_sends_nothing(config: MeterConfig, receiver: ReportSink) -> None:
    config.token_path.unlink()
    result = make_meter(config, Clock(START)).report(final=False, timeout=5)
    assert result.delivery is Delivery.UNAVAILABLE
    assert "cannot read the token file" in result.detail
    assert receiver.received == []


def test_the_loop_backs_off_while_the_timekeeper_fails_then_keeps_the_interval_and_ends_with_a_final_report(
    config: MeterConfig, receiver: ReportSink
) -> None:
    clock = Clock(START)
    meter = make_meter(config, clock)
    receiver.status = 503
    next_statuses = iter([503, 503, 200, 200])
    waits: list[float] = []

    def stop_requested(seconds: float) -> bool:  # stands for the wait between reports; time moves by what it waits
        waits.append(seconds)
        clock.now += seconds
        receiver.status = next(next_statuses)
        return len(waits) == 4

    meter.run(stop_requested)

    interval = config.interval_seconds
    assert interval / 8 <= waits[0] <= interval / 4
    assert interval / 4 <= waits[1] <= interval / 2
    assert interval / 2 <= waits[2] <= interval
    assert waits[3] == interval
    sent = [r.body for r in receiver.received]
    assert [body["seq"] for body in sent] == [1, 2, 3, 4, 5]
    assert [body.get("final", False) for body in sent] == [False] * 4 + [True]
    assert [body["gpuSeconds"] for body in sent] == [round(0.25 * sum(waits[:n]), 3) for n in range(5)]


def test_an_outage_is_one_line_when_it_starts_and_one_when_it_ends(
    config: MeterConfig, receiver: ReportSink, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a line per failed report (with many meters per node, for as long as the timekeeper is down)."""
    clock = Clock(START)
    meter = make_meter(config, clock)
    caplog.set_level(logging.INFO, logger="sidecar.meter")
    assert meter.report(final=False, timeout=5).delivery is Delivery.ACCEPTED
    receiver.status = 503
    for _ in range(20):
        clock.now += 60
        assert meter.report(final=False, timeout=5).delivery is Delivery.UNAVAILABLE
    receiver.status = 200
    clock.now += 30
    assert meter.report(final=False, timeout=5).delivery is Delivery.ACCEPTED
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "report 1 accepted: 0.000 GPU-seconds"),
        ("INFO", "namespace ml is in-budget"),
        ("WARNING", f"the timekeeper at {receiver.url} is unavailable: report 2 not delivered: HTTP 503: "
                    '{"state": "in-budget"}; the meter keeps counting and tries again with backoff; the first report '
                    "delivered carries the whole total (logged again when it is back)"),
        ("INFO", f"the timekeeper at {receiver.url} is back after 19 min 30 s (20 reports failed): report 22 accepted: "
                 "307.500 GPU-seconds"),
    ]
