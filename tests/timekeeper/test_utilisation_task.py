"""The controller's `utilisation` task (TIMEKEEPER_UTILISATION_SOURCE=prometheus) against a stand-in Prometheus on
loopback: it asks the query with the token, hands the governed pods' readings to the sink, and takes Prometheus
down, an error or an oversize answer as an outage logged once, never a crash. Against a real Prometheus server:
test_prometheus_source.py."""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from demo.kubeapi import FakeKube
from gpusharing.utilisation import UtilisationSource
from tests.timekeeper.conftest import Clock, ControllerFactory, run_controller
from tests.timekeeper.prometheus import CannedServer, RecordingSink, run_gpu_pod
from timekeeper.accounting.dcgm import METRIC_LABEL, DcgmQuery, utilisation_query
from timekeeper.cluster.kube import KubeApi
from timekeeper.config import PrometheusSource

GR = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"


@pytest.fixture
def database_url(tmp_path: Path, sqlite_template: Path) -> str:
    """SQLite alone: the task writes nothing of its own (the sink is the ingestion's)."""
    shutil.copyfile(sqlite_template, tmp_path / "timekeeper.sqlite")
    return f"sqlite:///{tmp_path / 'timekeeper.sqlite'}"


class StandInPrometheus(CannedServer):
    """`/api/v1/query`, answering what the test sets."""

    def answer(self, *rows: dict[str, str], values: list[str]) -> None:
        result = [{"metric": labels, "value": [0, value]} for labels, value in zip(rows, values)]
        self.status, self.body = (
            200,
            json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode(),
        )


@pytest.fixture
def prometheus() -> Iterator[StandInPrometheus]:
    server = StandInPrometheus()
    yield server
    server.close()


def series(pod: dict[str, Any], gpu: str, metric: str = GR) -> dict[str, str]:
    return {
        METRIC_LABEL: metric,
        "exported_pod": pod["metadata"]["name"],
        "exported_namespace": pod["metadata"]["namespace"],
        "UUID": gpu,
        "gpu": "0",
        "Hostname": "node-1",
    }


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("prometheus-reader-token\n")
    return path


def controller(
    make_controller: ControllerFactory,
    fake_kube: FakeKube,
    prometheus: StandInPrometheus,
    sink: RecordingSink,
    token_file: Path,
) -> Any:
    source = PrometheusSource(url=prometheus.url, token_file=str(token_file), timeout_seconds=2)
    return make_controller(KubeApi(fake_kube.api_client()), utilisation_sink=sink, prometheus=source)


def test_the_task_asks_the_query_with_the_token_and_hands_the_governed_pods_readings_to_the_sink(
    make_controller: ControllerFactory,
    fake_kube: FakeKube,
    prometheus: StandInPrometheus,
    token_file: Path,
    clock: Clock,
) -> None:
    hour_ago = clock.now() - dt.timedelta(hours=1)
    train = run_gpu_pod(fake_kube, "team-a", "train", "1", hour_ago)
    half = run_gpu_pod(fake_kube, "team-b", "half", "0.5", hour_ago)
    stranger = {"metadata": {"name": "not-governed", "namespace": "team-c"}}
    prometheus.answer(
        series(train, "GPU-1"), series(half, "GPU-2"), series(stranger, "GPU-3"), values=["37.5", "80", "99"]
    )
    sink = RecordingSink()
    manager = controller(make_controller, fake_kube, prometheus, sink, token_file)

    done = run_controller(manager)

    assert prometheus.asked == [
        ("/api/v1/query", {"query": [utilisation_query(DcgmQuery())]}, "Bearer prometheus-reader-token")
    ]
    ((source, readings, window, at),) = sink.calls
    assert (source, window, at) == (UtilisationSource.PROMETHEUS, 120.0, clock.now())
    # A half GPU is never given its device's figure; the pod nobody governs is dropped.
    assert sink.last() == {"team-a/train": 37.5, "team-b/half": None}
    assert {r.pod_uid for r in readings} == {train["metadata"]["uid"], half["metadata"]["uid"]}
    assert done.utilisation is not None and done.utilisation.series == 3
    assert "utilisation" in manager.scheduler.names
    assert [REGISTRY.get_sample_value("gpusharing_controller_utilisation_readings", {"reading": reading})
            for reading in ("known", "unknown")] == [1.0, 1.0]


@pytest.mark.parametrize("failure", ["down", "error", "oversize", "not json"])
def test_prometheus_failing_is_an_outage_logged_once_and_readings_resume_when_it_is_back(
    make_controller: ControllerFactory,
    fake_kube: FakeKube,
    prometheus: StandInPrometheus,
    token_file: Path,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    failure: str,
) -> None:
    train = run_gpu_pod(fake_kube, "team-a", "train", "1", clock.now() - dt.timedelta(hours=1))
    sink = RecordingSink()
    manager = controller(make_controller, fake_kube, prometheus, sink, token_file)
    prometheus.answer(series(train, "GPU-1"), values=["12"])
    if failure == "down":
        manager.utilisation._client.port = _closed_port()
    elif failure == "error":
        prometheus.status, prometheus.body = 400, b'{"status":"error","errorType":"bad_data","error":"parse error"}'
    elif failure == "oversize":
        monkeypatch.setattr("timekeeper.cluster.utilisation.MAX_ANSWER_BYTES", len(prometheus.body) - 1)
    else:
        prometheus.body = b"<html>proxy error</html>"
    caplog.set_level(logging.DEBUG, logger="timekeeper.cluster.utilisation")

    for _ in range(3):
        assert run_controller(manager).utilisation is None
        clock.advance(seconds=60)

    assert sink.calls == []
    started = [r for r in caplog.records if getattr(r, "outage", None) == "started"]
    assert len(started) == 1 and started[0].levelno == logging.WARNING
    assert {"down": "connection refused", "error": "HTTP 400 Bad Request: parse error", "oversize": "more than",
            "not json": "not JSON"}[failure] in started[0].getMessage()

    manager.utilisation._client.port = int(prometheus.url.rsplit(":", 1)[1])
    monkeypatch.setattr("timekeeper.cluster.utilisation.MAX_ANSWER_BYTES", 1024 * 1024)
    prometheus.answer(series(train, "GPU-1"), values=["12"])
    run_controller(manager)
    assert sink.last() == {"team-a/train": 12.0}
    assert [getattr(r, "outage", None) for r in caplog.records].count("ended") == 1


@pytest.mark.parametrize(
    ("content", "said"), [(None, "No such file"), (b"two\r\nX-Injected: words", "does not hold a token")]
)
def test_a_token_file_that_cannot_be_read_or_sent_is_an_outage_too(
    make_controller: ControllerFactory,
    fake_kube: FakeKube,
    prometheus: StandInPrometheus,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    content: bytes | None,
    said: str,
) -> None:
    token = tmp_path / "token"
    if content is not None:
        token.write_bytes(content)
    sink = RecordingSink()
    manager = controller(make_controller, fake_kube, prometheus, sink, token)
    assert run_controller(manager).utilisation is None
    assert said in caplog.text and prometheus.asked == [] and sink.calls == []


def test_the_meter_source_runs_no_utilisation_task(make_controller: ControllerFactory, fake_kube: FakeKube) -> None:
    assert "utilisation" not in make_controller(KubeApi(fake_kube.api_client())).scheduler.names


def test_by_default_the_readings_go_into_the_pods_ledgers_as_prometheus_readings(
    make_controller: ControllerFactory,
    fake_kube: FakeKube,
    prometheus: StandInPrometheus,
    token_file: Path,
    clock: Clock,
) -> None:
    train = run_gpu_pod(fake_kube, "team-a", "train", "1", clock.now() - dt.timedelta(hours=1))
    prometheus.answer(series(train, "GPU-1"), values=["2.5"])
    source = PrometheusSource(url=prometheus.url, token_file=str(token_file), timeout_seconds=2)
    manager = make_controller(KubeApi(fake_kube.api_client()), prometheus=source)
    run_controller(manager)  # the bills task opens the pod's ledger
    run_controller(manager)
    (record,) = manager.biller.ledger.pods("team-a")
    assert (record.utilisation_source, record.gpu_utilization_percent) == ("prometheus", 2.5)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
