"""The node agent end to end on one node: a real gRPC server as its kubelet, a fake driver playing a trace, the
host's /proc and the kubelet's log directories on disk, and a timekeeper's endpoint on loopback that records each
batch: its body, its bearer token; batches retried until the next is due and then dropped, refused ones not retried."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpusharing.serving.delivery import Delivery, TokenPoster
from gpusharing.utilisation import NodeReadings, PodUtilisation
from nodeagent.agent import READINGS_PATH, NodeAgent
from nodeagent.config import NodeAgentConfig
from nodeagent.devices import Gpus
from nodeagent.kubelet import PodResources
from tests.nodeagent.conftest import ReadingsEndpoint
from tests.nodeagent.fake_nvml import MIB, FakeGpu, FakeNvml
from tests.nodeagent.kubelet import FakeKubelet, KubeletSocket, Pod, cgroupfs_v1, node_view, systemd_cgroup

A, B, C = (
    "0b8a3c1e-2f4d-4c55-9d0e-6a7b8c9d0e1f",
    "1c9b4d2f-3a5e-4d66-8e1f-7b8c9d0e1f2a",
    "2dac5e3a-4b6f-4e77-9f2a-8c9d0e1f2a3b",
)
GPU0, GPU1 = "GPU-5b2b8a1e-0000-1111-2222-333344445555", "GPU-5b2b8a1e-0000-1111-2222-333344446666"
INTERVAL = 30.0


class Clock(threading.Event):
    """The agent's monotonic clock and its stop event: a wait passes the time at once instead of sleeping."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def wait(self, timeout: float | None = None) -> bool:
        self.now += timeout or 0.0
        return self.is_set()


@dataclass
class Node:
    agent: NodeAgent
    kubelet: KubeletSocket
    nvml: FakeNvml
    clock: Clock
    token: Path


@pytest.fixture
def node(tmp_path: Path, socket_dir: Path, endpoint: ReadingsEndpoint) -> Iterator[Node]:
    """gpu-node-1: trainer (team-a) holds GPU0 whole; two notebooks share GPU1's four replicas, one each."""
    pods = [Pod("team-a", "trainer", A, {"nvidia.com/gpu": [GPU0]}),
            Pod("team-b", "notebook-1", B, {"nvidia.com/gpu.shared": [f"{GPU1}::0"]}),
            Pod("team-c", "notebook-2", C, {"nvidia.com/gpu.shared": [f"{GPU1}::1"]})]
    proc, logs = node_view(
        tmp_path,
        {
            10: systemd_cgroup(A),
            11: systemd_cgroup(A),
            20: cgroupfs_v1(B),
            30: systemd_cgroup(C, "besteffort"),
            99: "0::/system.slice/some-daemon.service\n",
        },
        pods,
    )
    kubelet = KubeletSocket(socket_dir / "kubelet.sock", FakeKubelet(pods, allocatable={
        "nvidia.com/gpu": [GPU0], "nvidia.com/gpu.shared": [f"{GPU1}::{n}" for n in range(4)]})).start()
    clock = Clock()
    nvml = FakeNvml([FakeGpu(GPU0, {10: 4096 * MIB, 11: 1024 * MIB}, busy={10: 50, 11: 20}),
                     FakeGpu(GPU1, {20: 2048 * MIB, 30: 512 * MIB, 99: MIB}, busy={20: 15, 30: 0, 99: 80})],
                    clock=lambda: clock.now - 1000.0)
    token = tmp_path / "token"
    token.write_text("node-agent-token-1\n")
    config = NodeAgentConfig(
        node="gpu-node-1",
        timekeeper_url=endpoint.url,
        token_path=token,
        interval_seconds=INTERVAL,
        podresources_socket=kubelet.socket,
        proc_root=proc,
        pod_logs=logs,
    )
    agent = NodeAgent(
        config,
        PodResources(kubelet.socket, config.resources),
        Gpus(nvml),
        TokenPoster(endpoint.url, token),
        monotonic=clock,
        stop=clock,
    )
    yield Node(agent, kubelet, nvml, clock, token)
    agent.kubelet.close()
    agent.poster.close()
    kubelet.stop()


def interval(node: Node) -> NodeReadings:
    node.clock.now += INTERVAL
    batch = node.agent.read()
    assert batch is not None
    return batch


def test_one_batch_per_interval_with_every_governed_pods_reading_and_the_agents_token(
    node: Node, endpoint: ReadingsEndpoint
) -> None:
    batch = interval(node)
    assert batch == NodeReadings("gpu-node-1", INTERVAL, (
        PodUtilisation(A, "team-a", "trainer", 70.0, 5120.0),  # its two processes summed
        PodUtilisation(B, "team-b", "notebook-1", 60.0, 2048.0),  # 15 % of a GPU it has a quarter of
        # idle: not one sample; the host's busy process is nobody's
        PodUtilisation(C, "team-c", "notebook-2", 0.0, 512.0),
    ))
    assert node.agent.deliver(batch, node.clock.now + INTERVAL).delivery is Delivery.ACCEPTED
    node.token.write_text("node-agent-token-2\n")  # rotated by the kubelet
    node.agent.deliver(interval(node), node.clock.now + INTERVAL)
    first, second = endpoint.wait_for(2)
    assert (first.path, first.authorization, first.body) == (
        READINGS_PATH,
        "Bearer node-agent-token-1",
        batch.to_json(),
    )
    assert NodeReadings.from_json(first.body) == batch  # what the timekeeper reads is what was measured
    assert second.authorization == "Bearer node-agent-token-2"


def test_each_batch_covers_only_its_own_interval(node: Node) -> None:
    busy = node.nvml.gpus[0].busy
    interval(node)
    busy[10], busy[11] = 0, 0  # the trainer goes idle
    assert interval(node).readings[0].utilisation_percent == 0.0
    busy[10] = 100
    assert interval(node).readings[0].utilisation_percent == 100.0  # 120 % of its GPU: capped at all of it


def test_a_timekeeper_away_is_retried_until_the_next_batch_is_due_then_the_batch_is_dropped(
    node: Node, endpoint: ReadingsEndpoint
) -> None:
    endpoint.statuses = [503, 503, 200]
    start = node.clock.now
    assert node.agent.deliver(interval(node), start + 2 * INTERVAL).delivery is Delivery.ACCEPTED
    assert len(endpoint.received) == 3
    endpoint.statuses = [503]
    batch = interval(node)
    deadline = node.clock.now + INTERVAL
    dropped = node.agent.deliver(batch, deadline)
    assert dropped.delivery is Delivery.UNAVAILABLE and "HTTP 503" in dropped.detail
    # Backing off from half a second, doubling (0.5 + 1 + 2 + 4 + 8 s), and never past the next batch's time.
    assert len(endpoint.received) - 3 == 6 and node.clock.now <= deadline


def test_a_refused_batch_is_not_retried_and_says_why(
    node: Node, endpoint: ReadingsEndpoint, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint.statuses = [403]
    with caplog.at_level(logging.WARNING):
        answer = node.agent.deliver(interval(node), node.clock.now + INTERVAL)
    assert answer.delivery is Delivery.REFUSED and len(endpoint.received) == 1
    assert (
        "the timekeeper refused this node's readings (HTTP 403: the token is not a node agent's of this node)"
        in caplog.text
    )


def test_pods_the_timekeeper_ignores_are_logged_when_that_changes(
    node: Node, endpoint: ReadingsEndpoint, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint.ignored = [{"podUid": C, "reason": "not bound to gpu-node-1"}]
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            node.agent.deliver(interval(node), node.clock.now + INTERVAL)
    assert caplog.text.count(f"ignored 1 of this node's readings: {C}: not bound to gpu-node-1") == 1


def test_while_the_kubelet_is_away_nothing_is_sent_and_a_restarted_one_is_read(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    node.kubelet.stop()
    with caplog.at_level(logging.WARNING):
        node.clock.now += INTERVAL
        assert node.agent.read() is None
    assert "the kubelet's PodResources API" in caplog.text and "is unavailable" in caplog.text
    node.kubelet.kubelet.pods = node.kubelet.kubelet.pods[:1]
    node.kubelet.start()  # re-created, as after a kubelet restart
    batch = interval(node)
    assert [r.pod for r in batch.readings] == ["trainer"]
    assert batch.window_seconds == 2 * INTERVAL  # the window runs from the last batch read


def test_a_driver_that_fails_sends_nothing_rather_than_a_wrong_reading(node: Node) -> None:
    node.nvml.failure = "Driver Not Loaded"
    node.clock.now += INTERVAL
    assert node.agent.read() is None


def test_an_unexpected_failure_loses_one_intervals_batch_not_the_agent(
    node: Node, endpoint: ReadingsEndpoint, caplog: pytest.LogCaptureFixture
) -> None:
    broken = node.nvml.gpus[0]
    broken.processes = {10: float("nan")}  # type: ignore[dict-item]  # no driver says this: JSON cannot carry it
    runner = threading.Thread(target=node.agent.run)
    with caplog.at_level(logging.ERROR):
        runner.start()
        try:
            for _ in range(3000):  # the clock's waits pass at once; the bound only stops a broken test from hanging
                if "this interval's readings were not sent" in caplog.text or not runner.is_alive():
                    break
                threading.Event().wait(0.01)
            assert runner.is_alive() and endpoint.received == []
            broken.processes = {10: MIB}
            endpoint.wait_for(1)
        finally:
            node.clock.set()
            runner.join(timeout=30)
    assert not runner.is_alive()


def test_the_loop_sends_a_batch_each_interval_until_stopped(
    tmp_path: Path, socket_dir: Path, endpoint: ReadingsEndpoint
) -> None:
    pods = [Pod("team-a", "trainer", A, {"nvidia.com/gpu": [GPU0]})]
    proc, logs = node_view(tmp_path, {10: systemd_cgroup(A)}, pods)
    kubelet = KubeletSocket(socket_dir / "kubelet.sock", FakeKubelet(pods)).start()
    token = tmp_path / "token"
    token.write_text("t")
    config = NodeAgentConfig(node="gpu-node-1", timekeeper_url=endpoint.url, token_path=token, interval_seconds=0.1,
                             podresources_socket=kubelet.socket, proc_root=proc, pod_logs=logs)
    stop = threading.Event()
    agent = NodeAgent(
        config,
        PodResources(kubelet.socket, config.resources),
        Gpus(FakeNvml([FakeGpu(GPU0, {10: MIB})])),
        TokenPoster(endpoint.url, token),
        stop=stop,
    )
    runner = threading.Thread(target=agent.run)
    runner.start()
    try:
        batches = endpoint.wait_for(3)
    finally:
        stop.set()
        runner.join(timeout=30)
        kubelet.stop()
    assert not runner.is_alive()
    assert [b.body["readings"] for b in batches] == [
        [{"podUid": A, "namespace": "team-a", "pod": "trainer", "utilisationPercent": 0.0, "memoryUsedMiB": 1.0}]
    ] * 3
