"""Chargeback on the real control plane (issue 40, docs/chargeback.md): the capacity ledger, the reports and the FOCUS
export of a run of teams on simulated GPU nodes (kube-apiserver, kube-scheduler, etcd; tests/cluster/nodes.py).

One node in each of five pools, each of 8 GPUs however its backend counts them: A100 80 GB nodes under gpushare (GiB
of `aliyun.com/gpu-mem`) and HAMi, an H200 cut into `3g.71gb` MIG slices (16 halves), a T4 node of whole GPUs, and an
L4 node under gpu-manager (`vcuda-core`), a model the price sheet leaves unpriced. The T4 node goes NotReady for a
while: its Ready condition written False, then True again, as its kubelet would write it (no node lifecycle
controller runs here), while no pod holds it (one ran before, one runs after). Teams in a hierarchy: the group
`team.vision` with two namespaces under it, and one namespace of its own. Each pod runs a few seconds on a simulated
meter that reads its GPU busy, or idle (0 %).

It shows that
- every node-hour's capacity splits exactly: allocated − over + unallocated + down = capacity, in micro-GPU-seconds;
- the NotReady node is down for exactly its 8 GPUs × the outage, from one transition time the API server recorded to
  the next, and no other node is down meanwhile; a new node is down until its Ready condition is first True; every
  node's capacity is its 8 GPUs × the time the ledger has recorded since the node was created;
- each node is allocated what the pods bound to it were billed (exactly: the usage report's figures) and what the
  simulated kubelet ran there (each pod's share × the time from its startTime to its finishedAt), idle as read;
- the cluster's allocated GPU time in the utilization report is the usage report's, to the micro-GPU-second;
- the FOCUS export of the day passes focus-validator with no failure of its own, every row's costs are its GPU-hours
  × the list and contracted prices of its model in force in its hour (0, and `x_Priced` false, for the unpriced
  L4), and each namespace's allocated rows add up to its usage;
- the accounts report rolls the group up from its namespaces, GPU-hours and costs;
- a tenant (its namespace's admin) exports its own rows, and is refused other namespaces', the cluster's export, the
  utilization report and the cluster's accounts;
- a window before the price sheet took effect cannot be costed (409).

Prices are in force only from the first whole hour after the sheet was recorded (docs/chargeback.md, "Never
retroactive"). Moving the timekeeper's clock (TIMEKEEPER_CLOCK) is no option here: the API server's record (pods'
startTime, nodes' transitions), which bills and the ledger read, keeps the real time. And a sheet recorded as the tier
starts would price none of the run's hours in all but the runs that cross an hour, so that the costs would be checked
only at 0. So the tier's sheet is recorded an hour before its timekeeper starts (tests/cluster/conftest.py,
`record_price_sheet_before`), by the timekeeper's own code, as a timekeeper started with it then would have recorded
it: the history a cluster running on its sheet has, every process on the real clock. It is in force from the hour
under way; an hour before the sheet's `effectiveAt` would be exported unpriced, which the row check covers too.

The session's cluster runs other modules' pods the same day, on their own nodes: the node-hour checks are on the
test's nodes (the identity on every node); the comparisons of the whole cluster are made from reads between which
nothing was billed (the usage report read before and after the utilization report, alike).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.cluster.conftest import CAPACITY_INTERVAL_SECONDS, PRICE_SHEET
from tests.cluster.nodes import METER, RUNS_FOR, UTILISATION, NodeSimulator, RunningPod, advertised, mig_slices
from tests.cluster.workloads import delete_namespaces, pod, pod_template
from tests.e2e.system import GpuSharing, wait_for
from tests.timekeeper.chargeback.focusvalidator import validate

UTC = dt.timezone.utc
A100, T4, H200, L4 = "NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA H200", "NVIDIA L4"
PRODUCT = "nvidia.com/gpu.product"  # GPU feature discovery's label: the model's name, its spaces as dashes
GPUS = 8  # every node's, whatever its backend advertises
MICRO = 1_000_000
GPU_HOUR = 3_600_000_000  # micro-GPU-seconds
MICROSECOND = dt.timedelta(microseconds=1)
RUNS_SECONDS = 4
OUTAGE_SECONDS = 3 * CAPACITY_INTERVAL_SECONDS  # the T4 node's NotReady time, at the least
# A transition is recorded at the first whole second at least this far ahead of its write: a capacity pass (every
# CAPACITY_INTERVAL_SECONDS) reads the write before the transition takes effect.
LEAD_SECONDS = CAPACITY_INTERVAL_SECONDS + 1
GROUP = "team.vision"
VISION_TRAIN, VISION_SERVE, SPEECH = "vision-train", "vision-serve", "speech"
TENANT = "tenant-admin"
BUSY, IDLE = "100", "0"  # what a pod's simulated meter reads of its GPU (per cent)
# focus-validator 2.2.1's unmet alternative of an OR rule the export meets (chargeback/focusvalidator.py)
KNOWN_ALTERNATIVE = "InvoiceId-C-005-C"


@dataclass(frozen=True)
class Pool:
    key: str
    model: str
    dialect: str  # the simulator's label of the backend
    resources: dict[str, str]

    @property
    def name(self) -> str:
        return f"chargeback-{self.key}"


POOLS = {p.key: p for p in (
    Pool("a100-gpushare", A100, "aliyun", advertised("aliyun", 81920)),
    Pool("a100-hami", A100, "hami", advertised("hami", 81920)),
    Pool("h200-mig", H200, "mig", mig_slices("3g.71gb", 2)),  # two 3g.71gb slices to an H200: 16 halves
    Pool("t4-whole", T4, "whole", advertised("whole", 15360)),  # the node that goes NotReady for a while
    Pool("l4-vcuda", L4, "vcuda", advertised("vcuda", 23034)),  # a model the price sheet does not price
)}
FLAKY = "t4-whole"


@dataclass(frozen=True)
class Workload:
    name: str
    namespace: str  # VISION_TRAIN, VISION_SERVE or SPEECH
    pool: str
    limits: dict[str, int]
    utilisation: str
    share: float  # what it is billed at (as admitted: no request here costs more of its node's model)
    after_outage: bool = False  # created once its node is Ready again


WORKLOADS = [
    Workload("train-a100", VISION_TRAIN, "a100-gpushare", {"aliyun.com/gpu-mem": 20}, BUSY, 0.25),
    Workload("train-h200", VISION_TRAIN, "h200-mig", {"nvidia.com/mig-3g.71gb": 1}, IDLE, 0.875),
    Workload("serve-a100", VISION_SERVE, "a100-hami",
             {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20480, "nvidia.com/gpucores": 25}, IDLE, 0.25),
    Workload("serve-l4", VISION_SERVE, "l4-vcuda", {"tencent.com/vcuda-core": 50, "tencent.com/vcuda-memory": 8},
             BUSY, 0.5),
    Workload("asr-a100", SPEECH, "a100-gpushare", {"aliyun.com/gpu-mem": 10}, IDLE, 0.125),
    Workload("asr-before", SPEECH, FLAKY, {"nvidia.com/gpu": 1}, BUSY, 1.0),
    Workload("asr-after", SPEECH, FLAKY, {"nvidia.com/gpu": 2}, BUSY, 2.0, after_outage=True),
]


def instant(raw: str) -> dt.datetime:
    return dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))


def stamp(at: dt.datetime) -> str:
    """As the API server records a condition's time: whole seconds."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now() -> dt.datetime:
    return dt.datetime.now(UTC)


def micro(seconds: float) -> int:
    """A report's GPU-seconds (exact to the micro-GPU-second) as the integer they were computed from."""
    return round(seconds * MICRO)


def places(value: Fraction, digits: int) -> Fraction:
    """`value` rounded half to even to `digits` decimal places."""
    return Fraction(round(value * 10**digits), 10**digits)


@dataclass(frozen=True)
class Transition:
    """A change of a node's Ready condition: its lastTransitionTime as the API server recorded it, and when the
    controller's capacity task had read the change (its GPUs-down gauge)."""

    at: dt.datetime
    read_by: dt.datetime


@dataclass(frozen=True)
class Outage:
    """The T4 node's NotReady time, from the transition to False to the one back to True."""

    went: Transition
    came: Transition

    @property
    def start(self) -> dt.datetime:
        return self.went.at

    @property
    def end(self) -> dt.datetime:
        return self.came.at


@dataclass
class Run:
    """What the run recorded: the API server's objects, the simulated kubelet's record, the timekeeper's answers."""

    first: dt.date  # the window: the UTC days the run touched
    after: dt.date
    namespaces: dict[str, str]  # by key (VISION_TRAIN...): the namespace's name
    nodes: dict[str, dict[str, Any]]  # by pool key: its Node
    created: dict[str, dict[str, Any]]  # by pool key: its Node as the simulator made it (Ready)
    down_before: dict[str, int]  # by pool key: its down time the ledger had recorded as the outage began
    outage: Outage
    pods: dict[str, dict[str, Any]]  # by workload name: as the API server has it once it succeeded
    ran: dict[str, RunningPod]  # by workload name: what the simulated kubelet ran
    strangers: list[str]  # other namespaces' GPU pods the simulated kubelet ran on the test's nodes
    ledgers: dict[str, dict[str, Any]]  # by workload name: GET /api/v1/pods
    usage: dict[str, dict[str, Any]]  # by workload name: its line of the usage report grouped by pod
    usage_by_namespace: dict[str, dict[str, Any]]  # by namespace name
    node_hours: list[dict[str, Any]]  # GET /api/v1/utilization?per=node-hour: every node's, the cluster's
    utilization: list[dict[str, Any]]  # per=model: the cluster's line, then each model's
    usage_total: dict[str, Any]  # the usage report's total, read before and after `utilization` alike
    focus: str  # GET /api/v1/focus, the cluster's export
    prices: dict[str, Any]  # GET /api/v1/prices
    accounts: list[dict[str, Any]]  # GET /api/v1/accounts
    group_accounts: list[dict[str, Any]]  # GET /api/v1/accounts?budget=team.vision
    tenant: dict[str, requests.Response]  # what the tenant asked, and the answer
    before_the_sheet: requests.Response  # the export of the day before the day the sheet took effect

    def rows(self) -> list[dict[str, str]]:
        return list(csv.DictReader(io.StringIO(self.focus)))

    def lines_of(self, pool: str) -> list[dict[str, Any]]:
        name = self.nodes[pool]["metadata"]["name"]
        return [line for line in self.node_hours if line["node"] == name]

    def on(self, pool: str) -> list[Workload]:
        return [w for w in WORKLOADS if w.pool == pool]


def manifest(w: Workload, pool: Pool) -> dict[str, Any]:
    annotations = {RUNS_FOR: str(RUNS_SECONDS), METER: "simulated", UTILISATION: w.utilisation}
    template = pod_template(None, pool.name, annotations, restart="Never")
    template["spec"]["containers"][0]["resources"] = {"limits": dict(w.limits)}
    return pod(w.name, template)


# --- the timekeeper's API --------------------------------------------------------------------------------------------


def read(cluster: GpuSharing, path: str, token: str | None = None) -> Any:
    answer = cluster.timekeeper_call("GET", path, token or cluster.budget_admin_token())
    assert answer.status_code == 200, (path, answer.status_code, answer.text[:500])
    return answer.json()


def set_budget(cluster: GpuSharing, name: str, gpu_minutes: float, parent: str | None = None) -> None:
    body = {"gpuMinutes": gpu_minutes, "period": "monthly", **({"parent": parent} if parent else {})}
    answer = cluster.timekeeper_call("PUT", f"/api/v1/budgets/{name}", cluster.budget_admin_token(), body)
    assert answer.status_code in (200, 201), answer.text


def node_hours(cluster: GpuSharing, first: dt.date) -> list[dict[str, Any]]:
    after = now().date() + dt.timedelta(days=1)
    return list(read(cluster, f"/api/v1/utilization?from={first}&to={after}&per=node-hour")["items"])


def recorded_until(lines: list[dict[str, Any]], node: dict[str, Any]) -> dt.datetime:
    """How far the capacity ledger has recorded a node of GPUS GPUs: its capacity is GPUS × the time since its
    creation (a node first seen within the hour counts from it), in whole micro-GPU-seconds."""
    name = node["metadata"]["name"]
    capacity = sum(line["capacityMicroGpuSeconds"] for line in lines if line["node"] == name)
    return instant(node["metadata"]["creationTimestamp"]) + dt.timedelta(microseconds=capacity // GPUS)


def down(lines: list[dict[str, Any]], node: dict[str, Any]) -> int:
    return sum(line["downMicroGpuSeconds"] for line in lines if line["node"] == node["metadata"]["name"])


def next_second(lead: float = LEAD_SECONDS) -> dt.datetime:
    """The first whole second at least `lead` seconds from now."""
    return (now() + dt.timedelta(seconds=lead)).replace(microsecond=0) + dt.timedelta(seconds=1)


def gpus_down(cluster: GpuSharing) -> float:
    """The GPUs of the nodes that are not Ready, as the controller's capacity task last read its node cache."""
    lines = [line for line in cluster.controller_metrics().splitlines()
             if line.startswith("gpusharing_controller_gpus_down ")]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def set_ready(cluster: GpuSharing, node: str, ready: bool) -> Transition:
    """The node's Ready condition changed as its kubelet writes it (no node lifecycle controller runs here to change
    it), at the first whole second LEAD_SECONDS ahead; once the capacity task has read it."""
    down_before = gpus_down(cluster)
    condition = {"type": "Ready", "status": str(ready), "reason": "KubeletReady" if ready else "KubeletNotReady",
                 "message": "simulated" if ready else "container runtime network not ready",
                 "lastHeartbeatTime": stamp(now()), "lastTransitionTime": stamp(next_second())}
    written = cluster.rest("PATCH", f"/api/v1/nodes/{node}/status", {"status": {"conditions": [condition]}},
                           patch="strategic")
    (recorded,) = (c for c in written["status"]["conditions"] if c["type"] == "Ready")
    assert recorded["status"] == str(ready)
    wait_for(lambda: gpus_down(cluster) <= down_before - GPUS if ready else gpus_down(cluster) >= down_before + GPUS,
             f"the capacity task to read {node}'s Ready {ready}")
    return Transition(instant(recorded["lastTransitionTime"]), now())


def quiet_reads(cluster: GpuSharing, window: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The usage report's total and the utilization report, read while nothing was billed: the total read before and
    after the utilization report alike (other modules' pods may still be billed as this one ends)."""

    def read_both() -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        before = read(cluster, f"/api/v1/usage?{window}&groupBy=namespace")["total"]
        used = read(cluster, f"/api/v1/utilization?{window}")["items"]
        after = read(cluster, f"/api/v1/usage?{window}&groupBy=namespace")["total"]
        return (before, used) if before == after else None

    found = wait_for(read_both, "a usage report and a utilization report read while nothing was billed")
    assert found is not None
    return found


# --- the run ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(cluster: GpuSharing, nodes: NodeSimulator) -> Iterator[Run]:
    """The pools added; the teams' budgets; every pod run to success on its node, the T4 node NotReady for a while
    between its two pods; every bill closed and the capacity ledger past every pod's end and the node's return."""
    first = now().date()
    placed = {}
    for key, p in POOLS.items():
        (name,) = nodes.add_pool(p.name, 1, p.dialect, labels={PRODUCT: p.model.replace(" ", "-")},
                                 resources=p.resources)
        placed[key] = cluster.rest("GET", f"/api/v1/nodes/{name}")
    namespaces = {key: cluster.namespace(key) for key in (VISION_TRAIN, VISION_SERVE, SPEECH)}
    try:
        set_budget(cluster, GROUP, 6000)
        set_budget(cluster, namespaces[VISION_TRAIN], 600, parent=GROUP)
        set_budget(cluster, namespaces[VISION_SERVE], 600, parent=GROUP)
        set_budget(cluster, namespaces[SPEECH], 600)
        own = namespaces[VISION_TRAIN]
        cluster.bind(own, TENANT, "admin")
        tenant = cluster.token(own, TENANT)
        wait_for(lambda: cluster.timekeeper_call("GET", f"/api/v1/budgets/{own}", tenant).status_code == 200,
                 "the admin role aggregated for the tenant")

        for w in (w for w in WORKLOADS if not w.after_outage):
            cluster.create(namespaces[w.namespace], manifest(w, POOLS[w.pool]))
        flaky = placed[FLAKY]["metadata"]["name"]
        before = next(w for w in WORKLOADS if w.pool == FLAKY and not w.after_outage)
        wait_for(lambda: (cluster.pod(namespaces[before.namespace], before.name) or {}).get("status", {}).get("phase")
                 == "Succeeded", f"{before.name} to succeed before its node goes NotReady")

        # The outage: NotReady until the ledger has recorded some of it and for OUTAGE_SECONDS, then Ready again.
        lines = node_hours(cluster, first)
        down_before = {key: down(lines, node) for key, node in placed.items()}
        went = set_ready(cluster, flaky, False)
        wait_for(lambda: now() >= went.at + dt.timedelta(seconds=OUTAGE_SECONDS)
                 and down(node_hours(cluster, first), placed[FLAKY]) > down_before[FLAKY],
                 "the ledger to record the outage",
                 timeout=OUTAGE_SECONDS + 60)
        came = set_ready(cluster, flaky, True)
        wait_for(lambda: recorded_until(node_hours(cluster, first), placed[FLAKY]) >= came.at,
                 "the ledger to record the node's return")
        for w in (w for w in WORKLOADS if w.after_outage):
            cluster.create(namespaces[w.namespace], manifest(w, POOLS[w.pool]))

        def done() -> dict[str, dict[str, Any]]:
            """Every pod, once each succeeded and its bill closed; else nothing."""
            pods = {p["metadata"]["name"]: p for ns in namespaces.values() for p in cluster.pods(ns)}
            if len(pods) < len(WORKLOADS) or any(p["status"].get("phase") != "Succeeded" for p in pods.values()):
                return {}
            closed = {item["pod"]: item for ns in namespaces.values()
                      for item in read(cluster, f"/api/v1/pods?namespace={ns}")["items"]}
            return pods if all(closed.get(w.name, {}).get("endedAt") for w in WORKLOADS) else {}

        pods = wait_for(done, "every pod to succeed and its bill to close", timeout=120)
        ended = max(instant(c["state"]["terminated"]["finishedAt"])
                    for p in pods.values() for c in p["status"]["containerStatuses"])

        def passed() -> bool:
            lines = node_hours(cluster, first)
            return all(recorded_until(lines, node) >= max(ended, came.at) for node in placed.values())

        wait_for(passed, "the ledger past every pod's end and the T4 node's return")

        after = now().date() + dt.timedelta(days=1)
        window = f"from={first}&to={after}"
        ledgers = {item["pod"]: item for ns in namespaces.values()
                   for item in read(cluster, f"/api/v1/pods?namespace={ns}")["items"]}
        by_pod = {item["podUid"]: item for ns in namespaces.values()
                  for item in read(cluster, f"/api/v1/usage?{window}&groupBy=pod&namespace={ns}")["items"]}
        by_namespace = {item["namespace"]: item for ns in namespaces.values()
                        for item in read(cluster, f"/api/v1/usage?{window}&namespace={ns}")["items"]}
        usage_total, utilization = quiet_reads(cluster, window)
        focus = cluster.timekeeper_call("GET", f"/api/v1/focus?{window}", cluster.budget_admin_token())
        assert focus.status_code == 200, focus.text
        prices = read(cluster, "/api/v1/prices")
        # the day before the (one) sheet took effect
        sheet_day = min(instant(v["effectiveAt"]) for v in prices["versions"]).date()
        ran = {r.name: r for r in list(nodes.pods.values()) if r.namespace in namespaces.values()}
        mine = {node["metadata"]["name"] for node in placed.values()}
        strangers = [f"{r.namespace}/{r.name}" for r in list(nodes.pods.values())
                     if r.node in mine and r.namespace not in namespaces.values() and r.share is not None]
        yield Run(
            first, after, namespaces, {key: cluster.rest("GET", f"/api/v1/nodes/{n['metadata']['name']}")
                                       for key, n in placed.items()},
            placed, down_before, Outage(went, came), pods, ran, strangers, ledgers,
            {w.name: by_pod[pods[w.name]["metadata"]["uid"]] for w in WORKLOADS}, by_namespace,
            node_hours(cluster, first), utilization, usage_total, focus.text, prices,
            read(cluster, f"/api/v1/accounts?{window}")["items"],
            read(cluster, f"/api/v1/accounts?{window}&budget={GROUP}")["items"],
            {what: cluster.timekeeper_call("GET", path, tenant) for what, path in {
                "its own export": f"/api/v1/focus?{window}&namespace={own}",
                "its own accounts": f"/api/v1/accounts?{window}&budget={own}",
                "another namespace's export": f"/api/v1/focus?{window}&namespace={namespaces[SPEECH]}",
                "the cluster's export": f"/api/v1/focus?{window}",
                "the utilization report": f"/api/v1/utilization?{window}",
                "the node-hours": f"/api/v1/utilization?{window}&per=node-hour",
                "the cluster's accounts": f"/api/v1/accounts?{window}",
                "the group's accounts": f"/api/v1/accounts?{window}&budget={GROUP}",
            }.items()},
            cluster.timekeeper_call("GET", f"/api/v1/focus?from={sheet_day - dt.timedelta(days=1)}&to={sheet_day}",
                                    cluster.budget_admin_token()),
        )
    finally:
        delete_namespaces(cluster, *namespaces.values())


# --- the capacity ledger ---------------------------------------------------------------------------------------------


def test_every_node_hour_splits_exactly_into_allocated_unallocated_and_down(run: Run) -> None:
    """Every node's, the test's and the tier's other modules' alike."""
    wrong = [line for line in run.node_hours
             if line["allocatedMicroGpuSeconds"] - line["overMicroGpuSeconds"] + line["unallocatedMicroGpuSeconds"]
             + line["downMicroGpuSeconds"] != line["capacityMicroGpuSeconds"]
             or min(v for k, v in line.items() if k.endswith("MicroGpuSeconds")) < 0
             or line["idleMicroGpuSeconds"] > line["allocatedMicroGpuSeconds"]]
    assert not wrong, wrong
    assert {line["node"] for line in run.node_hours} >= {n["metadata"]["name"] for n in run.nodes.values()}
    for pool in POOLS:
        lines = run.lines_of(pool)
        assert {line["model"] for line in lines} == {POOLS[pool].model}, pool
        assert not [line for line in lines if line["overMicroGpuSeconds"]], pool


def test_the_not_ready_node_is_down_for_its_gpus_times_the_outage_as_the_api_server_recorded_it(run: Run) -> None:
    """From its Ready condition's lastTransitionTime to False to the one back to True, to the micro-GPU-second: no pod
    held it meanwhile. No other node was down meanwhile.

    The ledger cuts a node's time at the transition time it reads, and a pass reading the node as it was before
    counts the time up to that pass the way it was; so each transition here was written with its time a moment ahead
    (a kubelet's clock may be), and read by a capacity pass before that time came."""
    flaky = run.ran["asr-before"].node
    assert flaky == run.nodes[FLAKY]["metadata"]["name"]
    assert run.outage.went.read_by < run.outage.went.at and run.outage.came.read_by < run.outage.came.at, run.outage
    # its pods ran before and after the outage, as the API server recorded them
    assert instant(run.ran["asr-before"].recorded_end) <= run.outage.start
    assert instant(run.ran["asr-after"].recorded_start) >= run.outage.end
    (ready,) = (c for c in run.nodes[FLAKY]["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], instant(ready["lastTransitionTime"])) == ("True", run.outage.end)
    outage = run.outage.end - run.outage.start
    assert outage >= dt.timedelta(seconds=OUTAGE_SECONDS)
    down_since = {pool: sum(line["downMicroGpuSeconds"] for line in run.lines_of(pool)) - run.down_before[pool]
                  for pool in POOLS}
    assert down_since == {pool: GPUS * (outage // MICROSECOND) if pool == FLAKY else 0 for pool in POOLS}


def test_a_new_node_is_down_until_its_ready_condition_is_first_true(run: Run) -> None:
    """The simulator creates a Node, then writes its status (Ready since that whole second) in a second call: the node
    is down from its creation to that transition, as recorded; where a capacity pass read the Node between the two
    calls, to that pass, within the record's second and the node cache's lag."""
    for pool, node in run.created.items():
        (ready,) = (c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", pool
        not_ready = instant(ready["lastTransitionTime"]) - instant(node["metadata"]["creationTimestamp"])
        assert GPUS * (not_ready // MICROSECOND) <= run.down_before[pool] < GPUS * (
            (not_ready + dt.timedelta(seconds=2)) // MICROSECOND), pool


def test_each_nodes_capacity_is_its_gpus_for_the_time_recorded_since_its_creation(run: Run) -> None:
    """8 GPUs each, whatever the backend advertises (gpushare's gpu-count, HAMi's gpucores, 16 MIG halves of an H200,
    vcuda-core), from the node's creation to the ledger's last pass: the same pass for every node, past every pod's
    end."""
    ended = max(instant(r.recorded_end) for r in run.ran.values())
    for pool in POOLS:
        lines = run.lines_of(pool)
        assert sum(line["capacityMicroGpuSeconds"] for line in lines) % GPUS == 0, pool  # GPUS every microsecond
        assert all(line["capacityMicroGpuSeconds"] <= GPUS * GPU_HOUR for line in lines), pool
    (last_pass,) = {recorded_until(run.node_hours, node) for node in run.nodes.values()}
    assert ended <= last_pass <= now()


def recorded_seconds(ran: RunningPod) -> float:
    """From its startTime to its containers' finishedAt, as the simulated kubelet wrote them."""
    return (instant(ran.recorded_end) - instant(ran.recorded_start)).total_seconds()


def rounding(ran: RunningPod) -> float:
    """How far a pod's bill may be from its share × its recorded time, in GPU-seconds: each observation of it is
    rounded to the micro-GPU-second, one a billing pass (every 2 s here) and those opening and closing it."""
    return 0.5e-6 * (recorded_seconds(ran) / 2 + 3)


def test_each_node_is_allocated_what_its_pods_were_billed_and_what_the_simulated_kubelet_ran(run: Run) -> None:
    """A node's allocated time is its pods' bills, exactly (the usage report's); each bill is the pod's share for the
    time from its startTime to its containers' finishedAt as the simulated kubelet wrote them, within the rounding of
    each of the bill's observations to the micro-GPU-second (one a billing pass, 2 s here, and the one closing it).
    Its idle time is its idle pods' (their meters read 0 %), and none of the busy ones'."""
    # the test's nodes ran no other GPU pod (the manifests' Deployments' pods, which ask for none, run anywhere)
    assert {r.node for r in run.ran.values()} == {n["metadata"]["name"] for n in run.nodes.values()}
    assert run.strangers == []
    for w in WORKLOADS:
        ran, ledger = run.ran[w.name], run.ledgers[w.name]
        assert ran.node == run.nodes[w.pool]["metadata"]["name"] == ledger["node"], w.name
        assert ledger["gpuModel"] == POOLS[w.pool].model, w.name
        assert ledger["gpuShare"] == pytest.approx(w.share, rel=1e-12) and ran.share == pytest.approx(w.share), w.name
        assert recorded_seconds(ran) >= RUNS_SECONDS, w.name
        assert ledger["gpuSeconds"] == pytest.approx(NodeSimulator.recorded_gpu_seconds(ran), abs=rounding(ran)), w.name
        assert micro(run.usage[w.name]["gpuSeconds"]) == micro(ledger["gpuSeconds"]), w.name
    for pool in POOLS:
        lines, on = run.lines_of(pool), run.on(pool)
        allocated = sum(line["allocatedMicroGpuSeconds"] for line in lines)
        assert allocated == sum(micro(run.usage[w.name]["gpuSeconds"]) for w in on), pool
        recorded = sum(NodeSimulator.recorded_gpu_seconds(run.ran[w.name]) for w in on)
        assert allocated / MICRO == pytest.approx(recorded, abs=sum(rounding(run.ran[w.name]) for w in on)), pool
        idle = sum(line["idleMicroGpuSeconds"] for line in lines)
        assert idle == sum(round((run.usage[w.name]["idleGpuMinutes"] or 0) * 60 * MICRO) for w in on), pool
        assert (idle > 0) == any(w.utilisation == IDLE for w in on), pool


def test_the_utilization_reports_allocated_gpu_time_is_the_usage_reports(run: Run) -> None:
    """The whole cluster's, to the micro-GPU-second: both are the same hours of the pods' bills."""
    cluster, *models = run.utilization
    assert cluster["model"] is None
    assert cluster["allocatedMicroGpuSeconds"] == micro(run.usage_total["gpuSeconds"])
    assert cluster["allocatedGpuHours"] == pytest.approx(run.usage_total["gpuSeconds"] / 3600, rel=1e-12)
    for figure in ("capacity", "allocated", "idle", "unallocated", "down", "over"):
        assert sum(m[f"{figure}MicroGpuSeconds"] for m in models) == cluster[f"{figure}MicroGpuSeconds"], figure
    assert {m["model"] for m in models} >= {p.model for p in POOLS.values()}
    assert cluster["downMicroGpuSeconds"] >= GPUS * ((run.outage.end - run.outage.start) // MICROSECOND)


# --- the FOCUS export ------------------------------------------------------------------------------------------------


def test_the_export_passes_focus_validator_with_no_failure_of_its_own(run: Run, tmp_path: Path) -> None:
    data = tmp_path / "focus.csv"
    data.write_text(run.focus, encoding="ascii")
    verdict = validate(data)
    print(f"focus-validator on the run's export ({len(run.rows())} rows): {verdict.summary}")
    assert verdict.failures == {}, "\n".join([verdict.summary, *(f"{r}: {m}" for r, m in verdict.failures.items())])
    assert set(verdict.alternatives) <= {KNOWN_ALTERNATIVE}, verdict.alternatives


def price_in_force(prices: dict[str, Any], model: str, hour: dt.datetime) -> tuple[Fraction, Fraction] | None:
    """The list and contracted prices of `model` in `hour`, by the sheets GET /api/v1/prices shows as recorded: the
    sheet in force then (the newest in effect by then), its model's price from the latest day on or before it."""
    sheet = next((v for v in prices["versions"] if instant(v["effectiveAt"]) <= hour), None)
    entries = [] if sheet is None else sorted(
        (p for p in sheet["prices"] if p["model"] == model and dt.date.fromisoformat(p["from"]) <= hour.date()),
        key=lambda p: p["from"])
    if not entries:
        return None
    return Fraction(Decimal(entries[-1]["listPerGpuHour"])), Fraction(Decimal(entries[-1]["contractedPerGpuHour"]))


def test_the_price_sheet_is_the_tiers_in_force_from_the_first_whole_hour_after_it_was_recorded(run: Run) -> None:
    (recorded,) = run.prices["versions"]  # the timekeepers started with the same sheet: nothing new recorded
    assert run.prices["inForce"] == recorded
    assert {k: recorded[k] for k in ("currency", "prices")} == {
        "currency": PRICE_SHEET["currency"],
        "prices": sorted([{"contractedPerGpuHour": p.get("contractedPerGpuHour", p["listPerGpuHour"]), **p}
                          for p in PRICE_SHEET["prices"]], key=lambda p: (p["model"], p["from"]))}
    effective = instant(recorded["effectiveAt"])
    assert effective == instant(recorded["recordedAt"]).replace(minute=0, second=0, microsecond=0) + dt.timedelta(
        hours=1)
    assert recorded["source"].endswith("gpu-prices.yaml")
    assert effective <= min(instant(r.recorded_start) for r in run.ran.values())


def test_every_rows_costs_are_its_gpu_hours_times_the_price_of_its_model_in_force_in_its_hour(run: Run) -> None:
    """Quantities to 16 places and costs to 12, rounded half to even from the row's exact micro-GPU-seconds; a model
    without a price in its hour (the L4; any before the sheet's effectiveAt) costs 0 at unit prices of 0, and says
    so in x_Priced."""
    rows = run.rows()
    assert rows
    wrong = []
    for row in rows:
        consumed = int(row["x_ConsumedMicroGpuSeconds"])
        hour = instant(row["ChargePeriodStart"])
        price = price_in_force(run.prices, row["x_GpuModel"], hour)
        listed, contracted = price or (Fraction(0), Fraction(0))
        quantity = Fraction(consumed, GPU_HOUR)
        expected = {
            "PricingQuantity": places(quantity, 16), "ConsumedQuantity": places(quantity, 16),
            "ListUnitPrice": listed, "ContractedUnitPrice": contracted,
            "ListCost": places(quantity * listed, 12), "ContractedCost": places(quantity * contracted, 12),
            "EffectiveCost": places(quantity * contracted, 12), "BilledCost": places(quantity * contracted, 12),
        }
        written = {column: Fraction(Decimal(row[column])) for column in expected}
        if (written != expected or row["x_Priced"] != str(price is not None).lower()
                or row["BillingCurrency"] != PRICE_SHEET["currency"]
                or instant(row["ChargePeriodEnd"]) - hour != dt.timedelta(hours=1)):
            wrong.append({"row": row, "expected": {k: str(v) for k, v in expected.items()}})
    assert not wrong, json.dumps(wrong[:3], indent=1)
    # The test's namespaces' rows: priced on the sheet's models, the L4's unpriced.
    mine = [row for row in rows if row["SubAccountName"] in run.namespaces.values()]
    assert {row["x_GpuModel"] for row in mine} == {p.model for p in POOLS.values()}
    assert {row["x_Priced"] for row in mine if row["x_GpuModel"] == L4} == {"false"}
    assert {row["x_Priced"] for row in mine if row["x_GpuModel"] != L4} == {"true"}
    assert all(Decimal(row["ContractedCost"]) > 0 for row in mine if row["x_GpuModel"] != L4)


def test_each_namespaces_allocated_rows_add_up_to_its_usage_tagged_with_its_place_in_the_hierarchy(run: Run) -> None:
    rows = run.rows()
    for key, namespace in run.namespaces.items():
        own = [row for row in rows if row["SubAccountName"] == namespace]
        assert {(row["x_Category"], row["ChargeClass"]) for row in own} == {("allocated", "")}, namespace
        assert sum(int(row["x_ConsumedMicroGpuSeconds"]) for row in own) == micro(
            run.usage_by_namespace[namespace]["gpuSeconds"]), namespace
        assert micro(run.usage_by_namespace[namespace]["gpuSeconds"]) == sum(
            micro(run.usage[w.name]["gpuSeconds"]) for w in WORKLOADS if w.namespace == key), namespace
        cluster_name = own[0]["BillingAccountId"]
        path = f"{GROUP}/{namespace}" if key != SPEECH else namespace
        expected = {"gpusharing.io/cluster": cluster_name, "gpusharing.io/budget-path": path,
                    **({"gpusharing.io/team": GROUP} if key != SPEECH else {})}
        assert {row["Tags"] for row in own} == {json.dumps(expected, sort_keys=True, separators=(",", ":"))}
        assert {row["SubAccountId"] for row in own} == {f"{cluster_name}/{namespace}"}
    # the capacity nobody held is the cluster's own line
    assert {row["SubAccountName"] for row in rows if row["x_Category"] == "unallocated"} == {""}


# --- the accounts report ---------------------------------------------------------------------------------------------


def test_the_group_rolls_up_its_namespaces_gpu_hours_and_costs(run: Run) -> None:
    """Each namespace's own GPU time is its usage, and its cost the exact sum of its rows' GPU-hours × the contracted
    price, rounded once to the sheet's 6 places; the group's is the sum of its namespaces'."""
    accounts = {item["name"]: item for item in run.accounts}
    group = accounts[GROUP]
    children = [item for item in run.accounts if item["parent"] == GROUP]
    vision = {run.namespaces[VISION_TRAIN], run.namespaces[VISION_SERVE]}
    assert (group["kind"], group["parent"]) == ("group", "(cluster)")
    assert {c["name"] for c in children} == vision and {c["kind"] for c in children} == {"namespace"}
    assert accounts[run.namespaces[SPEECH]]["parent"] == "(cluster)"
    rows = run.rows()

    def exact_cost(namespaces: set[str]) -> Fraction:
        return sum((Fraction(int(row["x_ConsumedMicroGpuSeconds"]), GPU_HOUR) * Fraction(Decimal(
            row["ContractedUnitPrice"])) for row in rows if row["SubAccountName"] in namespaces), Fraction(0))

    for name in (*vision, run.namespaces[SPEECH]):
        account = accounts[name]
        assert account["ownMicroGpuSeconds"] == account["microGpuSeconds"] == micro(
            run.usage_by_namespace[name]["gpuSeconds"]), name
        assert Fraction(Decimal(account["cost"])) == places(exact_cost({name}), 6), name
    assert group["ownMicroGpuSeconds"] == 0
    assert group["microGpuSeconds"] == sum(c["microGpuSeconds"] for c in children) > 0
    assert group["gpuHours"] == pytest.approx(sum(c["gpuHours"] for c in children), rel=1e-12)
    assert Fraction(Decimal(group["cost"])) == places(exact_cost(vision), 6)
    # asked for the group alone: its subtree, the same figures
    assert run.group_accounts == [accounts[GROUP], *sorted(children, key=lambda c: c["name"])]


# --- tenants ---------------------------------------------------------------------------------------------------------


def test_a_tenant_exports_its_own_rows_and_reads_nothing_of_the_cluster(run: Run) -> None:
    answers = {what: answer.status_code for what, answer in run.tenant.items()}
    assert answers == {"its own export": 200, "its own accounts": 200, "another namespace's export": 403,
                       "the cluster's export": 403, "the utilization report": 403, "the node-hours": 403,
                       "the cluster's accounts": 403, "the group's accounts": 403}
    own = run.namespaces[VISION_TRAIN]
    exported = list(csv.DictReader(io.StringIO(run.tenant["its own export"].text)))
    assert exported == [row for row in run.rows() if row["SubAccountName"] == own]
    assert [item["name"] for item in run.tenant["its own accounts"].json()["items"]] == [own]


def test_a_window_before_the_price_sheet_took_effect_cannot_be_costed(run: Run) -> None:
    assert run.before_the_sheet.status_code == 409, run.before_the_sheet.text
    assert "no price sheet was in force in the window" in run.before_the_sheet.json()["error"]
