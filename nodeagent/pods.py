"""Whose a GPU process is, and which uid a pod the kubelet names by namespace and name has, read on the node.

NVML names processes by the host's PIDs; /proc/<pid>/cgroup (the host's /proc) names the pod uid in its path
(`gpusharing.nvml.pod_uid_in_cgroup`). The PodResources API names pods by namespace and name only; the kubelet writes
each pod's logs under `/var/log/pods/<namespace>_<name>_<uid>/`, whose directory names give the uid (neither a
namespace, nor a pod name, nor a uid holds an underscore). The agent lists those names and reads no log.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from gpusharing.names import NAMESPACE, POD_NAME, UID, InvalidName
from gpusharing.nvml import cgroup_of, pod_uid_in_cgroup

log = logging.getLogger(__name__)

PodKey = tuple[str, str]  # (namespace, name)


def pods_of_processes(proc: Path, pids: Iterable[int]) -> dict[int, str]:
    """The pod uid of each process that belongs to a pod (others, the host's or gone, are left out)."""
    owners = {}
    for pid in set(pids):
        cgroups = cgroup_of(proc, str(pid))
        uid = pod_uid_in_cgroup(cgroups) if cgroups is not None else None
        if uid is not None:
            owners[pid] = uid
    return owners


def pod_uids(pod_logs: Path, running: set[str]) -> dict[PodKey, str]:
    """Each pod's uid by namespace and name, from the kubelet's log directories. Where a pod was deleted and created
    again under the same name (a StatefulSet's) and the old directory is still there, the uid with processes on a GPU
    (`running`) wins, else the newest directory."""
    candidates: dict[PodKey, list[tuple[bool, float, str]]] = {}
    try:
        entries = list(os.scandir(pod_logs))
    except OSError as exc:
        log.warning("cannot list the kubelet's pod log directories at %s (%s): no pod can be named by uid", pod_logs,
                    exc.strerror or exc)
        return {}
    for entry in entries:
        parts = entry.name.split("_")
        if len(parts) != 3:
            continue
        try:
            namespace, name, uid = (
                NAMESPACE.check(parts[0], "namespace"),
                POD_NAME.check(parts[1], "pod"),
                UID.check(parts[2], "uid"),
            )
            modified = entry.stat().st_mtime
        except (InvalidName, OSError):  # not the kubelet's, or gone meanwhile
            continue
        candidates.setdefault((namespace, name), []).append((uid in running, modified, uid))
    return {key: max(found)[2] for key, found in candidates.items()}
