"""The kubelet's PodResources API, spoken by a real gRPC server on a unix socket: the governed pods and their devices
read, other resources and pods left out, the node's allocatable devices where the kubelet lists them, and a kubelet
restarted (its socket re-created) followed at the next listing."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from nodeagent.config import DEFAULT_RESOURCES
from nodeagent.kubelet import KubeletUnavailable, NodeDevices, PodDevices, PodResources
from tests.nodeagent.kubelet import FakeKubelet, KubeletSocket, Pod

A, B, C = (
    "0b8a3c1e-2f4d-4c55-9d0e-6a7b8c9d0e1f",
    "1c9b4d2f-3a5e-4d66-8e1f-7b8c9d0e1f2a",
    "2dac5e3a-4b6f-4e77-9f2a-8c9d0e1f2a3b",
)


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
            pods=(
                PodDevices("team-a", "trainer", (("nvidia.com/gpu", "GPU-1111::0"), ("nvidia.com/gpu", "GPU-1111::3"))),
                PodDevices(
                    "team-b", "sliced", (("nvidia.com/mig-1g.10gb", "MIG-aaaa"), ("tencent.com/vcuda-core", "vc-1"))
                ),
            ),
            allocatable=tuple(("nvidia.com/gpu", f"GPU-1111::{n}") for n in range(4)),
        )
        client.close()
    finally:
        server.stop()


def test_only_the_configured_resources_make_a_pod_governed(socket_dir: Path) -> None:
    kubelet = FakeKubelet(
        [Pod("team-a", "a", A, {"nvidia.com/gpu": ["GPU-1"]}), Pod("team-a", "b", B, {"example.com/fpga-x": ["f0"]})],
        allocatable={"nvidia.com/gpu": ["GPU-1", "GPU-2"], "example.com/fpga-x": ["f0", "f1"]},
    )
    server = KubeletSocket(socket_dir / "kubelet.sock", kubelet).start()
    try:
        node = PodResources(server.socket, ("example.com/fpga-*",)).read()
        assert node == NodeDevices((PodDevices("team-a", "b", (("example.com/fpga-x", "f0"),)),),
                                   (("example.com/fpga-x", "f0"), ("example.com/fpga-x", "f1")))
    finally:
        server.stop()


def test_a_kubelet_without_allocatable_resources_is_read_all_the_same_and_said_once(
    socket_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = KubeletSocket(
        socket_dir / "kubelet.sock", FakeKubelet([Pod("ns", "p", A, {"nvidia.com/gpu": ["GPU-1"]})], allocatable=None)
    ).start()
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
        with pytest.raises(
            KubeletUnavailable, match=rf"the kubelet's PodResources API at {server.socket}: UNAVAILABLE"
        ):
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


def kubelet_messages() -> Any:
    """The kubelet's own ListPodResourcesResponse, with the fields the agent's .proto leaves out (a device's NUMA
    topology, a container's CPU ids and memory), built from a descriptor at run time: what a kubelet sends."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    label, optional, repeated = descriptor_pb2.FieldDescriptorProto, 1, 3
    types = {"string": label.TYPE_STRING, "int64": label.TYPE_INT64, "uint64": label.TYPE_UINT64}
    schema = {
        "NUMANode": [("ID", 1, "int64", optional)],
        "TopologyInfo": [("nodes", 1, ".full.NUMANode", repeated)],
        "ContainerDevices": [("resource_name", 1, "string", optional), ("device_ids", 2, "string", repeated),
                             ("topology", 3, ".full.TopologyInfo", optional)],
        "ContainerMemory": [("memory_type", 1, "string", optional), ("size", 2, "uint64", optional),
                            ("topology", 3, ".full.TopologyInfo", optional)],
        "ContainerResources": [("name", 1, "string", optional), ("devices", 2, ".full.ContainerDevices", repeated),
                               ("cpu_ids", 3, "int64", repeated), ("memory", 4, ".full.ContainerMemory", repeated)],
        "PodResources": [("name", 1, "string", optional), ("namespace", 2, "string", optional),
                         ("containers", 3, ".full.ContainerResources", repeated)],
        "ListPodResourcesResponse": [("pod_resources", 1, ".full.PodResources", repeated)],
    }
    file = descriptor_pb2.FileDescriptorProto(name="kubelet_full.proto", package="full", syntax="proto3")
    for name, fields in schema.items():
        message = file.message_type.add(name=name)
        for field_name, number, kind, cardinality in fields:
            field = message.field.add(name=field_name, number=number, label=cardinality)
            if kind.startswith("."):
                field.type, field.type_name = label.TYPE_MESSAGE, kind
            else:
                field.type = types[kind]
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("full.ListPodResourcesResponse"))


def test_what_the_kubelet_sends_beyond_the_fields_read_is_skipped() -> None:
    from nodeagent.podresources import api_pb2

    full = kubelet_messages()()
    pod = full.pod_resources.add(name="trainer", namespace="team-a")
    container = pod.containers.add(name="main", cpu_ids=[2, 3])
    container.memory.add(memory_type="memory", size=1 << 30).topology.nodes.add(ID=0)
    device = container.devices.add(resource_name="nvidia.com/gpu", device_ids=["GPU-1", "GPU-2"])
    device.topology.nodes.add(ID=1)
    read = api_pb2.ListPodResourcesResponse.FromString(full.SerializeToString())
    (pod_read,) = read.pod_resources
    assert (pod_read.name, pod_read.namespace, pod_read.containers[0].name) == ("trainer", "team-a", "main")
    assert [(d.resource_name, list(d.device_ids)) for d in pod_read.containers[0].devices] == [
        ("nvidia.com/gpu", ["GPU-1", "GPU-2"])
    ]
