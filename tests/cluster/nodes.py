"""Simulated GPU nodes, in the spirit of KWOK: Node objects the real kube-scheduler binds pods to, and their kubelet.

The simulator creates Nodes with the extended resources of one GPU dialect each, renews their Leases, and plays the
kubelet for the pods bound to them: a bound pod is marked Running as a kubelet reports it (startTime, every
container running since `startedAt`, Ready; `cluster.gpusharing.io/records-start-after` seconds after its containers
and its meter started, for a kubelet slow to write it; startTime and `startedAt` written as
`cluster.gpusharing.io/started-before` seconds before the time of writing, for a pod that has run since before the
test, e.g. since before midnight); a pod annotated with `cluster.gpusharing.io/runs-for`
(seconds) finishes after that long (containers terminated with exit code 0, phase Succeeded); a pod given a
deletionTimestamp (deleted, evicted, preempted) has its meter stopped with SIGTERM and, once its containers have
stopped (after `cluster.gpusharing.io/stops-after` seconds, for a workload slow to stop), their ends recorded in its
status (exit code 143, phase Failed) and is removed, as a kubelet removes it (the API server keeps it until the
timekeeper has closed its bill and released its billing finalizer).

Meters (the simulator's `meters`, or a pod's `cluster.gpusharing.io/meter` annotation): with "process" each pod's
injected meter runs as a real `gpusharing meter` process with the environment the webhook gave its container and a token
bound to the pod (TokenRequest, the timekeeper's audience), so that its reports are the evidence beside the API server's
record that the timekeeper bills from; with "simulated" one thread reports for every running pod (a cumulative every
interval, a final one on stop), as thousands of processes would on a 2-core machine cost more than the cluster they
measure; with "none" nothing reports. A simulated meter reads no GPU utilisation, unless its pod is annotated with
`cluster.gpusharing.io/utilisation` (a percent): then each of its reports says that its GPU was that busy
(`gpuUtilizationPercent`; "0": an idle GPU).

Node agents (`run_node_agent`): the real `gpusharing node-agent` of a node (tests/cluster/nodeagents.py), presenting the
projected token of an agent pod bound to that node; this kubelet gives each GPU pod it starts there a GPU of its own in
the node's PodResources listing and GPU trace, kept as busy as its `cluster.gpusharing.io/node-utilisation` annotation
says (a percent; without it the node's driver can say nothing of that GPU: the pod's reading is unknown).
"""

from __future__ import annotations

import datetime as dt
import heapq
import itertools
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from gpusharing.contract import ANNOTATION_GPU_SHARE, TIMEKEEPER_TOKEN_AUDIENCE, MeterEnv
from tests.cluster.nodeagents import SimulatedNodeAgent
from tests.e2e.controlplane import ControlPlane

log = logging.getLogger(__name__)

RUNS_FOR = "cluster.gpusharing.io/runs-for"  # seconds a simulated workload runs before it succeeds
STOPS_AFTER = "cluster.gpusharing.io/stops-after"  # seconds a workload takes to stop after SIGTERM (a checkpoint)
METER = "cluster.gpusharing.io/meter"  # how the pod's meter runs: process, simulated or none (else the simulator's own)
METER_MODES = ("process", "simulated", "none")
UTILISATION = "cluster.gpusharing.io/utilisation"  # the GPU utilisation (percent) a simulated meter reports
# how busy (percent) the node's GPU trace keeps the pod's GPU
NODE_UTILISATION = "cluster.gpusharing.io/node-utilisation"
# seconds the kubelet takes to record a pod's start (startTime, Running) after its containers and its meter started
RECORDS_START_AFTER = "cluster.gpusharing.io/records-start-after"
# seconds before now that the kubelet records a pod's start (startTime, its containers' startedAt) as having been
STARTED_BEFORE = "cluster.gpusharing.io/started-before"
POOL_LABEL = "cluster.gpusharing.io/pool"
NODE_LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
RENEW_SECONDS = 20
METER_STOP_SECONDS = 10  # a meter gets this long after SIGTERM, as a container gets its grace period
GPUS_PER_NODE = 8
REPORTERS = 8  # simulated meters' reports under way at once


def advertised(dialect: str, memory_mib: int, gpus: int = GPUS_PER_NODE) -> dict[str, str]:
    """The extended resources `dialect`'s device plugin advertises for a node of `gpus` devices of `memory_mib` MiB
    each: HAMi's vGPU slots (10 a device), its gpumem in MiB and gpucores; gpu-manager's vcuda-memory in 256 MiB units;
    gpushare's aliyun.com/gpu-mem in whole GiB."""
    return {
        "hami": {"nvidia.com/gpu": str(gpus * 10), "nvidia.com/gpumem": str(gpus * memory_mib),
                 "nvidia.com/gpucores": str(gpus * 100)},
        "whole": {"nvidia.com/gpu": str(gpus)},
        "vcuda": {"tencent.com/vcuda-core": str(gpus * 100), "tencent.com/vcuda-memory": str(gpus * memory_mib // 256)},
        "aliyun": {"aliyun.com/gpu-mem": str(gpus * (memory_mib // 1024)), "aliyun.com/gpu-count": str(gpus)},
    }[dialect]


def mig_slices(profile: str, per_gpu: int, gpus: int = GPUS_PER_NODE) -> dict[str, str]:
    """What the NVIDIA device plugin advertises (its `mixed` MIG strategy) for a node whose `gpus` devices are each cut
    into `per_gpu` slices of `profile` (e.g. "3g.71gb")."""
    return {f"nvidia.com/mig-{profile}": str(gpus * per_gpu)}


# The extended resources each dialect's device plugin advertises, for a node of GPUS_PER_NODE devices of 80 GiB.
DIALECTS: dict[str, dict[str, str]] = {dialect: advertised(dialect, 81920) for dialect in ("hami", "whole", "vcuda",
                                                                                            "aliyun")}


def now_rfc3339(before: float = 0.0) -> str:
    """Now (`before` seconds ago), in whole seconds, as the API server records a time."""
    return (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=before)).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class RunningPod:
    """What the simulated kubelet knows of a pod it runs."""

    namespace: str
    name: str
    uid: str
    node: str
    share: float | None  # the webhook's billed share; None: no meter (not a GPU pod)
    meter_mode: str = "none"
    started: float = field(default_factory=time.time)  # when its containers (and its meter) started
    recorded_start: str = ""  # its status.startTime, as this kubelet wrote it
    recorded_end: str = ""  # its containers' finishedAt, as this kubelet wrote it ("" while they run)
    stopped: float | None = None  # when its meter was told to stop
    exited: float | None = None  # when its meter process had exited
    priority_class: str = ""  # as admitted
    meter: subprocess.Popen[bytes] | None = None
    home: Path | None = None  # a process meter's directory: its token, its state volume, its log
    token: str = ""
    seq: int = 0
    utilisation: float | None = None  # what its simulated meter reports as gpuUtilizationPercent (None: no reading)
    node_utilisation: float | None = None  # what its node's GPU trace plays for it (None: a GPU the node cannot read)


class NodeSimulator:
    def __init__(self, plane: ControlPlane, directory: Path, meters: str = "none", timekeeper_url: str = "",
                 meter_interval: float = 1.0, workers: int = 8):
        assert meters in METER_MODES
        self.plane = plane
        self.directory = directory
        self.meters = meters
        self.timekeeper_url = timekeeper_url
        self.meter_interval = meter_interval
        self.nodes: dict[str, str] = {}  # name -> pool
        self.pods: dict[str, RunningPod] = {}  # by uid: every pod this kubelet started
        self.finished: dict[str, RunningPod] = {}  # by uid: pods whose containers stopped
        self.agents: dict[str, SimulatedNodeAgent] = {}  # by node: its node agent, where one runs
        self._gpus_given: dict[str, itertools.count[int]] = {}  # by node: the next GPU its agent's listing gives a pod
        self._stopping: set[str] = set()  # uids of pods being deleted
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_ids = itertools.count()
        self._timer_changed = threading.Condition()
        self._stop = threading.Event()
        self._local = threading.local()
        self._threads = [
            threading.Thread(target=self._watch_pods, name="sim-watch", daemon=True),
            threading.Thread(target=self._run_timers, name="sim-timers", daemon=True),
            *(threading.Thread(target=self._work, name=f"sim-kubelet-{i}", daemon=True) for i in range(workers)),
        ]
        self._threads.append(threading.Thread(target=self._report_loop, name="sim-meters", daemon=True))

    # --- the API server -------------------------------------------------------------------------------------------

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = self.plane.admin_session()
        return session

    def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
              ok: tuple[int, ...] = ()) -> dict[str, Any] | None:
        response = self._session().request(
            method,
            f"{self.plane.url}{path}",
            data=None if body is None else json.dumps(body),
            headers={"Content-Type": content_type},
            timeout=30,
        )
        if response.status_code in ok:
            return None
        if response.status_code >= 300:
            raise RuntimeError(f"{method} {path}: HTTP {response.status_code} {response.text[:300]}")
        return dict(response.json())

    # --- nodes ----------------------------------------------------------------------------------------------------

    def add_pool(self, pool: str, count: int, dialect: str, pods_per_node: int = 110,
                 labels: Mapping[str, str] | None = None, resources: Mapping[str, str] | None = None) -> list[str]:
        """`count` Ready Nodes advertising `dialect`'s GPU resources (`resources` instead, when given: `advertised`,
        `mig_slices`), labelled with their pool and `labels` (e.g. GPU feature discovery's nvidia.com/gpu.product);
        their names."""
        names = []
        for index in range(count):
            name = f"sim-{pool}-{index:04d}"
            capacity = {
                "cpu": "64",
                "memory": "512Gi",
                "pods": str(pods_per_node),
                "ephemeral-storage": "1Ti",
                **(DIALECTS[dialect] if resources is None else resources),
            }
            node = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {**(labels or {}), POOL_LABEL: pool,
                                                          "kubernetes.io/hostname": name,
                                                          "cluster.gpusharing.io/dialect": dialect}}}
            self._call("POST", "/api/v1/nodes", node)
            address = f"10.{200 + len(self.nodes) // 65536 % 50}.{len(self.nodes) // 256 % 256}.{len(self.nodes) % 256}"
            status = {"status": {
                "capacity": capacity, "allocatable": capacity,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "simulated",
                                "lastHeartbeatTime": now_rfc3339(), "lastTransitionTime": now_rfc3339()}],
                "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
                "nodeInfo": {"kubeletVersion": "v1.36.2-sim", "kubeProxyVersion": "", "architecture": "amd64",
                             "operatingSystem": "linux", "containerRuntimeVersion": "sim://1", "kernelVersion": "",
                             "osImage": "simulated", "machineID": name, "systemUUID": name, "bootID": name},
            }}
            self._call("PATCH", f"/api/v1/nodes/{name}/status", status, "application/strategic-merge-patch+json")
            # The TaintNodesByCondition admission plugin taints a new Node not-ready; the node lifecycle controller,
            # which would lift it once the Node reports Ready, does not run here.
            self._call("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}}, "application/merge-patch+json")
            self._renew_lease(name)
            with self._lock:
                self.nodes[name] = pool
            names.append(name)
        return names

    def _renew_lease(self, node: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases/{node}"
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        patch = {"spec": {"holderIdentity": node, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now}}
        if self._call("PATCH", path, patch, "application/merge-patch+json", ok=(404,)) is None:
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": node}, **patch}
            self._call(
                "POST", f"/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases", lease, ok=(409,)
            )

    def _renew_leases(self) -> None:
        with self._lock:
            nodes = list(self.nodes)
        for node in nodes:
            if self._stop.is_set():
                return
            try:
                self._renew_lease(node)
            except (RuntimeError, requests.RequestException) as exc:
                log.warning("lease of %s not renewed: %s", node, exc)
        self._at(time.monotonic() + RENEW_SECONDS, self._renew_leases)

    # --- the kubelet ----------------------------------------------------------------------------------------------

    def start(self) -> "NodeSimulator":
        for thread in self._threads:
            thread.start()
        self._at(time.monotonic() + RENEW_SECONDS, self._renew_leases)
        return self

    def stop(self) -> None:
        self._stop.set()
        for _ in self._threads:
            self._queue.put(None)
        with self._timer_changed:
            self._timer_changed.notify_all()
        for agent in list(self.agents.values()):
            agent.stop()
        with self._lock:
            meters = [p.meter for p in self.pods.values() if p.meter is not None and p.meter.poll() is None]
        for meter in meters:
            meter.kill()
            meter.wait()

    def _watch_pods(self) -> None:
        """LIST then WATCH every pod; hands those on simulated nodes to the kubelet's workers."""
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    listed = self._call("GET", "/api/v1/pods")
                    assert listed is not None
                    for pod in listed["items"]:
                        self._consider(pod)
                    version = listed["metadata"]["resourceVersion"]
                for event in self._events(version):
                    if event["type"] == "ERROR":  # 410 Gone: list again
                        version = ""
                        break
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._consider(event["object"])
            except (requests.RequestException, RuntimeError, ValueError) as exc:
                if not self._stop.is_set():
                    log.warning("pod watch broke (%s); watching again", exc)
                    time.sleep(0.5)

    def _events(self, version: str) -> Iterator[dict[str, Any]]:
        query = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true", "timeoutSeconds": "300"}
        with self._session().get(
            f"{self.plane.url}/api/v1/pods", params=query, stream=True, timeout=(10, 330)
        ) as response:
            for line in response.iter_lines():
                if self._stop.is_set():
                    return
                if line:
                    yield json.loads(line)

    def _consider(self, pod: dict[str, Any]) -> None:
        metadata, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
        if spec.get("nodeName") not in self.nodes:
            return
        if metadata.get("deletionTimestamp"):
            with self._lock:
                if metadata["uid"] in self._stopping:
                    return
                self._stopping.add(metadata["uid"])
            self._queue.put(("kill", pod))
        elif status.get("phase", "Pending") == "Pending" and not status.get("startTime"):
            with self._lock:
                if metadata["uid"] in self.pods:
                    return
                annotations = metadata.get("annotations") or {}
                mode = annotations.get(METER, self.meters)
                utilisation, node_utilisation = annotations.get(UTILISATION), annotations.get(NODE_UTILISATION)
                self.pods[metadata["uid"]] = RunningPod(
                    metadata["namespace"],
                    metadata["name"],
                    metadata["uid"],
                    spec["nodeName"],
                    _share(pod),
                    mode if mode in METER_MODES else self.meters,
                    priority_class=spec.get("priorityClassName", ""),
                    utilisation=None if utilisation is None else float(utilisation),
                    node_utilisation=None if node_utilisation is None else float(node_utilisation),
                )
            self._queue.put(("start", pod))

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            action, pod = item
            try:
                actions = {"start": self._start_pod, "record": self._record_start, "kill": self._kill_pod,
                           "finish": self._finish, "remove": self._remove_pod}
                actions[action](pod)
            except Exception:  # one pod's failure must not stop the kubelet
                log.exception("%s of pod %s/%s failed", action, pod["metadata"]["namespace"], pod["metadata"]["name"])

    def _start_pod(self, pod: dict[str, Any]) -> None:
        metadata = pod["metadata"]
        with self._lock:
            running = self.pods[metadata["uid"]]
        if running.share is not None and running.meter_mode != "none":
            running.token = self._pod_token(pod)
            if running.meter_mode == "process":
                running.meter = self._start_meter(pod, running)
        running.started = time.time()
        records_after = float((metadata.get("annotations") or {}).get(RECORDS_START_AFTER, 0))
        if records_after:
            if running.meter_mode == "simulated" and running.token:
                # Its meter's first report, before the slow kubelet records the start, however busy the report loop.
                self._report(running, final=False)
            self._at(time.monotonic() + records_after, lambda: self._queue.put(("record", pod)))
        else:
            self._record_start(pod)

    def _record_start(self, pod: dict[str, Any]) -> None:
        """The kubelet writes that the pod's containers run (startTime, now), unless it was stopped meanwhile."""
        metadata, spec = pod["metadata"], pod["spec"]
        with self._lock:
            running = self.pods[metadata["uid"]]
            if running.uid in self.finished:
                return
        before = float((metadata.get("annotations") or {}).get(STARTED_BEFORE, 0))
        started = running.recorded_start = now_rfc3339(before)
        containers = [_container_status(c, "running", started) for c in spec.get("containers", [])]
        inits = [_container_status(c, "running" if c.get("restartPolicy") == "Always" else "completed", started)
                 for c in spec.get("initContainers", [])]
        status = {"status": {
            "phase": "Running", "startTime": started, "hostIP": "10.200.0.1", "podIP": _pod_ip(metadata["uid"]),
            "conditions": [_condition(kind, "True", started) for kind in
                           ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": containers, **({"initContainerStatuses": inits} if inits else {}),
        }}
        path = f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}/status"
        if self._call("PATCH", path, status, "application/strategic-merge-patch+json", ok=(404,)) is None:
            self._meter_stopped(running)  # deleted before it started
            return
        self._placed_on_node(pod, running)
        runs_for = (metadata.get("annotations") or {}).get(RUNS_FOR)
        if runs_for and spec.get("restartPolicy") in ("Never", "OnFailure"):
            self._at(time.monotonic() + float(runs_for), lambda: self._queue.put(("finish", pod)))

    def _finish(self, pod: dict[str, Any]) -> None:
        """The workload exits 0: its meter gets SIGTERM (native sidecars stop after the main containers), then the pod
        is Succeeded."""
        with self._lock:
            running = self.pods.get(pod["metadata"]["uid"])
            if running is None or running.uid in self.finished:
                return
        self._meter_stopped(running)
        self._terminated(pod, running, "Succeeded", 0)

    def _terminated(self, pod: dict[str, Any], running: RunningPod, phase: str, exit_code: int) -> bool:
        """Records that the pod's containers have stopped, now; False when the pod is gone."""
        metadata, spec = pod["metadata"], pod["spec"]
        finished = running.recorded_end = now_rfc3339()
        if (agent := self.agents.get(running.node)) is not None:
            agent.remove_pod(running.uid)  # gone from the node's PodResources listing and its GPU trace
        started = running.recorded_start
        containers = [
            _container_status(c, "terminated", started, finished, exit_code) for c in spec.get("containers", [])
        ]
        inits = [
            _container_status(c, "terminated", started, finished, exit_code) for c in spec.get("initContainers", [])
        ]
        status = {
            "status": {
                "phase": phase,
                "conditions": [
                    _condition(kind, "False", finished, "PodCompleted") for kind in ("ContainersReady", "Ready")
                ],
                "containerStatuses": containers,
                **({"initContainerStatuses": inits} if inits else {}),
            }
        }
        path = f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}/status"
        return self._call("PATCH", path, status, "application/strategic-merge-patch+json", ok=(404,)) is not None

    def _kill_pod(self, pod: dict[str, Any]) -> None:
        """A pod being deleted: its containers get SIGTERM (the meter sends its final report), then it is removed."""
        metadata = pod["metadata"]
        with self._lock:
            running = self.pods.get(metadata["uid"])
        if running is not None:
            self._meter_stopped(running)
        stops_after = float((metadata.get("annotations") or {}).get(STOPS_AFTER, 0))
        if stops_after:
            self._at(time.monotonic() + stops_after, lambda: self._queue.put(("remove", pod)))
        else:
            self._remove_pod(pod)

    def _remove_pod(self, pod: dict[str, Any]) -> None:
        """Its containers have stopped (SIGTERM: 143) and it goes, as a kubelet ends a deleted pod."""
        metadata = pod["metadata"]
        with self._lock:
            running = self.pods.get(metadata["uid"])
        if running is not None and running.recorded_start and not running.recorded_end:
            if not self._terminated(pod, running, "Failed", 143):
                return
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": metadata["uid"]},
        }
        self._call("DELETE", f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}", body, ok=(404, 409))

    # --- node agents ----------------------------------------------------------------------------------------------

    def run_node_agent(self, node: str, namespace: str, account: str, interval: float) -> SimulatedNodeAgent:
        """The node agent of `node`, as a DaemonSet runs it: a pod of ServiceAccount `account` (in `namespace`) bound to
        the node, whose projected token (a TokenRequest bound to that pod) the agent presents to the timekeeper."""
        container = {
            "name": "agent",
            "image": "gpusharing:cluster",
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        }
        manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"node-agent-{node}"},
                    "spec": {"nodeName": node, "serviceAccountName": account, "containers": [container]}}
        agent_pod = self._call("POST", f"/api/v1/namespaces/{namespace}/pods", manifest)
        assert agent_pod is not None
        home = self.directory / "agents" / node
        home.mkdir(parents=True)
        (home / "token").write_text(self._pod_token(agent_pod))
        agent = SimulatedNodeAgent(node, self.timekeeper_url, home / "token", home, interval).start()
        with self._lock:
            self.agents[node] = agent
            self._gpus_given[node] = itertools.count()
        return agent

    def _placed_on_node(self, pod: dict[str, Any], running: RunningPod) -> None:
        """A GPU pod started on a node with an agent: listed by the node's kubelet with a GPU of its own (the first
        resource it asks for), which the node's GPU trace keeps as busy as the pod's annotation says."""
        agent = self.agents.get(running.node)
        limits: dict[str, Any] = next(
            (c["resources"]["limits"] for c in pod["spec"]["containers"] if c.get("resources", {}).get("limits")), {}
        )
        if agent is None or running.share is None or not limits:
            return
        with self._lock:
            gpu = next(self._gpus_given[running.node]) % len(agent.uuids)
        agent.run_pod(
            running.namespace,
            running.name,
            running.uid,
            {next(iter(limits)): [agent.gpu(gpu)]},
            running.node_utilisation,
        )

    # --- meters ---------------------------------------------------------------------------------------------------

    def _pod_token(self, pod: dict[str, Any]) -> str:
        metadata, spec = pod["metadata"], pod["spec"]
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
            "audiences": [TIMEKEEPER_TOKEN_AUDIENCE], "expirationSeconds": 3600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": metadata["name"], "uid": metadata["uid"]}}}
        account = spec.get("serviceAccountName", "default")
        path = f"/api/v1/namespaces/{metadata['namespace']}/serviceaccounts/{account}/token"
        answer = self._call("POST", path, request)
        assert answer is not None
        return str(answer["status"]["token"])

    def _start_meter(self, pod: dict[str, Any], running: RunningPod) -> subprocess.Popen[bytes]:
        """The pod's injected meter as a real process: its container's environment, the downward API resolved, the
        token projected into a file, the state volume a directory of its own."""
        meter = next(
            c
            for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]
            if c["name"] == "gpusharing-meter"
        )
        home = running.home = self.directory / "meters" / running.uid
        home.mkdir(parents=True)
        (home / "token").write_text(running.token)
        fields = {"metadata.namespace": running.namespace, "metadata.name": running.name, "metadata.uid": running.uid}
        env = {
            e["name"]: e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
            for e in meter["env"]
        }
        env.update({MeterEnv.TOKEN_PATH: str(home / "token"), MeterEnv.STATE_DIR: str(home / "state"),
                    MeterEnv.TIMEKEEPER_URL: self.timekeeper_url, MeterEnv.INTERVAL: str(self.meter_interval),
                    "GPUSHARING_METER_GPU_READER": "tests.cluster.nodes:no_gpu",
                    "PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        log_file = (home / "meter.log").open("wb")
        return subprocess.Popen(
            [sys.executable, "-m", "gpusharing.cli", "meter"], env=env, stdout=log_file, stderr=subprocess.STDOUT
        )

    def _meter_stopped(self, running: RunningPod) -> None:
        """SIGTERM to the pod's meter, waited for as the kubelet waits out the grace period; once per pod."""
        with self._lock:
            if running.uid in self.finished:
                return
            self.finished[running.uid] = running
            running.stopped = time.time()
        if running.meter is not None and running.meter.poll() is None:
            running.meter.send_signal(signal.SIGTERM)
            try:
                running.meter.wait(METER_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                running.meter.kill()
                running.meter.wait()
            running.exited = time.time()
        elif running.meter_mode == "simulated" and running.share is not None and running.token:
            self._report(running, final=True)

    @staticmethod
    def recorded_gpu_seconds(running: RunningPod) -> float:
        """What the API server's record of the pod bills: its share x the time from its start to its containers' end, as
        this kubelet wrote them (second by second, as a kubelet writes them); nothing when it never started."""
        if not running.recorded_start or not running.share:
            return 0.0
        assert running.recorded_end, f"{running.name} still runs"
        start, end = (
            dt.datetime.fromisoformat(t.replace("Z", "+00:00")) for t in (running.recorded_start, running.recorded_end)
        )
        return running.share * (end - start).total_seconds()

    def _report_loop(self) -> None:
        """Simulated meters: every running GPU pod reports its cumulative each interval, REPORTERS at a time (one after
        another, thousands of reports outlast the interval, and the timekeeper rightly calls the meters silent)."""
        def report(running: RunningPod) -> None:
            if not self._stop.is_set():
                self._report(running, final=False)

        with ThreadPoolExecutor(REPORTERS, thread_name_prefix="sim-meter") as reporters:
            while not self._stop.wait(self.meter_interval):
                with self._lock:
                    due = [
                        p
                        for uid, p in self.pods.items()
                        if uid not in self.finished and p.token and p.meter_mode == "simulated"
                    ]
                list(reporters.map(report, due))

    def _report(self, running: RunningPod, final: bool) -> None:
        with self._lock:
            running.seq += 1
            seq = running.seq
        elapsed = (running.stopped or time.time()) - running.started
        body = {"podUid": running.uid, "namespace": running.namespace, "pod": running.name, "gpuShare": running.share,
                "seq": seq, "gpuSeconds": round((running.share or 0) * elapsed, 3), "final": final}
        if running.utilisation is not None:
            body["gpuUtilizationPercent"] = running.utilisation
        reports = getattr(self._local, "reports", None)
        if reports is None:
            reports = self._local.reports = requests.Session()
            reports.trust_env = False
        try:
            reports.post(f"{self.timekeeper_url}/api/v1/reports", json=body, timeout=10,
                         headers={"Authorization": f"Bearer {running.token}"})
        except requests.RequestException as exc:
            log.warning("simulated report of %s/%s not delivered: %s", running.namespace, running.name, exc)

    # --- timers ---------------------------------------------------------------------------------------------------

    def _at(self, when: float, action: Callable[[], None]) -> None:
        with self._timer_changed:
            heapq.heappush(self._timers, (when, next(self._timer_ids), action))
            self._timer_changed.notify()

    def _run_timers(self) -> None:
        while not self._stop.is_set():
            with self._timer_changed:
                while not self._stop.is_set() and (not self._timers or self._timers[0][0] > time.monotonic()):
                    self._timer_changed.wait(self._timers[0][0] - time.monotonic() if self._timers else None)
                if self._stop.is_set():
                    return
                _, _, action = heapq.heappop(self._timers)
            try:
                action()
            except Exception:
                log.exception("a simulated kubelet's timer failed")


def no_gpu(pod_uid: str) -> None:
    """The meters' GPU reader here: no device to read (GPUSHARING_METER_GPU_READER)."""
    return None


def _share(pod: dict[str, Any]) -> float | None:
    raw = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_GPU_SHARE)
    return float(raw) if raw is not None else None


def _pod_ip(uid: str) -> str:
    digest = int(uid.replace("-", "")[:6], 16)
    return f"10.{244 + digest // 65536 % 8}.{digest // 256 % 256}.{digest % 256}"


def _condition(kind: str, status: str, when: str, reason: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "lastTransitionTime": when, **({"reason": reason} if reason else {})}


def _container_status(
    container: dict[str, Any], state: str, started: str, finished: str = "", exit_code: int = 0
) -> dict[str, Any]:
    reason = "Completed" if exit_code == 0 else "Error"
    states = {
        "running": {"running": {"startedAt": started}},
        "completed": {
            "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": started}
        },
        "terminated": {
            "terminated": {"exitCode": exit_code, "reason": reason, "startedAt": started, "finishedAt": finished}
        },
    }
    return {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": f"sim://{container.get('image', '')}",
        "containerID": f"sim://{container['name']}",
        "ready": state == "running",
        "started": state == "running",
        "restartCount": 0,
        "state": states[state],
    }
