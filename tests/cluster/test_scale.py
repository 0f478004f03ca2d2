"""The scale run: hundreds of simulated GPU nodes, thousands of GPU pods created in bursts, simulated meters, one
namespace demoted; it prints what admission adds to a create, what each process spent per 1,000 creates beside the
same creates without a GPU (the webhook never called), how long the demotion took, the evictions and memory.

Kept to a minute or two in CI (GPUSHARING_SCALE_NODES, GPUSHARING_SCALE_PODS: 100 and 1,000 by default);
`make scale` runs it larger by hand. The figures are printed, never asserted: this machine is shared.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from demo.processes import child_pids
from tests.cluster.nodes import DIALECTS, METER, NodeSimulator
from tests.cluster.workloads import (
    CpuUse,
    cpu_seconds,
    create_across,
    create_all,
    delete_namespaces,
    milliseconds,
    pod,
    pod_template,
)
from tests.e2e.controlplane import CONTROLLER_MANAGER, SCHEDULER
from tests.e2e.system import GpuSharing, wait_for

NODES = int(os.environ.get("GPUSHARING_SCALE_NODES", "100"))
PODS = int(os.environ.get("GPUSHARING_SCALE_PODS", "1000"))
TEAMS = 10
CLIENTS = 16  # concurrent creators, as many teams' controllers at once
REPORT_SECONDS = 10.0  # simulated meters report this often here (30 s in a cluster)
# Each pod's dialect in turn: whole devices (8 to a node) are one pod in eight, shared ones the rest.
DIALECT_CYCLE = ("hami", "vcuda", "aliyun", "hami", "vcuda", "aliyun", "hami", "whole")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def mutate_calls(cluster: GpuSharing) -> float:
    """The webhook's /mutate reviews so far, from its metrics."""
    text = requests.get(f"{cluster.webhook_url}/metrics", verify=cluster.webhook.verify, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("gpusharing_webhook_admissions_total{") and 'endpoint="mutate"' in line)


def processes(cluster: GpuSharing) -> dict[str, Callable[[], float]]:
    """Each process of the system by name, with what it has used of the CPU so far: the control plane's, the webhook's
    and the web timekeeper's (gunicorn's master and its workers), the controller's, and the simulated kubelet (its
    threads in this process, "sim-...")."""
    def with_children(pid: int) -> Callable[[], float]:
        return lambda: cpu_seconds(pid) + sum(cpu_seconds(child) for child in child_pids(pid))

    def simulator() -> float:
        return sum(
            cpu_seconds(os.getpid(), t.native_id)
            for t in threading.enumerate()
            if t.name.startswith("sim-") and t.native_id
        )

    plane = {
        name: cluster.plane.processes[name].pid
        for name in ("kube-apiserver", "etcd", SCHEDULER, CONTROLLER_MANAGER)
        if name in cluster.plane.processes
    }
    return {
        **{name: with_children(pid) for name, pid in plane.items()},
        "webhook": with_children(cluster.webhook.process.pid),  # type: ignore[union-attr]
        "timekeeper web": with_children(cluster.timekeeper.process.pid),  # type: ignore[union-attr]
        "timekeeper controller": with_children(cluster.controller.process.pid),  # type: ignore[union-attr]
        "node simulator": simulator,
    }


def cpu_per_thousand(gpu: dict[str, float], gpu_creates: int, plain: dict[str, float], plain_creates: int) -> str:
    """CPU-seconds per 1,000 creates of each process, GPU pods beside pods without a GPU (which the webhook never
    sees)."""
    def per(used: float, creates: int) -> float:
        return 1000 * used / max(1, creates)

    parts = [f"{name} {per(gpu[name], gpu_creates):.1f} ({per(plain[name], plain_creates):.1f})" for name in gpu]
    return (f"CPU-seconds per 1,000 creates, until every pod ran, GPU pods (without a GPU): {'; '.join(parts)}; "
            f"all {per(sum(gpu.values()), gpu_creates):.1f} ({per(sum(plain.values()), plain_creates):.1f})")


def test_scale_run(cluster: GpuSharing, nodes: NodeSimulator, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.require_controllers()
    for dialect in DIALECTS:
        nodes.add_pool(f"scale-{dialect}", NODES // len(DIALECTS), dialect)
    teams = [cluster.namespace("scale-team") for _ in range(TEAMS)]
    baseline_namespace = cluster.namespace("scale-baseline")
    interval, nodes.meter_interval = nodes.meter_interval, REPORT_SECONDS
    figures: list[str] = []
    try:
        # The same creates with no GPU (the webhook is never called), then with one, from CLIENTS concurrent clients.
        running = lambda namespace: sum(  # noqa: E731
            p["status"].get("phase") == "Running" for p in cluster.pods(namespace)
        )
        plain = [pod(f"cpu-{i:05d}", pod_template(None, f"scale-{DIALECT_CYCLE[i % 8]}")) for i in range(PODS // 2)]
        cpu = CpuUse(processes(cluster))
        baseline = create_all(cluster, baseline_namespace, plain, CLIENTS)
        wait_for(lambda: running(baseline_namespace) == len(plain), "every pod without a GPU running", timeout=600)
        plain_cpu = cpu.since_start()
        gpu = [
            (
                teams[i % TEAMS],
                pod(
                    f"gpu-{i:05d}",
                    pod_template(DIALECT_CYCLE[i % 8], f"scale-{DIALECT_CYCLE[i % 8]}", {METER: "simulated"}),
                ),
            )
            for i in range(PODS)
        ]
        started, calls = time.monotonic(), mutate_calls(cluster)
        cpu = CpuUse(processes(cluster))
        made = create_across(cluster, gpu, CLIENTS)
        burst, calls = time.monotonic() - started, mutate_calls(cluster) - calls
        figures.append(
            f"creates from {CLIENTS} clients: {len(baseline.seconds)} without a GPU p50 "
            f"{milliseconds(baseline.seconds, 0.5)} p99 {milliseconds(baseline.seconds, 0.99)}; {len(made.seconds)} "
            f"GPU pods in {burst:.0f} s p50 {milliseconds(made.seconds, 0.5)} p99 {milliseconds(made.seconds, 0.99)} "
            f"(added p50 {milliseconds(made.seconds, 0.5, baseline.seconds)}, p99 "
            f"{milliseconds(made.seconds, 0.99, baseline.seconds)}); {made.timed_out} webhook timeouts (tried again), "
            f"refused {len(made.refused)}; "
            f"{calls / max(1, len(made.created)):.2f} /mutate calls per GPU pod"
        )
        assert made.refused == [], Counter(r[:120] for r in made.refused).most_common(3)  # every pod admitted
        started = time.monotonic()
        wait_for(lambda: all(running(team) == PODS // TEAMS for team in teams), "every GPU pod running", timeout=600)
        figures.append(
            f"every GPU pod scheduled and running {time.monotonic() - started:.0f} s after the last was created"
        )
        figures.append(cpu_per_thousand(cpu.since_start(), len(made.created), plain_cpu, len(baseline.created)))

        # One team runs out (its budget set below what its pods have used): each of its running pods is evicted once.
        demoted = teams[0]
        cluster.set_budget(demoted, gpu_minutes=1, evict=True)
        def state() -> str:
            answer = cluster.timekeeper_call("GET", f"/api/v1/budgets/{demoted}", cluster.budget_admin_token())
            return answer.json()["state"]

        wait_for(lambda: state() == "over-budget", "the namespace's use, billed from the record, past its budget")
        started = time.monotonic()
        in_budget = lambda: [p for p in cluster.pods(demoted) if "deletionTimestamp" not in p["metadata"]  # noqa: E731
                             and p["spec"].get("priorityClassName") == "gpusharing-in-budget"]
        wait_for(lambda: not in_budget(), "the namespace's pods evicted", timeout=600)
        demotion = time.monotonic() - started
        granted = Counter(name for name, status in cluster.plane.evictions(demoted) if status == 201)
        figures.append(f"demotion of {PODS // TEAMS} running pods: {demotion:.1f} s from its crossing; "
                       f"{sum(granted.values())} evictions, {sum(t > 1 for t in granted.values())} pods evicted twice")
        assert sorted(granted) == sorted(p.name for p in nodes.pods.values() if p.namespace == demoted)
        assert set(granted.values()) == {1}

        # Billing is what ran: each evicted pod's bill is what the API server recorded of it, which its simulated
        # meter's reports (from the same start, rounded to the second in the record) never exceed by a second.
        evicted = [p for p in nodes.pods.values() if p.namespace == demoted]
        wait_for(lambda: all(p.recorded_end for p in evicted), "the evicted pods' ends recorded")
        recorded = {p.uid: nodes.recorded_gpu_seconds(p) for p in evicted}
        ledger = lambda: {item["podUid"]: item for item in cluster.timekeeper_call(  # noqa: E731
            "GET", f"/api/v1/pods?namespace={demoted}", cluster.budget_admin_token()).json()["items"]}
        def unclosed() -> dict:
            return {
                uid: (seconds, ledger().get(uid, {}).get("observedGpuSeconds"))
                for uid, seconds in recorded.items()
                if ledger().get(uid, {}).get("observedGpuSeconds", -1) < seconds - 0.001
            }

        try:
            # Never a speed check: a demotion's hundreds of bills close within a few billing passes, slower on a busy
            # host.
            wait_for(lambda: not unclosed(), "the evicted pods' bills closed", timeout=300)
        except AssertionError:
            raise AssertionError(f"bills not closed (recorded, observed): {unclosed()}") from None
        billed = {uid: item["gpuSeconds"] for uid, item in ledger().items() if uid in recorded}
        share = {p.uid: p.share or 0 for p in evicted}  # the slack of two seconds of a pod's share: see test_day.py
        assert all(recorded[uid] - 0.001 <= billed[uid] <= recorded[uid] + 2 * share[uid] for uid in recorded), (
            billed,
            recorded,
        )
        figures.append(f"billed {sum(billed.values()):,.1f} GPU-seconds, recorded {sum(recorded.values()):,.1f}")

        webhook = max(rss_mib(pid) for pid in child_pids(cluster.webhook.process.pid))  # type: ignore[union-attr]
        timekeeper = max(rss_mib(pid) for pid in child_pids(cluster.timekeeper.process.pid))  # type: ignore[union-attr]
        controller = rss_mib(cluster.controller.process.pid)  # type: ignore[union-attr]
        figures.append(f"resident memory: webhook worker {webhook:.0f} MiB, timekeeper worker {timekeeper:.0f} MiB, "
                       f"controller {controller:.0f} MiB ({NODES} nodes, {PODS} GPU pods, {PODS // 2} other pods)")
    finally:
        delete_namespaces(cluster, *teams, baseline_namespace)
        nodes.meter_interval = interval
        with capsys.disabled():
            print("\nscale run: " + "\nscale run: ".join(figures))
