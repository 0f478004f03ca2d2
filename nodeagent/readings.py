"""Each governed pod's reading over the interval, from plain data: the devices the kubelet says it holds, what each
device did (`nodeagent.devices`), whose each process is (`nodeagent.pods`). A pod's utilisation is the percent of what
it was allotted that its processes used, capped at its share of each device; what the node cannot tell is unknown,
never idle (docs/operations.md, the node agent).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpusharing.nvml import MIB
from gpusharing.utilisation import PodUtilisation
from nodeagent.devices import DeviceWindow
from nodeagent.kubelet import NodeDevices, PodDevices
from nodeagent.pods import PodKey

REPLICA_SEPARATOR = "::"  # NVIDIA's device plugin names a time-sliced GPU's replicas GPU-uuid::0, GPU-uuid::1, …


def physical_device(device_id: str, uuids: Mapping[str, object]) -> str | None:
    """The NVML device (by UUID) a device plugin's id names: itself, a replica of it (`uuid::N`), or a sharing plugin's
    share of it (`uuid-N`, `uuid-_-N`: the longest UUID the id starts with); None when none does."""
    base = device_id.split(REPLICA_SEPARATOR, 1)[0]
    if base in uuids:
        return base
    prefixes = [uuid for uuid in uuids if base.startswith(uuid) and not base[len(uuid)].isalnum()]
    return max(prefixes, key=len, default=None)


@dataclass(frozen=True)
class Holding:
    """How much of one device a pod holds."""

    share: float  # of the device, in (0, 1]
    alone: bool  # no other pod holds any part of it


def holdings(node: NodeDevices, uuids: Mapping[str, object]) -> dict[PodKey, dict[str, Holding] | None]:
    """What each governed pod holds, by device UUID; None for a pod holding a device no NVML device answers to."""
    resolved = {
        (resource, device_id): physical_device(device_id, uuids)
        for pod in node.pods
        for resource, device_id in pod.devices
    }
    totals: dict[tuple[str, str], int] = {}  # (resource, uuid): how many ids of that resource the device has
    for resource, device_id in node.allocatable if node.allocatable is not None else resolved:
        uuid = resolved.get((resource, device_id)) or physical_device(device_id, uuids)
        if uuid is not None:
            totals[(resource, uuid)] = totals.get((resource, uuid), 0) + 1
    holders: dict[str, set[PodKey]] = {}
    held: dict[PodKey, dict[tuple[str, str], int]] = {}
    unresolved: set[PodKey] = set()
    for pod in node.pods:
        key = (pod.namespace, pod.name)
        counts = held.setdefault(key, {})
        for resource, device_id in set(pod.devices):
            uuid = resolved[(resource, device_id)]
            if uuid is None:
                unresolved.add(key)
                continue
            counts[(resource, uuid)] = counts.get((resource, uuid), 0) + 1
            holders.setdefault(uuid, set()).add(key)
    result: dict[PodKey, dict[str, Holding] | None] = {}
    for key, counts in held.items():
        if key in unresolved:
            result[key] = None
            continue
        shares: dict[str, float] = {}
        # a device's several resources (cores, memory): the largest share
        for (resource, uuid), count in counts.items():
            share = min(1.0, count / max(totals.get((resource, uuid), count), count))
            shares[uuid] = max(shares.get(uuid, 0.0), share)
        result[key] = {uuid: Holding(share, holders[uuid] == {key}) for uuid, share in shares.items()}
    return result


def pod_readings(node: NodeDevices, windows: Mapping[str, DeviceWindow], owners: Mapping[int, str],
                 uids: Mapping[PodKey, str]) -> tuple[PodUtilisation, ...]:
    """The readings of the governed pods whose uid is known (`uids`), given whose each process is (`owners`)."""
    held = holdings(node, windows)
    readings = []
    named: set[str] = set()
    for pod in _unique(node.pods):
        key = (pod.namespace, pod.name)
        uid = uids.get(key)
        if uid is None or uid in named:  # a batch holds each pod once
            continue
        named.add(uid)
        readings.append(PodUtilisation(uid, pod.namespace, pod.name, _utilisation(held[key], windows, owners, uid),
                                       _memory_mib(windows, owners, uid), _model(held[key], windows)))
    return tuple(readings)


def _utilisation(held: dict[str, Holding] | None, windows: Mapping[str, DeviceWindow], owners: Mapping[int, str],
                 uid: str) -> float | None:
    """The percent of what the pod was allotted that its processes used: on each device their samples summed (0 where
    none ran), capped at its share of it. None (unknown, never idle) where a device cannot say: one no NVML device
    answers to, a MIG instance without GPM, a driver without per-process samples on a device others hold too."""
    if not held:
        return None
    used = 0.0
    for uuid, holding in held.items():
        window = windows[uuid]
        if window.busy_by_pid is not None:
            busy: float | None = sum(b for pid, b in window.busy_by_pid.items() if owners.get(pid) == uid)
        else:  # the device's own utilisation is the pod's only where nobody else holds any of it
            busy = window.device_busy if holding.alone else None
        if busy is None:
            return None
        used += min(holding.share * 100.0, busy)
    return round(min(100.0, used / sum(h.share for h in held.values())), 3)


def _model(held: dict[str, Holding] | None, windows: Mapping[str, DeviceWindow]) -> str | None:
    """The model of the GPUs the pod was given, as NVML names it; None where it is not one model, or not said."""
    models = {windows[uuid].model for uuid in held or {}}
    return models.pop() if len(models) == 1 else None


def _memory_mib(windows: Mapping[str, DeviceWindow], owners: Mapping[int, str], uid: str) -> float | None:
    total = 0
    for window in windows.values():
        for pid, used in window.processes:
            if owners.get(pid) == uid:
                if used is None:  # the driver will not say: the pod's total is unknown
                    return None
                total += used
    return round(total / MIB, 3)


def _unique(pods: tuple[PodDevices, ...]) -> list[PodDevices]:
    """One entry per pod (a kubelet lists each once; a batch must hold each at most once, whatever it says)."""
    return list({(pod.namespace, pod.name): pod for pod in pods}.values())
