"""GPU workloads of each dialect for the simulated nodes, created as teams create them, and what their creation cost."""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster.nodes import POOL_LABEL
from tests.e2e.system import ApiError, GpuSharing

# What one pod of each dialect asks for: a fraction of a device (a whole one where the dialect knows no fraction).
REQUESTS: dict[str, dict[str, int]] = {
    "hami": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000, "nvidia.com/gpucores": 10},
    "whole": {"nvidia.com/gpu": 1},
    "vcuda": {"tencent.com/vcuda-core": 25, "tencent.com/vcuda-memory": 8},
    "aliyun": {"aliyun.com/gpu-mem": 5},
}


def pod_template(
    dialect: str | None,
    pool: str,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    restart: str = "Always",
) -> dict[str, Any]:
    """A pod spec for `pool`'s nodes asking for a GPU in `dialect` (None: no GPU)."""
    container: dict[str, Any] = {"name": "work", "image": "registry.example.com/ml/train:1.0"}
    if dialect is not None:
        container["resources"] = {"limits": dict(REQUESTS[dialect])}
    return {
        "metadata": {"annotations": dict(annotations or {}), "labels": dict(labels or {})},
        "spec": {"restartPolicy": restart, "nodeSelector": {POOL_LABEL: pool}, "containers": [container],
                 "terminationGracePeriodSeconds": 30},
    }


def pod(name: str, template: dict[str, Any]) -> dict[str, Any]:
    manifest = {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(template)}
    manifest["metadata"]["name"] = name
    return manifest


# The API server's words when the webhook did not answer within its timeoutSeconds: a controller tries again.
TIMED_OUT = "context deadline exceeded"
TRIES = 3


@dataclass
class Creations:
    """Pods created by concurrent clients: what was made, what was refused, how long each create took, and the
    creates the webhook did not answer in time (tried again, as a controller tries again)."""

    created: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # the API server's messages
    seconds: list[float] = field(default_factory=list)
    timed_out: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)


def create_all(
    cluster: GpuSharing, namespace: str, manifests: Sequence[dict[str, Any]], clients: int = 16
) -> Creations:
    """Creates the manifests in the namespace from `clients` concurrent clients, as teams' controllers would."""
    return create_across(cluster, [(namespace, manifest) for manifest in manifests], clients)


def create_across(cluster: GpuSharing, manifests: Sequence[tuple[str, dict[str, Any]]], clients: int = 16) -> Creations:
    """Creates each (namespace, manifest) from `clients` concurrent clients."""
    done = Creations()

    def create(item: tuple[str, dict[str, Any]]) -> None:
        namespace, manifest = item
        for attempt in range(1, TRIES + 1):
            started = time.perf_counter()
            try:
                created = cluster.create(namespace, manifest)
            except ApiError as exc:
                with done._lock:
                    if TIMED_OUT not in exc.message or attempt == TRIES:
                        done.refused.append(exc.message)
                        return
                    done.timed_out += 1
                continue
            with done._lock:
                done.seconds.append(time.perf_counter() - started)
                done.created.append(created)
            return

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(create, manifests))
    return done


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def milliseconds(seconds: Sequence[float], fraction: float, baseline: Sequence[float] | None = None) -> str:
    """A percentile of `seconds` in milliseconds, less the same percentile of `baseline` (what admission adds)."""
    value = percentile(seconds, fraction) - (percentile(baseline, fraction) if baseline else 0.0)
    return f"{value * 1000:.0f} ms"


class AdmissionProbe:
    """Creates a GPU pod then one without in `namespace` every `pause` seconds while it runs, each timed: what a GPU
    pod's admission adds to a create while something else (a demotion) loads the cluster. The pods name a pool no
    node has: they stay Pending, found unschedulable once, and cost the nodes nothing."""

    def __init__(self, cluster: GpuSharing, namespace: str, pause: float = 1.0):
        self.cluster, self.namespace, self.pause = cluster, namespace, pause
        self.gpu: list[float] = []
        self.without: list[float] = []
        self.refused: list[str] = []  # the API server's messages
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> AdmissionProbe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        count = 0
        while not self._stop.wait(self.pause):
            count += 1
            for dialect, seconds in (("hami", self.gpu), (None, self.without)):
                manifest = pod(f"probe-{'gpu' if dialect else 'cpu'}-{count}", pod_template(dialect, "no-such-pool"))
                started = time.perf_counter()
                try:
                    self.cluster.create(self.namespace, manifest)
                except ApiError as exc:
                    self.refused.append(exc.message)
                    continue
                seconds.append(time.perf_counter() - started)

    def figures(self) -> str:
        return (f"{len(self.gpu)} GPU pods created p99 {milliseconds(self.gpu, 0.99)}, {len(self.without)} without a "
                f"GPU p99 {milliseconds(self.without, 0.99)} (a GPU pod's admission added p50 "
                f"{milliseconds(self.gpu, 0.5, self.without)}, p99 {milliseconds(self.gpu, 0.99, self.without)}); "
                f"{len(self.refused)} refused{': ' + self.refused[0] if self.refused else ''}")


def delete_namespaces(cluster: GpuSharing, *namespaces: str) -> None:
    """Ends a scenario's workloads (and their meters' reports) for the tests after it: the namespace controller
    deletes their pods, which the simulated kubelet stops."""
    for namespace in namespaces:
        cluster.rest("DELETE", f"/api/v1/namespaces/{namespace}")


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """The CPU time (user and system) a process, or one of its threads, has used so far; 0 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/task/{thread}/stat" if thread else f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # from the third field (state) on: utime and stime are the 14th and 15th
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class CpuUse:
    """What each process used of the CPU between two points: `processes` maps a name to a function returning what
    it has used so far."""

    def __init__(self, processes: Mapping[str, Callable[[], float]]):
        self._processes = processes
        self._start = self._now()

    def _now(self) -> dict[str, float]:
        return {name: used() for name, used in self._processes.items()}

    def since_start(self) -> dict[str, float]:
        now = self._now()
        return {name: now[name] - self._start[name] for name in now}
