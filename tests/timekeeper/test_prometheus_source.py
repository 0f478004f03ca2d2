"""The Prometheus source against a real Prometheus server (`make tools` puts Debian's beside this Python): it scrapes a
small fake dcgm-exporter on loopback, whose series carry `pod`/`namespace` as dcgm-exporter writes them; the scrape
job's own `pod`/`namespace` target labels make Prometheus rename those `exported_pod`/`exported_namespace`, as the GPU
Operator's ServiceMonitor does. One GPU is shared by two pods (the device-wide figure copied to each, and the
exporter's per-pod split with `pod_uid`), one is held whole. The controller's `utilisation` task reads them."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from demo.kubeapi import FakeKube
from gpusharing.utilisation import UtilisationSource
from tests.timekeeper.conftest import Clock, ControllerFactory, run_controller
from tests.timekeeper.prometheus import CannedServer, RecordingSink, beside_python, run_gpu_pod
from timekeeper.accounting.dcgm import DcgmQuery
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.utilisation import PrometheusUtilisation
from timekeeper.config import PrometheusSource

WINDOW_SECONDS = 10


@pytest.fixture
def database_url(tmp_path: Path, sqlite_template: Path) -> str:
    shutil.copyfile(sqlite_template, tmp_path / "timekeeper.sqlite")
    return f"sqlite:///{tmp_path / 'timekeeper.sqlite'}"


def fake_dcgm_exporter() -> CannedServer:
    """`/metrics` in the text exposition format, as dcgm-exporter serves it; the test sets the body."""
    return CannedServer(content_type="text/plain; version=0.0.4")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def query(url: str, promql: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=5) as answer:
        return list(json.load(answer)["data"]["result"])


@pytest.fixture(scope="module")
def exporter() -> Iterator[CannedServer]:
    fake = fake_dcgm_exporter()
    yield fake
    fake.close()


@pytest.fixture(scope="module")
def forger() -> Iterator[CannedServer]:
    """A tenant's own exporter, which Prometheus scrapes through the tenant's ServiceMonitor."""
    fake = fake_dcgm_exporter()
    yield fake
    fake.close()


@pytest.fixture
def prometheus(exporter: CannedServer, forger: CannedServer, tmp_path: Path) -> Iterator[str]:
    """A Prometheus server on loopback scraping the exporters every second, as ServiceMonitors label their targets
    (the target's pod and namespace: the exporter's own become exported_*)."""
    binary = beside_python("prometheus")
    def job(name: str, target: CannedServer, namespace: str, pod: str) -> dict[str, Any]:
        return {"job_name": name, "static_configs": [{"targets": [target.address], "labels": {
            "namespace": namespace, "pod": pod, "container": "nvidia-dcgm-exporter"}}]}
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [job("nvidia-dcgm-exporter", exporter, "gpu-operator", "nvidia-dcgm-exporter-x1"),
                                 job("team-a/nvidia-dcgm-exporter", forger, "team-a", "fake-exporter")]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    server = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    url = f"http://127.0.0.1:{port}"
    try:
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def wait_for(condition: Any, what: str, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:
            pass  # not listening yet
        time.sleep(0.5)
    pytest.fail(f"{what} within {timeout:g} s; Prometheus said: {log.read_text()[-2000:]}")


def exposition(train: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> str:
    """dcgm-exporter's series under KUBERNETES_VIRTUAL_GPUS=true: GPU-1 held by team-a/train; GPU-2 time-sliced
    between team-a/a and team-b/b (the profiling figure copied to each, GPU_UTIL split per pod with pod_uid, and
    the device's own GPU_UTIL without a pod)."""
    def labels(gpu: str, pod: dict[str, Any] | None, **more: str) -> str:
        names = {"gpu": "0", "UUID": gpu, "device": "nvidia0", "modelName": "NVIDIA A100", "Hostname": "node-1", **more}
        if pod is not None:
            names |= {"container": "main", "namespace": pod["metadata"]["namespace"], "pod": pod["metadata"]["name"]}
        return ",".join(f'{key}="{value}"' for key, value in names.items())
    uid = {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in (a, b)}
    return "\n".join([
        "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.",
        "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge",
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels('GPU-1', train)}}} 0.250000",
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels('GPU-2', a, vgpu='0')}}} 0.900000",
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels('GPU-2', b, vgpu='1')}}} 0.900000",
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
        f"DCGM_FI_DEV_GPU_UTIL{{{labels('GPU-1', train)}}} 97",
        f"DCGM_FI_DEV_GPU_UTIL{{{labels('GPU-2', None)}}} 90",
        f"DCGM_FI_DEV_GPU_UTIL{{{labels('GPU-2', a, vgpu='0', pod_uid=uid['a'])}}} 88",
        f"DCGM_FI_DEV_GPU_UTIL{{{labels('GPU-2', b, vgpu='1', pod_uid=uid['b'])}}} 2",
        "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).",
        "# TYPE DCGM_FI_DEV_POWER_USAGE gauge",
        f"DCGM_FI_DEV_POWER_USAGE{{{labels('GPU-1', train)}}} 300.5",
        "",
    ])


def test_the_task_reads_per_pod_utilisation_from_a_real_prometheus_scraping_dcgm_series(
    make_controller: ControllerFactory, fake_kube: FakeKube, exporter: CannedServer, forger: CannedServer,
    prometheus: str, clock: Clock, tmp_path: Path,
) -> None:
    hour_ago = clock.now() - dt.timedelta(hours=1)
    train = run_gpu_pod(fake_kube, "team-a", "train", "1", hour_ago)
    a = run_gpu_pod(fake_kube, "team-a", "a", "0.5", hour_ago)
    b = run_gpu_pod(fake_kube, "team-b", "b", "0.5", hour_ago)
    exporter.body = exposition(train, a, b).encode()
    # team-a's own exporter says team-b/b is idle on a GPU of its own and its own pod busy: neither is read.
    forger.body = "\n".join(
        [
            'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-9",Hostname="node-1",namespace="team-b",pod="b",'
            f'pod_uid="{b["metadata"]["uid"]}"}} 0',
            'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-1",Hostname="node-1",namespace="team-a",pod="train"} 1',
            'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-2",Hostname="node-1",namespace="team-a",pod="a",pod_uid="'
            + a["metadata"]["uid"]
            + '"} 100',
            "",
        ]
    ).encode()
    log = tmp_path / "prometheus.log"
    # A few scrapes, so that the window holds samples; the renamed labels, as a ServiceMonitor stores them.
    wait_for(
        lambda: (
            len(
                query(
                    prometheus,
                    f'count_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{exported_pod="train"}}[{WINDOW_SECONDS}s]) >= 3',
                )
            )
            == 2
        ),
        "three scrapes of the fake dcgm-exporter and of the tenant's",
        log,
    )

    sink = RecordingSink()
    split = PrometheusSource(
        url=prometheus, query=DcgmQuery(per_pod_metric="DCGM_FI_DEV_GPU_UTIL", window_seconds=WINDOW_SECONDS)
    )
    manager = make_controller(KubeApi(fake_kube.api_client()), utilisation_sink=sink, prometheus=split)
    done = run_controller(manager)
    assert done.utilisation is not None and [call[0] for call in sink.calls] == [UtilisationSource.PROMETHEUS]
    # The same cache read without the exporter's split: the task's other configuration.
    device_wide = PrometheusSource(url=prometheus, query=DcgmQuery(window_seconds=WINDOW_SECONDS))
    unsplit = RecordingSink()
    assert PrometheusUtilisation(device_wide, manager.informers.records, unsplit).run(clock.now()) is not None
    readings = {"split": sink.last(), "device-wide only": unsplit.last()}

    # The whole GPU reads its graphics engine's activity; the shared one, the exporter's per-pod split alone.
    assert readings["split"] == {"team-a/train": 25.0, "team-a/a": 88.0, "team-b/b": 2.0}
    # Without the split, the shared GPU's device-wide 90 % is given to neither pod.
    assert readings["device-wide only"] == {"team-a/train": 25.0, "team-a/a": None, "team-b/b": None}
    # Read from every target, the tenant's series would have spoken for its pods and for team-b's.
    anyone = RecordingSink()
    every_target = PrometheusSource(url=prometheus, query=DcgmQuery(per_pod_metric="DCGM_FI_DEV_GPU_UTIL", selector="",
                                                                    window_seconds=WINDOW_SECONDS))
    PrometheusUtilisation(every_target, manager.informers.records, anyone).run(clock.now())
    assert anyone.last() == {"team-a/train": 100.0, "team-a/a": 100.0, "team-b/b": None}
