"""Fair share on kube-scheduler with simulated GPU nodes (docs/fair-share.md), the half-life compressed to seconds or
minutes.

One node of 8 whole GPUs, two teams of equal budgets: each one's fair share is 4 GPUs. heavy fills the node first:
its pods wait behind the fair-share gate only until a pass releases them into the free GPUs. Once heavy has used GPUs
and light none, light asks for 20 GPUs at once: its pods wait in the queue, the grace passes, and the controller
evicts heavy's pods for light until light holds its fair share (GPUFairShare Events, readable in heavy's own
namespace); heavy's replacements queue behind light's pods. light's own admin cannot take its pods out of the queue,
and a pod out of budget waits behind everyone in budget. Every pod's band and reason are readable by its namespace.

Two teams that used the same are equals: the pods each asks for beyond its fair share wait in the queue, and nobody
evicts for them. A namespace deleted and made again is the same name in the ledger: a heavy team's comes back heavy.

Convergence (issue 39): teams weighted 2 : 1 : 1, the last a department of two namespaces, each with a Job keeping a
backlog larger than the cluster of 16 GPUs, receive their weights' shares of the GPU-seconds within 10 %, as do three
equal teams; a team that joins late reaches its share within two half-lives.
"""

from __future__ import annotations

import itertools
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpusharing.contract import FAIR_SHARE_GATE
from tests.cluster.conftest import WEBHOOK_REFRESH_SECONDS
from tests.cluster.nodes import POOL_LABEL, RUNS_FOR, NodeSimulator
from tests.cluster.workloads import delete_namespaces, pod, pod_template
from tests.e2e.system import ApiError, GpuSharing, wait_for

LIGHT, MIDDLE, HEAVY = "gpusharing-in-budget-light", "gpusharing-in-budget", "gpusharing-in-budget-heavy"
BAND, REASON = "gpusharing.io/fair-share-band", "gpusharing.io/fair-share-reason"
GPUS = 8  # one node of the "whole" dialect
SETTINGS = {"TIMEKEEPER_FAIRSHARE_HALF_LIFE": "2m",
            "TIMEKEEPER_FAIRSHARE_INTERVAL_SECONDS": "1", "TIMEKEEPER_FAIRSHARE_QUEUE_INTERVAL_SECONDS": "1",
            "TIMEKEEPER_FAIRSHARE_MIN_TIME_IN_BAND": "0",
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


@contextmanager
def alone(cluster: GpuSharing, nodes: NodeSimulator, count: int) -> Iterator[str]:
    """A new pool of `count` nodes of 8 whole GPUs, the earlier tests' nodes cordoned meanwhile: the cluster's GPUs
    fair share divides are this pool's. The pool."""
    name = f"fair-{next(POOLS)}"
    nodes.add_pool(name, count, "whole")
    others = [n["metadata"]["name"] for n in cluster.rest("GET", "/api/v1/nodes")["items"]
              if n["metadata"].get("labels", {}).get(POOL_LABEL) != name]
    for node in others:
        cluster.rest("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}}, patch="merge")
    try:
        yield name
    finally:
        for node in others:
            cluster.rest("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": None}}, patch="merge")


@pytest.fixture
def pool(cluster: GpuSharing, nodes: NodeSimulator) -> Iterator[str]:
    """One node of 8 GPUs, alone."""
    with alone(cluster, nodes, 1) as name:
        yield name


def deployment(name: str, replicas: int, pool: str) -> dict[str, Any]:
    template = pod_template("whole", pool, labels={"app": name})
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template}}


def live(cluster: GpuSharing, namespace: str) -> list[dict[str, Any]]:
    return [p for p in cluster.pods(namespace) if "deletionTimestamp" not in p["metadata"]]


def running(cluster: GpuSharing, namespace: str) -> list[dict[str, Any]]:
    return [p for p in live(cluster, namespace) if p["status"].get("phase") == "Running"]


def queued(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods waiting behind the fair-share gate."""
    return [p for p in pods if {"name": FAIR_SHARE_GATE} in (p["spec"].get("schedulingGates") or [])]


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


def test_a_light_team_waiting_in_the_queue_gets_its_share_made_room_for_and_keeps_it(
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

        # heavy fills the node: its pods queue, and are released into the free GPUs.
        cluster.create(heavy, deployment("train", GPUS, pool))
        wait_for(lambda: len(running(cluster, heavy)) == GPUS, "heavy's pods to run", timeout=120)
        assert bands(live(cluster, heavy)) == {MIDDLE: 4, HEAVY: 4} and not queued(live(cluster, heavy))
        wait_for(lambda: listed_band(cluster, heavy) == HEAVY and listed_band(cluster, light) == LIGHT,
                 "heavy's use to make it heavy, and light, which used nothing, light", timeout=120)
        time.sleep(2 * WEBHOOK_REFRESH_SECONDS)  # the webhook to poll the new bands

        # light asks for 20 GPUs: they wait in the queue, kube-scheduler says why.
        cluster.create(light, deployment("burst", 20, pool))
        wait_for(lambda: len(live(cluster, light)) == 20, "light's 20 pods to be admitted")
        assert bands(live(cluster, light)) == {LIGHT: 4, MIDDLE: 16}
        wait_for(lambda: any(c.get("reason") == "SchedulingGated" for p in queued(live(cluster, light))
                             for c in p["status"].get("conditions", [])), "kube-scheduler to show a pod gated")
        # light's own admin cannot take a pod out of the queue (the chart's ValidatingAdmissionPolicy).
        heavy_admin, light_admin = cluster.namespace_admin(heavy), cluster.namespace_admin(light)
        waiting = queued(live(cluster, light))[0]
        gate = waiting["spec"]["schedulingGates"].index({"name": FAIR_SHARE_GATE})
        with pytest.raises(ApiException) as refused:
            light_admin.patch_namespaced_pod(waiting["metadata"]["name"], light,
                                             [{"op": "remove", "path": f"/spec/schedulingGates/{gate}"}])
        assert refused.value.status == 403 and "fair-share queue" in str(refused.value.body)

        # Past the grace, the controller evicts heavy's pods for light, below its share; the room is light's.
        def fair_share_events() -> list[Any]:
            return [e for e in heavy_admin.list_namespaced_event(heavy).items if e.reason == "GPUFairShare"]

        try:
            wait_for(lambda: len(running(cluster, light)) == GPUS // 2 and len(running(cluster, heavy)) == GPUS // 2,
                     "light to hold its fair share, heavy's pods evicted for it", timeout=300)
        except AssertionError as late:
            raise AssertionError(f"{late}; {state(cluster, heavy)}; {state(cluster, light)}") from None
        assert all(f"pods of namespace {light}, below its fair share, waited in the fair-share queue" in e.message
                   for e in fair_share_events())
        assert len(fair_share_events()) >= GPUS // 2
        # what `explain` reads
        assert {(e.related.kind, e.related.name) for e in fair_share_events()} == {("Namespace", light)}
        # none of light's evicted; heavy's replacements wait in the queue behind light's pods
        assert len(cluster.pods(light)) == 20 and len(queued(live(cluster, light))) == 20 - GPUS // 2
        assert len(queued(live(cluster, heavy))) == GPUS // 2

        # Every pod's band and reason, read by its namespace's own admin.
        for api, namespace in ((heavy_admin, heavy), (light_admin, light)):
            for each in api.list_namespaced_pod(namespace).items:
                assert each.metadata.annotations[REASON].startswith(namespace), each.metadata.annotations

        # A pod out of budget waits behind everyone in budget, and preempts nobody.
        cluster.create(broke, pod("late", pod_template("whole", pool)))
        late = wait_for(lambda: cluster.pod(broke, "late"), "broke's pod")
        assert (
            late["spec"]["priorityClassName"] == "gpusharing-over-budget"
            and BAND not in late["metadata"]["annotations"]
        )
        time.sleep(3 * float(SETTINGS["TIMEKEEPER_FAIRSHARE_QUEUE_INTERVAL_SECONDS"]) + 2 * WEBHOOK_REFRESH_SECONDS)
        assert queued([cluster.pod(broke, "late") or {"spec": {}}]), state(cluster, broke)
        assert len(running(cluster, light)) == len(running(cluster, heavy)) == GPUS // 2
    finally:
        delete_namespaces(cluster, heavy, light, broke)


def test_equal_teams_never_evict_each_other_and_a_heavy_teams_re_created_namespace_comes_back_heavy(
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

        # A tenant skips the queue neither by naming a node nor by binding its pod itself, and its pod bigger than the
        # cluster, first's oldest, waits alone: it holds nobody back.
        node = cluster.rest("GET", "/api/v1/nodes", query={"labelSelector": f"{POOL_LABEL}={pool}"})["items"][0]
        named = pod("named", pod_template("whole", pool))
        named["spec"]["nodeName"] = node["metadata"]["name"]
        with pytest.raises(ApiError) as refused:
            cluster.create(first, named)
        assert refused.value.status == 403 and "cannot name its node (spec.nodeName)" in refused.value.message
        huge = pod("huge", pod_template("whole", pool))
        huge["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = GPUS + 1
        cluster.create(first, huge)
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "huge"},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node["metadata"]["name"]}}
        with pytest.raises(ApiError) as unbound:  # not even the cluster admin: the API server binds no gated pod
            cluster.rest("POST", f"/api/v1/namespaces/{first}/pods/huge/binding", binding)
        assert unbound.value.status == 409 and "non-empty .spec.schedulingGates" in unbound.value.message
        # the burst guard's count of first, the next pass's, holds the huge pod no more (it never ran)
        time.sleep(float(SETTINGS["TIMEKEEPER_FAIRSHARE_INTERVAL_SECONDS"]) + 2 * WEBHOOK_REFRESH_SECONDS)

        # Both take their fair share at once, then each asks for 2 GPUs more: they wait in the queue, one band lower.
        for team in (first, second):
            cluster.create(team, deployment("train", GPUS // 2, pool))
        wait_for(
            lambda: all(len(running(cluster, team)) == GPUS // 2 for team in (first, second)),
            "both teams' pods to run",
            timeout=120,
        )
        assert queued([cluster.pod(first, "huge") or {"spec": {}}]), state(cluster, first)
        cluster.rest("DELETE", f"/api/v1/namespaces/{first}/pods/huge")
        wait_for(lambda: cluster.pod(first, "huge") is None, "the huge pod to go")
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
        assert all(len(queued(live(cluster, team))) == 2 for team in (first, second))
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


# Convergence (issue 39, docs/fair-share.md): half-lives of seconds, a backlog larger than the cluster, and pods long
# beside the second a Job controller takes to replace one.
CONVERGENCE = {"TIMEKEEPER_FAIRSHARE_HALF_LIFE": "20s", "TIMEKEEPER_FAIRSHARE_INTERVAL_SECONDS": "1",
               "TIMEKEEPER_FAIRSHARE_QUEUE_INTERVAL_SECONDS": "1",
               "TIMEKEEPER_FAIRSHARE_MIN_TIME_IN_BAND": "0", "TIMEKEEPER_FAIRSHARE_GRACE": "10s",
               "TIMEKEEPER_FAIRSHARE_MIN_RUN_TIME": "5s"}
HALF_LIFE = 20.0
BACKLOG = 20  # each namespace's Job keeps this many pods running or waiting: more than the cluster's 16 GPUs
POD_SECONDS = 15


def backlog_job(pool: str) -> dict[str, Any]:
    template = pod_template("whole", pool, annotations={RUNS_FOR: str(POD_SECONDS)}, restart="Never")
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "backlog"},
            "spec": {"parallelism": BACKLOG, "completions": 100_000, "backoffLimit": 100_000, "template": template}}


class Received:
    """GPU-seconds each namespace's pods ran on the simulated nodes, sampled every 0.2 s from `restart` on."""

    def __init__(self, nodes: NodeSimulator) -> None:
        self.nodes = nodes
        self.seconds: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            for ran in list(self.nodes.pods.values()):
                if ran.recorded_start and not ran.recorded_end and ran.share:
                    self.seconds[ran.namespace] = self.seconds.get(ran.namespace, 0.0) + 0.2 * ran.share

    def restart(self) -> None:
        self.seconds = {}

    def running(self, namespace: str) -> int:
        return sum(1 for ran in list(self.nodes.pods.values())
                   if ran.namespace == namespace and ran.recorded_start and not ran.recorded_end)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def shares(self) -> dict[str, float]:
        total = sum(self.seconds.values())
        return {namespace: seconds / total for namespace, seconds in self.seconds.items()}


def set_budget(cluster: GpuSharing, name: str, gpu_minutes: float, parent: str | None = None) -> None:
    """A budget whose GPU-minutes are its fair-share weight (docs/fair-share.md), under `parent`."""
    body = {"gpuMinutes": gpu_minutes, "period": "monthly", **({"parent": parent} if parent else {})}
    answer = cluster.timekeeper_call("PUT", f"/api/v1/budgets/{name}", cluster.budget_admin_token(), body)
    assert answer.status_code in (200, 201), answer.text


def off_by(received: dict[str, float], entitled: dict[str, float]) -> dict[str, str]:
    return {name: f"{received.get(name, 0.0) / share - 1:+.1%}" for name, share in entitled.items()}


def converge(cluster: GpuSharing, received: Received, pool: str, entitled: dict[str, float], what: str) -> None:
    """Once the fairshare task ranked them, each of `entitled`'s namespaces keeps a backlog: over three half-lives
    after the first, each receives its entitled share of the GPU-seconds within 10 %; the figures printed."""
    wait_for(lambda: all(listed_band(cluster, n) == MIDDLE for n in entitled), "the fairshare task to rank them")
    time.sleep(2 * WEBHOOK_REFRESH_SECONDS)
    for namespace in entitled:
        cluster.create(namespace, backlog_job(pool))
    time.sleep(HALF_LIFE)
    received.restart()
    time.sleep(3 * HALF_LIFE)
    shares = received.shares()
    print(f"{what}: entitled {entitled}; received {shares}; off by {off_by(shares, entitled)}")
    assert all(abs(shares.get(n, 0.0) / share - 1) <= 0.10 for n, share in entitled.items()), off_by(shares, entitled)


@pytest.fixture
def converging(cluster: GpuSharing, nodes: NodeSimulator) -> Iterator[str]:
    """Fair share on with half-lives of seconds, on a pool of 16 GPUs alone."""
    with cluster.fair_share(**CONVERGENCE), alone(cluster, nodes, 2) as name:
        try:
            yield name
        finally:
            shutil.copyfile(cluster.directory / "controller.log", cluster.directory / "controller-convergence.log")


def test_under_a_backlog_each_team_gets_its_weight_and_a_department_split_in_namespaces_gains_nothing(
    cluster: GpuSharing, nodes: NodeSimulator, converging: str,
) -> None:
    """Teams weighted 2 : 1 : 1, the last a department of two namespaces weighted 1 : 1, each keeping a backlog larger
    than the cluster: over three half-lives after the first, each receives its share within 10 %."""
    cluster.require_controllers()
    big, small, first, second = (cluster.namespace(f"fs-{team}") for team in ("big", "small", "dept-a", "dept-b"))
    department = f"dept.fs-{next(POOLS)}"
    entitled = {big: 0.5, small: 0.25, first: 0.125, second: 0.125}
    received = Received(nodes)
    try:
        set_budget(cluster, big, 2000)
        set_budget(cluster, small, 1000)
        set_budget(cluster, department, 1000)
        set_budget(cluster, first, 500, department)
        set_budget(cluster, second, 500, department)
        converge(cluster, received, converging, entitled, "2 : 1 : (1 : 1)")
    finally:
        received.stop()
        delete_namespaces(cluster, *entitled)


def test_equal_teams_converge_and_a_team_that_joins_late_reaches_its_share_within_two_half_lives(
    cluster: GpuSharing, nodes: NodeSimulator, converging: str,
) -> None:
    cluster.require_controllers()
    teams = [cluster.namespace(f"fs-equal-{n}") for n in range(3)]
    late = cluster.namespace("fs-late")
    received = Received(nodes)
    try:
        for namespace in (*teams, late):
            set_budget(cluster, namespace, 1000)
        converge(cluster, received, converging, dict.fromkeys(teams, 1 / 3), "equal teams")

        # A fourth team, which used nothing: its fair share is 4 of the 16 GPUs, and it is owed more.
        joined = time.monotonic()
        cluster.create(late, backlog_job(converging))
        wait_for(lambda: received.running(late) >= 4, "the late team to run its share", timeout=2 * HALF_LIFE)
        print(f"the late team ran its 4 GPUs {time.monotonic() - joined:.1f} s after it joined")
        time.sleep(max(0.0, joined + 2 * HALF_LIFE - time.monotonic()))
        received.restart()
        time.sleep(HALF_LIFE)
        shares = received.shares()
        print(f"the late team's share in the third half-life after it joined: {shares.get(late, 0.0):.1%}")
        assert shares.get(late, 0.0) >= 0.9 / 4, shares
    finally:
        received.stop()
        delete_namespaces(cluster, *teams, late)
