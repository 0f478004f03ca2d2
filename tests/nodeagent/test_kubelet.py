"""The kubelet's PodResources API, spoken by a real gRPC server on a unix socket: the governed pods and their devices
read, other resources and pods left out, the node's allocatable devices where the kubelet lists them, and a kubelet
restarted (its socket re-created) followed at the next listing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nodeagent.config import DEFAULT_RESOURCES
from nodeagent.kubelet import KubeletUnavailable, NodeDevices, PodDevices, PodResources
from tests.nodeagent.kubelet import FakeKubelet, KubeletSocket, Pod

A, B, C = "0b8a3c1e-2f4d-4c55-9d0e-6a7b8c9d0e1f", "1c9b4d2f-3a5e-4d66-8e1f-7b8c9d0e1f2a", "2dac5e3a-4b6f-4e77-9f2a-8c9d0e1f2a3b"


def test_lists_the_pods_holding_a_gpu_resource_of_any_dialect_and_nothing_else(socket_dir: Path) -> None:
    kubelet = FakeKubelet([
        Pod("team-a", "trainer", A, {"nvidia.com/gpu": ["GPU-1111::0", "GPU-1111::3"], "example.com/nic": ["eth1"]}),
        Pod("team-a", "web", B, {"example.com/nic": ["eth2"]}),  # no GPU: not governed here
        Pod("team-b", "sliced", C, {"nvidia.com/mig-1g.10gb": ["MIG-aaaa"], "tencent.com/vcuda-core": ["vc-1"]}),
    ], allocatable={"nvidia.com/gpu": [f"GPU-1111::{n}" for n in range(4)], "example.com/nic": ["eth1", "eth2"]})
    server = KubeletSocket(socket_dir / "kubelet.sock", kubelet).start()
    try:
        client = PodResources(server.socket, DEFAULT_RESOURCES)
        assert client.read() == NodeDevices(
            pods=(PodDevices("team-a", "trainer", (("nvidia.com/gpu", "GPU-1111::0"), ("nvidia.com/gpu", "GPU-1111::3"))),
                  PodDevices("team-b", "sliced", (("nvidia.com/mig-1g.10gb", "MIG-aaaa"), ("tencent.com/vcuda-core", "vc-1")))),
            allocatable=tuple(("nvidia.com/gpu", f"GPU-1111::{n}") for n in range(4)),
        )
        client.close()
    finally:
        server.stop()


def test_only_the_configured_resources_make_a_pod_governed(socket_dir: Path) -> None:
    kubelet = FakeKubelet([Pod("team-a", "a", A, {"nvidia.com/gpu": ["GPU-1"]}), Pod("team-a", "b", B, {"example.com/fpga-x": ["f0"]})],
                          allocatable={"nvidia.com/gpu": ["GPU-1", "GPU-2"], "example.com/fpga-x": ["f0", "f1"]})
    server = KubeletSocket(socket_dir / "kubelet.sock", kubelet).start()
    try:
        node = PodResources(server.socket, ("example.com/fpga-*",)).read()
        assert node == NodeDevices((PodDevices("team-a", "b", (("example.com/fpga-x", "f0"),)),),
                                   (("example.com/fpga-x", "f0"), ("example.com/fpga-x", "f1")))
    finally:
        server.stop()


def test_a_kubelet_without_allocatable_resources_is_read_all_the_same_and_said_once(socket_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = KubeletSocket(socket_dir / "kubelet.sock", FakeKubelet([Pod("ns", "p", A, {"nvidia.com/gpu": ["GPU-1"]})], allocatable=None)).start()
    try:
        client = PodResources(server.socket, DEFAULT_RESOURCES)
        with caplog.at_level(logging.INFO):
            assert [client.read().allocatable, client.read().allocatable] == [None, None]
        assert caplog.text.count("does not list the node's allocatable devices") == 1
        assert server.kubelet.listings == 2
    finally:
        server.stop()


def test_a_restarted_kubelet_is_followed_at_the_next_listing(socket_dir: Path) -> None:
    kubelet = FakeKubelet([Pod("ns", "before", A, {"nvidia.com/gpu": ["GPU-1"]})])
    server = KubeletSocket(socket_dir / "kubelet.sock", kubelet).start()
    client = PodResources(server.socket, DEFAULT_RESOURCES)
    try:
        assert [p.name for p in client.read().pods] == ["before"]
        server.stop()  # the kubelet goes away, its socket with it
        with pytest.raises(KubeletUnavailable, match=rf"the kubelet's PodResources API at {server.socket}: UNAVAILABLE"):
            client.read()
        kubelet.pods = [Pod("ns", "after", B, {"nvidia.com/gpu": ["GPU-1"]})]
        server.start()  # a new socket at the same path
        assert [p.name for p in client.read().pods] == ["after"]
        server.restart()  # and again, without a listing failing in between
        kubelet.pods.append(Pod("ns", "later", C, {"nvidia.com/gpu": ["GPU-2"]}))
        assert [p.name for p in client.read().pods] == ["after", "later"]
    finally:
        client.close()
        server.stop()


def test_no_kubelet_at_all_is_unavailable_not_a_crash(socket_dir: Path) -> None:
    with pytest.raises(KubeletUnavailable, match="UNAVAILABLE"):
        PodResources(socket_dir / "absent.sock", DEFAULT_RESOURCES).read()
