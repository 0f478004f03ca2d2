"""Fair share on kube-scheduler with simulated GPU nodes (docs/fair-share.md), the half-life compressed to minutes.

One node of 8 whole GPUs, two teams of equal budgets: each one's fair share is 4 GPUs. heavy fills the node first:
nobody having used anything, both are at parity in the middle band, and the burst guard admits heavy's fair share in
it and the rest one band lower. Once heavy has used GPUs and light none, heavy's band is the heaviest and light's the
lightest. light then asks for 20 GPUs at once: only its fair share is admitted in the top band, which kube-scheduler
lets preempt heavy's pods of the lowest band; its other pods, one band lower, wait until the controller evicts heavy's
pods admitted above heavy's band now (GPUFairShare Events, readable in heavy's own namespace), and heavy's
replacements come back in the heavy band, where they preempt none of light's. A pod out of budget preempts nothing.
Every pod's band and reason are readable by its namespace.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.conftest import WEBHOOK_REFRESH_SECONDS
from tests.cluster.nodes import POOL_LABEL, NodeSimulator
from tests.cluster.workloads import delete_namespaces, pod, pod_template
from tests.e2e.system import GpuSharing, wait_for
from tests.helm import render

LIGHT, MIDDLE, HEAVY = "gpusharing-in-budget-light", "gpusharing-in-budget", "gpusharing-in-budget-heavy"
BAND, REASON = "gpusharing.io/fair-share-band", "gpusharing.io/fair-share-reason"
GPUS = 8  # one node of the "whole" dialect
SETTINGS = {"TIMEKEEPER_FAIRSHARE_ENABLED": "true", "TIMEKEEPER_FAIRSHARE_HALF_LIFE": "2m",
            "TIMEKEEPER_FAIRSHARE_INTERVAL_SECONDS": "1", "TIMEKEEPER_FAIRSHARE_MIN_TIME_IN_BAND": "0",
            "TIMEKEEPER_FAIRSHARE_GRACE": "10s", "TIMEKEEPER_FAIRSHARE_MIN_RUN_TIME": "5s"}


@pytest.fixture
def fair_share(cluster: GpuSharing) -> Iterator[None]:
    """The chart's objects with fairShare.enabled (the bands' classes, the controller's read of nodes) installed, and
    the timekeeper and its controller with fair share on."""
    enabled = render({"fairShare": {"enabled": True}})
    for obj in enabled:
        if obj["kind"] == "PriorityClass" and obj["metadata"]["name"] in (LIGHT, HEAVY):
            cluster.rest("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", obj)
        elif obj["kind"] == "ClusterRole" and obj["metadata"]["name"] == "gpusharing-controller":
            cluster.replace(obj)
    with cluster.timekeeper_settings(**SETTINGS):
        try:
            yield
        finally:  # the controller's log, before its restart with the usual settings writes over it
            shutil.copyfile(cluster.directory / "controller.log", cluster.directory / "controller-fair-share.log")
    for name in (LIGHT, HEAVY):
        cluster.rest("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")


def deployment(name: str, replicas: int) -> dict[str, Any]:
    template = pod_template("whole", "fair", labels={"app": name})
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template}}


def live(cluster: GpuSharing, namespace: str) -> list[dict[str, Any]]:
    return [p for p in cluster.pods(namespace) if "deletionTimestamp" not in p["metadata"]]


def running(cluster: GpuSharing, namespace: str) -> list[dict[str, Any]]:
    return [p for p in live(cluster, namespace) if p["status"].get("phase") == "Running"]


def bands(pods: list[dict[str, Any]]) -> Counter[str]:
    return Counter(p["metadata"]["annotations"].get(BAND, "none") for p in pods)


def state(cluster: GpuSharing, namespace: str) -> str:
    """What a namespace's pods are doing, for a failure's message."""
    return f"{namespace}: " + ", ".join(
        f"{p['metadata']['name']} {p['metadata']['annotations'].get(BAND)} {p['status'].get('phase')}"
        f"{' deleting' if 'deletionTimestamp' in p['metadata'] else ''}"
        f" {[c.get('reason') for c in p['status'].get('conditions', []) if c.get('type') == 'PodScheduled']}"
        for p in cluster.pods(namespace))


def listed_band(cluster: GpuSharing, namespace: str) -> str | None:
    answer = cluster.timekeeper_call("GET", f"/api/v1/budgets/{namespace}", cluster.budget_admin_token())
    return ((answer.json() or {}).get("fairShare") or {}).get("band")


def test_a_light_team_gets_its_share_first_and_a_heavy_one_never_takes_it_back(
    cluster: GpuSharing, nodes: NodeSimulator, fair_share: None,
) -> None:
    cluster.require_controllers()
    nodes.add_pool("fair", 1, "whole")
    # The earlier tests' nodes cordoned while this one runs: the cluster's GPUs fair share divides are this pool's 8.
    others = [n["metadata"]["name"] for n in cluster.rest("GET", "/api/v1/nodes")["items"]
              if n["metadata"].get("labels", {}).get(POOL_LABEL) != "fair"]
    for name in others:
        cluster.rest("PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": True}}, patch="merge")
    heavy, light, broke = (cluster.namespace(f"fs-{team}") for team in ("heavy", "light", "broke"))
    try:
        for team in (heavy, light):
            cluster.set_budget(team, gpu_minutes=6000)
        cluster.set_budget(broke, gpu_minutes=0)
        # Nobody has used anything: everyone is at parity, in the middle band.
        wait_for(lambda: listed_band(cluster, light) == listed_band(cluster, heavy) == MIDDLE, "the fairshare task to rank the teams")
        time.sleep(2 * WEBHOOK_REFRESH_SECONDS)  # and the webhook to poll the bands (it polls every WEBHOOK_REFRESH_SECONDS)

        # heavy fills the node: its fair share (4 GPUs) in its band, the middle one, the rest one band lower.
        cluster.create(heavy, deployment("train", GPUS))
        wait_for(lambda: len(running(cluster, heavy)) == GPUS, "heavy's pods to run", timeout=120)
        assert bands(live(cluster, heavy)) == {MIDDLE: 4, HEAVY: 4}
        wait_for(lambda: listed_band(cluster, heavy) == HEAVY and listed_band(cluster, light) == LIGHT,
                 "heavy's use to make it heavy, and light, which used nothing, light", timeout=120)
        time.sleep(2 * WEBHOOK_REFRESH_SECONDS)  # the webhook to poll the new bands

        # light asks for 20 GPUs: only its fair share in the top band.
        cluster.create(light, deployment("burst", 20))
        wait_for(lambda: len(live(cluster, light)) == 20, "light's 20 pods to be admitted")
        assert bands(live(cluster, light)) == {LIGHT: 4, MIDDLE: 16}
        # Its top band preempts heavy's middle band: it holds its share. Its middle band waits, until the controller
        # evicts heavy's pods admitted above heavy's band now, whose replacements come back lower and preempt nothing.
        heavy_admin, light_admin = cluster.namespace_admin(heavy), cluster.namespace_admin(light)

        def fair_share_events() -> list[Any]:
            return [e for e in heavy_admin.list_namespaced_event(heavy).items if e.reason == "GPUFairShare"]

        try:
            wait_for(lambda: len(running(cluster, light)) > GPUS // 2 and fair_share_events(),
                     "light to hold its share and more, heavy's pods above its band evicted", timeout=300)
        except AssertionError as late:
            raise AssertionError(f"{late}; {state(cluster, heavy)}; {state(cluster, light)}") from None
        assert len(cluster.pods(light)) == 20 and len(live(cluster, light)) == 20  # none of light's preempted or evicted
        assert all(f"pods of namespace {light} in band {MIDDLE} waited unschedulable" in e.message for e in fair_share_events())

        # Every pod's band and reason, read by its namespace's own admin.
        for api, namespace in ((heavy_admin, heavy), (light_admin, light)):
            for each in api.list_namespaced_pod(namespace).items:
                assert each.metadata.annotations[REASON].startswith(namespace), each.metadata.annotations

        # A pod out of budget preempts nothing.
        cluster.create(broke, pod("late", pod_template("whole", "fair")))
        late = wait_for(lambda: cluster.pod(broke, "late"), "broke's pod")
        assert late["spec"]["priorityClassName"] == "gpusharing-over-budget" and BAND not in late["metadata"]["annotations"]
        wait_for(lambda: any(c.get("reason") == "Unschedulable" for c in (cluster.pod(broke, "late") or {}).get("status", {}).get("conditions", [])),
                 "broke's pod to be found no room")
        assert len(live(cluster, light)) == 20 and len(running(cluster, light)) > GPUS // 2
    finally:
        delete_namespaces(cluster, heavy, light, broke)
        for name in others:
            cluster.rest("PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": None}}, patch="merge")
