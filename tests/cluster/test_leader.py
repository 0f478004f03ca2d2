"""One controller at a time, provably: a demotion pass over 500 pods outlasts the Lease, two timekeeper processes
compete for it, the leader is paused mid-pass until its successor has taken over, and no pod is evicted twice."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.cluster.conftest import LEASE_SECONDS
from tests.cluster.nodes import METER, STOPS_AFTER, NodeSimulator
from tests.cluster.workloads import create_all, delete_namespaces, pod, pod_template
from tests.e2e.system import SYSTEM_NAMESPACE, GpuSharing, wait_for
from timekeeper.cluster.leader import LEASE_NAME

PODS = 500
EVICTED = re.compile(r"evicted pod (\S+)/(\S+): its namespace is over its GPU budget")


@contextmanager
def _between_sqlite_writes(database_url: str) -> Iterator[None]:
    """Holds SQLite's writer lock (timekeeper.database.connection) while the leader is paused: a leader frozen inside
    a write transaction would hold every writer, its successor's too, which is SQLite's one writer, not the Lease
    this test is about. A stopped process waiting for the lock does not take it when it is released."""
    if not database_url.startswith("sqlite:///"):
        yield
        return
    with open(database_url.removeprefix("sqlite:///") + ".writer-lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def evictions(log: Path, namespace: str) -> Counter[str]:
    return Counter(name for ns, name in EVICTED.findall(log.read_text(errors="replace")) if ns == namespace)


def test_a_pass_longer_than_the_lease_evicts_every_pod_once_across_two_controllers(
    cluster: GpuSharing, nodes: NodeSimulator
) -> None:
    cluster.require_controllers()
    nodes.add_pool("leader", 10, "hami")
    namespace = cluster.namespace("cluster-leader")
    # Workloads that take a while to stop once told to (a checkpoint): evicted pods stay, terminating, for the whole
    # pass, where a second eviction of them would succeed again.
    template = pod_template("hami", "leader", {METER: "none", STOPS_AFTER: "120"})
    made = create_all(cluster, namespace, [pod(f"train-{i:03d}", template) for i in range(PODS)])
    assert not made.refused and len(made.created) == PODS
    running = lambda: sum(p["status"].get("phase") == "Running" for p in cluster.pods(namespace))  # noqa: E731
    wait_for(lambda: running() == PODS, f"{PODS} pods running on the simulated nodes", timeout=300)

    second = cluster.controller_service("controller-2", cluster.database)
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/{LEASE_NAME}"
    logs = {cluster.controller: cluster.directory / "controller.log", second: cluster.directory / "controller-2.log"}
    try:
        cluster.set_budget(namespace, gpu_minutes=1, evict=True)  # below what its pods have used: over budget at once

        terminating = lambda: sum("deletionTimestamp" in p["metadata"] for p in cluster.pods(namespace))  # noqa: E731
        wait_for(lambda: terminating() >= 50, "the pass to have evicted 50 pods")
        holder = cluster.rest("GET", lease_path)["spec"]["holderIdentity"]
        (leader,) = [s for s in logs if s.process is not None and f"-{s.process.pid}-" in holder]
        assert leader.process is not None
        worker = leader.process.pid
        with _between_sqlite_writes(cluster.database):
            os.kill(worker, signal.SIGSTOP)  # the leader, paused mid-pass, still believes it leads
        try:
            wait_for(
                lambda: cluster.rest("GET", lease_path)["spec"]["holderIdentity"] != holder,
                "a successor to take the lease",
            )
            wait_for(lambda: terminating() >= 100, "the successor to evict")
        finally:
            os.kill(worker, signal.SIGCONT)
        wait_for(lambda: terminating() == PODS, "every pod evicted", timeout=300)
        time.sleep(3 * LEASE_SECONDS)  # the deposed leader, resumed, has had every chance to evict again

        granted = Counter(name for name, status in cluster.plane.evictions(namespace) if status == 201)
        assert set(granted) == {f"train-{i:03d}" for i in range(PODS)}
        # the API server granted no pod's eviction twice
        assert [name for name, times in granted.items() if times > 1] == []
        assert all(evictions(log, namespace) for log in logs.values()), "both evicted: the successor took over mid-pass"
        assert "stops here" in logs[leader].read_text()  # the deposed leader stopped
    finally:
        second.stop()
        delete_namespaces(cluster, namespace)
