"""A kubelet's PodResources API as the node agent meets it: a real gRPC server on a unix socket, speaking
`v1.PodResourcesLister` (List, GetAllocatableResources), whose pods and devices a test sets and changes; and a node's
view on disk: the host's /proc with each process's cgroup, the kubelet's pod log directories."""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from nodeagent.podresources import api_pb2, api_pb2_grpc


@dataclass
class Pod:
    namespace: str
    name: str
    uid: str
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource name: device ids (one container)


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    """What the kubelet says; `allocatable` None: a kubelet without GetAllocatableResources (before 1.21)."""

    def __init__(self, pods: list[Pod], allocatable: dict[str, list[str]] | None = None) -> None:
        self.pods = pods
        self.allocatable = allocatable
        self.listings = 0

    def List(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.listings += 1
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    name=pod.name,
                    namespace=pod.namespace,
                    containers=[
                        api_pb2.ContainerResources(
                            name="main",
                            devices=[
                                api_pb2.ContainerDevices(resource_name=r, device_ids=ids)
                                for r, ids in pod.devices.items()
                            ],
                        )
                    ],
                )
                for pod in self.pods
            ]
        )

    def GetAllocatableResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        if self.allocatable is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method GetAllocatableResources")
        return api_pb2.AllocatableResourcesResponse(devices=[
            api_pb2.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in (self.allocatable or {}).items()])


class KubeletSocket:
    """The kubelet's gRPC server on `socket`; `restart()` removes the socket and serves a new one, as a kubelet does."""

    def __init__(self, socket: Path, kubelet: FakeKubelet) -> None:
        self.socket = socket
        self.kubelet = kubelet
        self._server: grpc.Server | None = None

    def start(self) -> "KubeletSocket":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self.kubelet, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)

    def restart(self) -> None:
        self.stop()
        self.start()


def systemd_cgroup(uid: str, qos: str = "burstable") -> str:
    """cgroup v2 under the systemd driver, as /proc/<pid>/cgroup reads it from the host's cgroup namespace."""
    slice_uid = uid.replace("-", "_")
    return f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slice_uid}.slice/cri-containerd-0a1b.scope\n"


def cgroupfs_v1(uid: str) -> str:
    """cgroup v1 under the cgroupfs driver: a line per controller."""
    return "".join(
        f"{n}:{c}:/kubepods/besteffort/pod{uid}/0a1b2c\n"
        for n, c in ((12, "memory"), (11, "cpu,cpuacct"), (1, "name=systemd"))
    )


def guaranteed_from_another_namespace(uid: str) -> str:
    """cgroup v2, systemd driver, a Guaranteed pod (no QoS level in the path), read from a cgroup namespace of its
    own."""
    return f"0::/../../kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-0a1b.scope\n"


def node_view(root: Path, processes: dict[int, str], pods: list[Pod]) -> tuple[Path, Path]:
    """The host's /proc (each pid's cgroup text) and the kubelet's pod log directories, under `root`."""
    proc, logs = root / "proc", root / "pods"
    for pid, cgroups in processes.items():
        (proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc / str(pid) / "cgroup").write_text(cgroups)
    for pod in pods:
        (logs / f"{pod.namespace}_{pod.name}_{pod.uid}" / "main").mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    return proc, logs
