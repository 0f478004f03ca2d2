"""What the kubelet says of the node's devices, through its PodResources API (gRPC on a unix socket): which GPU
devices each pod's containers hold, and which the node has.

The kubelet re-creates its socket when it restarts; a channel that failed is dropped and the next listing dials
afresh on a subchannel of its own, so the agent follows a restarted kubelet within one interval (gRPC's own
reconnection backs off for minutes). A call on a connection the restart broke is tried once more on a new one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from nodeagent.config import governs
from nodeagent.podresources import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

CALL_TIMEOUT_SECONDS = 10.0
# The kubelet's own limit on a PodResources answer (podresources.DefaultMaxMsgSize): a node's listing is bounded by it.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class KubeletUnavailable(Exception):
    """The PodResources API did not answer: the message says why and where."""


@dataclass(frozen=True)
class PodDevices:
    """The GPU devices one pod's containers hold, by resource, as the device plugins name them."""

    namespace: str
    name: str
    devices: tuple[tuple[str, str], ...]  # (resource name, device id), every container's


@dataclass(frozen=True)
class NodeDevices:
    """What the kubelet says of the node: the governed pods' devices, and every device it has."""

    pods: tuple[PodDevices, ...]  # the governed pods: those holding a device of a governed resource
    # (resource name, device id) of every device the node has; None: not said
    allocatable: tuple[tuple[str, str], ...] | None


class PodResources:
    """A client of the kubelet's PodResourcesLister at `socket`."""

    def __init__(self, socket: Path, resources: tuple[str, ...]) -> None:
        self.socket = socket
        self.resources = resources
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._allocatable_unsupported = False
        self._connected = False  # whether the current channel has answered once

    def read(self) -> NodeDevices:
        """The node's governed pods and devices; KubeletUnavailable when the kubelet does not answer."""
        answered_before = self._connected
        try:
            listing, allocatable = self._list()
        except grpc.RpcError as exc:
            # A connection to a kubelet that has since restarted fails its first call: dial its new socket at once.
            if exc.code() != grpc.StatusCode.UNAVAILABLE or not answered_before:
                raise self._unavailable(exc) from None
            self.close()
            try:
                listing, allocatable = self._list()
            except grpc.RpcError as again:
                raise self._unavailable(again) from None
        pods = []
        for pod in listing.pod_resources:
            held = tuple(self._governed(device for container in pod.containers for device in container.devices))
            if held:
                pods.append(PodDevices(pod.namespace, pod.name, held))
        return NodeDevices(tuple(pods), allocatable)

    def _unavailable(self, exc: grpc.RpcError) -> KubeletUnavailable:
        self.close()  # dial afresh next time: the kubelet may have re-created its socket
        return KubeletUnavailable(f"the kubelet's PodResources API at {self.socket}: {_describe(exc)}")

    def _list(self) -> tuple[Any, tuple[tuple[str, str], ...] | None]:
        stub = self._connect()
        listing = stub.List(api_pb2.ListPodResourcesRequest(), timeout=CALL_TIMEOUT_SECONDS)
        allocatable = self._allocatable(stub)
        self._connected = True
        return listing, allocatable

    def _allocatable(self, stub: Any) -> tuple[tuple[str, str], ...] | None:
        """Every governed device of the node (GetAllocatableResources, GA since Kubernetes 1.28); None before it."""
        if self._allocatable_unsupported:
            return None
        try:
            answer = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=CALL_TIMEOUT_SECONDS)
        except grpc.RpcError as exc:
            # UNKNOWN: its feature gate off
            if exc.code() not in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNKNOWN):
                raise
            log.info("the kubelet does not list the node's allocatable devices (%s): a time-sliced GPU's replicas are "
                     "counted from the pods that hold them", _describe(exc))
            self._allocatable_unsupported = True
            return None
        return tuple(self._governed(answer.devices))

    def _governed(self, devices: Iterable[Any]) -> Iterable[tuple[str, str]]:
        for device in devices:
            if governs(device.resource_name, self.resources):
                yield from ((device.resource_name, device_id) for device_id in device.device_ids)

    def _connect(self) -> Any:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket}", options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.enable_retries", 0),  # the agent's loop is the retry: one try per interval
                # a subchannel of its own: one shared from the process's pool may still be backing off after a failure
                ("grpc.use_local_subchannel_pool", 1),
            ])
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel, self._stub, self._connected = None, None, False


def _describe(exc: grpc.RpcError) -> str:
    code, details = exc.code(), exc.details()  # every RpcError a call raises is also a grpc.Call
    return f"{code.name if code else 'no status'}: {details or 'no details'}"
