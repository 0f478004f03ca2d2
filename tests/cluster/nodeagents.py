"""A node agent for a simulated GPU node: the real `gpusharing node-agent` process, with all a node gives it made on
disk and served on loopback, so that the cluster tier's node simulator (tests/cluster/nodes.py) can run one per node.

`SimulatedNodeAgent(node, timekeeper_url, token_file, workdir)` makes, under `workdir`:
- the kubelet's PodResources API: a real gRPC server on a unix socket (tests/nodeagent/kubelet.py), which lists the
  pods the simulator says run there, with the devices it gave them;
- the host's /proc (each pod's one GPU process, its cgroup naming the pod's uid) and the kubelet's /var/log/pods
  directories (each pod's uid by its name);
- the GPUs' driver: a trace file the agent's fake NVML (tests/nodeagent/fake_nvml.py) plays, read again whenever a
  pod comes, goes or changes how busy it keeps its GPU.

The simulator calls `run_pod` when it marks a pod Running (with the devices and utilisation it chose: `None` for a
pod whose GPU the node cannot read), `remove_pod` when the pod is gone, and gives the agent a token file it keeps
current (a TokenRequest for the agent's ServiceAccount, audience gpusharing-timekeeper, bound to the agent's pod).
Each agent then posts its node's batch to `timekeeper_url` every `interval` seconds, as a DaemonSet's pod would:

    agent = SimulatedNodeAgent("gpu-node-1", system.timekeeper_url, token_file, tmp_path / "gpu-node-1").start()
    agent.run_pod("team-a", "trainer-0", uid, {"nvidia.com/gpu": [agent.gpu(0)]}, utilisation=0.0)
    ...
    agent.stop()
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.nodeagent.fake_nvml import MIB, TRACE_ENV, write_trace
from tests.nodeagent.kubelet import FakeKubelet, KubeletSocket, Pod, systemd_cgroup

ROOT = Path(__file__).resolve().parents[2]  # the agent imports the tests' fake driver from here
GPUS_PER_NODE = 8
FIRST_PID = 10_000
STOP_SECONDS = 10


@dataclass
class _Placed:
    pod: Pod
    pid: int
    utilisation: float | None
    memory_mib: float


class SimulatedNodeAgent:
    """One simulated node's node agent: its kubelet socket, /proc, pod log directories and GPU trace, and the agent
    process reading them. `allocatable`: every device the node's plugins advertise (resource: ids), as the kubelet's
    GetAllocatableResources lists them; None for a kubelet without it (each replica a pod holds then counts whole)."""

    def __init__(
        self,
        node: str,
        timekeeper_url: str,
        token_file: Path,
        workdir: Path,
        interval: float = 1.0,
        gpus: int = GPUS_PER_NODE,
        allocatable: dict[str, list[str]] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.node = node
        self.timekeeper_url = timekeeper_url
        self.token_file = token_file
        self.workdir = workdir
        self.interval = interval
        self.uuids = [
            f"GPU-{hashlib.sha1(f'{node}/{i}'.encode()).hexdigest()[:8]}-0000-4000-8000-{i:012d}" for i in range(gpus)
        ]
        self.proc, self.logs, self.trace = workdir / "proc", workdir / "pods", workdir / "nvml-trace.json"
        self.proc.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        # A unix socket's path holds at most 107 bytes: the socket lives in a short directory of its own.
        self._socket_dir = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))
        self.kubelet = KubeletSocket(self._socket_dir / "kubelet.sock", FakeKubelet([], allocatable))
        self.extra_env = env or {}
        self.log_file = workdir / "node-agent.log"
        self._placed: dict[str, _Placed] = {}
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None

    def gpu(self, index: int, replica: int | None = None) -> str:
        """The device id a device plugin gives for GPU `index` (of a time-sliced GPU: its replica `replica`)."""
        return self.uuids[index] if replica is None else f"{self.uuids[index]}::{replica}"

    def start(self) -> "SimulatedNodeAgent":
        self._write_trace()
        self.kubelet.start()
        env = {
            **os.environ,
            "GPUSHARING_NODE_AGENT_NODE_NAME": self.node,
            "GPUSHARING_NODE_AGENT_TIMEKEEPER_URL": self.timekeeper_url,
            "GPUSHARING_NODE_AGENT_TOKEN_PATH": str(self.token_file),
            "GPUSHARING_NODE_AGENT_INTERVAL_SECONDS": str(self.interval),
            "GPUSHARING_NODE_AGENT_PODRESOURCES_SOCKET": str(self.kubelet.socket),
            "GPUSHARING_NODE_AGENT_PROC_ROOT": str(self.proc),
            "GPUSHARING_NODE_AGENT_POD_LOGS": str(self.logs),
            "GPUSHARING_NODE_AGENT_NVML": "tests.nodeagent.fake_nvml:open_nvml",
            TRACE_ENV: str(self.trace),
            **self.extra_env,
        }
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen([sys.executable, "-m", "gpusharing.cli", "node-agent"], env=env, cwd=ROOT,
                                             stdout=log, stderr=subprocess.STDOUT)
        return self

    def run_pod(self, namespace: str, name: str, uid: str, devices: dict[str, list[str]], utilisation: float | None,
                memory_mib: float = 1024.0) -> None:
        """A pod the node now runs, holding `devices` (resource: device ids, e.g. `gpu(0)` or `gpu(0, replica=2)`),
        its one GPU process keeping the first of them `utilisation` percent busy (None: its driver can say nothing of
        that GPU, which makes every pod on it unknown)."""
        with self._lock:
            pid = FIRST_PID + len(self._placed) if uid not in self._placed else self._placed[uid].pid
            while any(p.pid == pid for u, p in self._placed.items() if u != uid):
                pid += 1
            self._placed[uid] = _Placed(Pod(namespace, name, uid, devices), pid, utilisation, memory_mib)
            (self.proc / str(pid)).mkdir(exist_ok=True)
            (self.proc / str(pid) / "cgroup").write_text(systemd_cgroup(uid))
            (self.logs / f"{namespace}_{name}_{uid}" / "main").mkdir(parents=True, exist_ok=True)
            self._publish()

    def set_utilisation(self, uid: str, utilisation: float | None) -> None:
        """How busy a running pod keeps its GPU from now on."""
        with self._lock:
            self._placed[uid].utilisation = utilisation
            self._publish()

    def remove_pod(self, uid: str) -> None:
        """A pod the node no longer runs: gone from the kubelet's listing, its process and log directory with it."""
        with self._lock:
            placed = self._placed.pop(uid, None)
            if placed is None:
                return
            shutil.rmtree(self.proc / str(placed.pid), ignore_errors=True)
            shutil.rmtree(self.logs / f"{placed.pod.namespace}_{placed.pod.name}_{uid}", ignore_errors=True)
            self._publish()

    def stop(self) -> int | None:
        """SIGTERM to the agent, as the kubelet sends it; its exit code (None if it had to be killed)."""
        code = None
        if self._process is not None:
            self._process.send_signal(signal.SIGTERM)
            try:
                code = self._process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        self.kubelet.stop()
        shutil.rmtree(self._socket_dir, ignore_errors=True)
        return code

    def _publish(self) -> None:
        self.kubelet.kubelet.pods = [p.pod for p in self._placed.values()]
        self._write_trace()

    def _write_trace(self) -> None:
        gpus: list[dict[str, Any]] = []
        for uuid in self.uuids:
            on_it = [p for p in self._placed.values() if _first_device(p.pod).startswith(uuid)]
            gpu: dict[str, Any] = {
                "uuid": uuid,
                "processes": {str(p.pid): int(p.memory_mib * MIB) for p in on_it},
                "busy": {str(p.pid): round(p.utilisation) for p in on_it if p.utilisation is not None},
            }
            if any(p.utilisation is None for p in on_it):  # a driver that can say nothing of this GPU
                gpu.update(perProcess=False, utilisation=None)
            gpus.append(gpu)
        write_trace(self.trace, gpus)


def _first_device(pod: Pod) -> str:
    return next((ids[0] for ids in pod.devices.values() if ids), "")
