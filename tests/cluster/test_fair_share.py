"""Fair share on kube-scheduler with simulated GPU nodes (docs/fair-share.md), the half-life compressed to minutes.

One node of 8 whole GPUs, two teams of equal budgets: each one's fair share is 4 GPUs. heavy fills the node first:
nobody having used anything, both are at parity in the middle band, and the burst guard admits heavy's fair share in
it and the rest one band lower. Once heavy has used GPUs and light none, heavy's band is the heaviest and light's the
lightest. light then asks for 20 GPUs at once: only its fair share is admitted in the top band, which kube-scheduler
lets preempt heavy's pods of the lowest band; its other pods, one band lower, wait until the controller evicts heavy's
pods admitted above heavy's band now (GPUFairShare Events, readable in heavy's own namespace), and heavy's
replacements come back in the heavy band, where they preempt none of light's. A pod out of budget preempts nothing.
Every pod's band and reason are readable by its namespace.

Two teams that used the same are equals: the pods each asks for beyond its fair share wait one band lower and
preempt nothing, and nobody evicts for them. A namespace deleted and made again is the same name in the ledger: a
heavy team's comes back heavy.
"""

from __future__ import annotations

import itertools
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from gpusharing.admin.explain import preemptor
from tests.cluster.conftest import WEBHOOK_REFRESH_SECONDS
from tests.cluster.nodes import POOL_LABEL, NodeSimulator
from tests.cluster.workloads import delete_namespaces, pod, pod_template
from tests.e2e.system import GpuSharing, wait_for

LIGHT, MIDDLE, HEAVY = "gpusharing-in-budget-light", "gpusharing-in-budget", "gpusharing-in-budget-heavy"
BAND, REASON = "gpusharing.io/fair-share-band", "gpusharing.io/fair-share-reason"
GPUS = 8  # one node of the "whole" dialect
SETTINGS = {"TIMEKEEPER_FAIRSHARE_HALF_LIFE": "2m",
            "TIMEKEEPER_FAIRSHARE_INTERVAL_SECONDS": "1", "TIMEKEEPER_FAIRSHARE_MIN_TIME_IN_BAND": "0",
            "TIMEKEEPER_FAIRSHARE_GRACE": "10s", "TIMEKEEPER_FAIRSHARE_MIN_RUN_TIME": "5s"}


@pytest.fixture
def fair_share(cluster: GpuSharing) -> Iterator[None]:
    """Fair share on, its half-life compressed to minutes."""
    with cluster.fair_share(**SETTINGS):
        try:
            yield
        finally:  # the controller's log, before its restart with the usual settings writes over it
            shutil.copyfile(cluster.directory / "controller.log", cluster.directory / "controller-fair-share.log")


POOLS = itertools.count(1)


@pytest.fixture
def pool(cluster: GpuSharing, nodes: NodeSimulator) -> Iterator[str]:
    """A new node of 8 whole GPUs, the earlier tests' nodes cordoned meanwhile: the cluster's GPUs fair share divides
    are this node's. The node's pool."""
    name = f"fair-{next(POOLS)}"
    nodes.add_pool(name, 1, "whole")
    others = [n["metadata"]["name"] for n in cluster.rest("GET", "/api/v1/nodes")["items"]
              if n["metadata"].get("labels", {}).get(POOL_LABEL) != name]
    for node in others:
        cluster.rest("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}}, patch="merge")
    try:
        yield name
    finally:
        for node in others:
            cluster.rest("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": None}}, patch="merge")


def deployment(name: str, replicas: int, pool: str) -> dict[str, Any]:
    template = pod_template("whole", pool, labels={"app": name})
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
    cluster: GpuSharing, pool: str, fair_share: None,
) -> None:
    cluster.require_controllers()
    heavy, light, broke = (cluster.namespace(f"fs-{team}") for team in ("heavy", "light", "broke"))
    try:
        for team in (heavy, light):
            cluster.set_budget(team, gpu_minutes=6000)
        cluster.set_budget(broke, gpu_minutes=0)
        # Nobody has used anything: everyone is at parity, in the middle band.
        wait_for(
            lambda: listed_band(cluster, light) == listed_band(cluster, heavy) == MIDDLE,
            "the fairshare task to rank the teams",
        )
        # and the webhook to poll the bands (it polls every WEBHOOK_REFRESH_SECONDS)
        time.sleep(2 * WEBHOOK_REFRESH_SECONDS)

        # heavy fills the node: its fair share (4 GPUs) in its band, the middle one, the rest one band lower.
        cluster.create(heavy, deployment("train", GPUS, pool))
        wait_for(lambda: len(running(cluster, heavy)) == GPUS, "heavy's pods to run", timeout=120)
        assert bands(live(cluster, heavy)) == {MIDDLE: 4, HEAVY: 4}
        wait_for(lambda: listed_band(cluster, heavy) == HEAVY and listed_band(cluster, light) == LIGHT,
                 "heavy's use to make it heavy, and light, which used nothing, light", timeout=120)
        time.sleep(2 * WEBHOOK_REFRESH_SECONDS)  # the webhook to poll the new bands

        # light asks for 20 GPUs: only its fair share in the top band.
        cluster.create(light, deployment("burst", 20, pool))
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
        # none of light's preempted or evicted
        assert len(cluster.pods(light)) == 20 and len(live(cluster, light)) == 20
        assert all(
            f"pods of namespace {light} in band {MIDDLE} waited unschedulable" in e.message for e in fair_share_events()
        )
        # what `explain` reads
        assert {(e.related.kind, e.related.name) for e in fair_share_events()} == {("Namespace", light)}
        # kube-scheduler's own Preempted Events name the preemptor by its UID: one of light's pods, which `explain`
        # finds in the ledger (a cluster-wide read) once it ran (a preemptor may still wait: another took its room).
        preempted = [
            e for e in cluster.rest("GET", f"/api/v1/namespaces/{heavy}/events")["items"] if e["reason"] == "Preempted"
        ]
        preemptors = {found.pod_uid for e in preempted if (found := preemptor([e])) is not None}
        assert preemptors and preemptors <= {p["metadata"]["uid"] for p in cluster.pods(light)}, [
            e["message"] for e in preempted
        ]

        def in_ledger() -> list[str]:
            return [item["namespace"] for uid in preemptors for item in cluster.timekeeper_call(
                "GET", f"/api/v1/pods?uid={uid}", cluster.budget_admin_token()).json()["items"]]

        assert set(wait_for(in_ledger, "a preemptor that ran, in the ledger", timeout=120)) == {light}

        # Every pod's band and reason, read by its namespace's own admin.
        for api, namespace in ((heavy_admin, heavy), (light_admin, light)):
            for each in api.list_namespaced_pod(namespace).items:
                assert each.metadata.annotations[REASON].startswith(namespace), each.metadata.annotations

        # A pod out of budget preempts nothing.
        cluster.create(broke, pod("late", pod_template("whole", pool)))
        late = wait_for(lambda: cluster.pod(broke, "late"), "broke's pod")
        assert (
            late["spec"]["priorityClassName"] == "gpusharing-over-budget"
            and BAND not in late["metadata"]["annotations"]
        )
        # Found no room, or (in the churn of the evictions) a GPU free for a moment: it took that, and no one's place.
        wait_for(
            lambda: any(
                c.get("type") == "PodScheduled" and (c.get("status") == "True" or c.get("reason") == "Unschedulable")
                for c in (cluster.pod(broke, "late") or {}).get("status", {}).get("conditions", [])
            ),
            "broke's pod to be scheduled or found no room",
        )
        time.sleep(2 * WEBHOOK_REFRESH_SECONDS)
        preempted_for_broke = [
            e
            for team in (heavy, light)
            for e in cluster.rest("GET", f"/api/v1/namespaces/{team}/events")["items"]
            if e["reason"] == "Preempted" and (e.get("related") or {}).get("namespace") == broke
        ]
        assert preempted_for_broke == [] and not (cluster.pod(broke, "late") or {}).get("status", {}).get(
            "nominatedNodeName"
        )
        assert len(live(cluster, light)) == 20 and len(running(cluster, light)) > GPUS // 2
    finally:
        delete_namespaces(cluster, heavy, light, broke)


def test_equal_teams_never_preempt_each_other_and_a_heavy_teams_re_created_namespace_comes_back_heavy(
    cluster: GpuSharing, pool: str, fair_share: None,
) -> None:
    cluster.require_controllers()
    first, second = (cluster.namespace(f"fs-{team}") for team in ("first", "second"))
    late = ""
    try:
        for team in (first, second):
            cluster.set_budget(team, gpu_minutes=6000)
        wait_for(
            lambda: listed_band(cluster, first) == listed_band(cluster, second) == MIDDLE,
            "the fairshare task to rank the teams",
        )
        time.sleep(2 * WEBHOOK_REFRESH_SECONDS)

        # Both take their fair share at once, then each asks for 2 GPUs more: one band lower, where they preempt none.
        for team in (first, second):
            cluster.create(team, deployment("train", GPUS // 2, pool))
        wait_for(
            lambda: all(len(running(cluster, team)) == GPUS // 2 for team in (first, second)),
            "both teams' pods to run",
            timeout=120,
        )
        holding = {team: {p["metadata"]["uid"] for p in running(cluster, team)} for team in (first, second)}
        assert all(bands(live(cluster, team)) == {MIDDLE: GPUS // 2} for team in (first, second))
        for team in (first, second):
            cluster.rest(
                "PATCH",
                f"/apis/apps/v1/namespaces/{team}/deployments/train",
                {"spec": {"replicas": GPUS // 2 + 2}},
                patch="merge",
            )
        wait_for(
            lambda: all(len(live(cluster, team)) == GPUS // 2 + 2 for team in (first, second)), "the teams' extra pods"
        )
        assert all(bands(live(cluster, team)) == {MIDDLE: GPUS // 2, HEAVY: 2} for team in (first, second))
        # Past the grace period and many fairshare passes, equals still: nobody's pod was preempted or evicted.
        time.sleep(3 * float(SETTINGS["TIMEKEEPER_FAIRSHARE_GRACE"].rstrip("s")))
        for team in (first, second):
            assert {p["metadata"]["uid"] for p in running(cluster, team)} == holding[team], state(cluster, team)
            assert len(cluster.pods(team)) == GPUS // 2 + 2, state(cluster, team)
            assert not [
                e
                for e in cluster.rest("GET", f"/api/v1/namespaces/{team}/events")["items"]
                if e["reason"] == "GPUFairShare"
            ]
        assert listed_band(cluster, first) == listed_band(cluster, second) == MIDDLE

        # Both stop; a third team that used nothing arrives: the two are heavy beside it, and stay so while it waits.
        cluster.rest("DELETE", f"/apis/apps/v1/namespaces/{second}/deployments/train")
        cluster.rest("DELETE", f"/api/v1/namespaces/{first}")
        late = cluster.namespace("fs-late")
        cluster.set_budget(late, gpu_minutes=6000)
        wait_for(
            lambda: (
                listed_band(cluster, first) == listed_band(cluster, second) == HEAVY
                and listed_band(cluster, late) == LIGHT
            ),
            "the teams that used GPUs heavy beside one that used none",
        )
        # first's namespace deleted and made again: its use is the same name's, it comes back heavy.
        wait_for(
            lambda: not cluster.exists(f"/api/v1/namespaces/{first}"), "first's namespace to be deleted", timeout=120
        )
        cluster.rest(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": first}}
        )
        wait_for(
            lambda: cluster.exists(f"/api/v1/namespaces/{first}/serviceaccounts/default"),
            "first's default ServiceAccount",
        )
        time.sleep(2 * WEBHOOK_REFRESH_SECONDS)
        assert listed_band(cluster, first) == HEAVY
        for team, band in ((first, HEAVY), (late, LIGHT)):
            created = cluster.create(team, pod("again", pod_template("whole", pool)))
            assert created["metadata"]["annotations"][BAND] == band
    finally:
        delete_namespaces(cluster, first, second, *([late] if late else []))
