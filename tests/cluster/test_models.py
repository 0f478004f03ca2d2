"""Billed for the GPU it got (issue 43): a pod is billed on the GPU model of the node it runs on, on the real control
plane (kube-apiserver, kube-scheduler, etcd) with simulated nodes.

The nodes are labelled as NVIDIA's GPU feature discovery labels them (`nvidia.com/gpu.product`) and advertise what
their backend's device plugin advertises for their model's memory: A100 80 GB and T4 nodes under gpushare (GiB of
`aliyun.com/gpu-mem`), HAMi (MiB of `nvidia.com/gpumem`) and KAI (the NVIDIA device plugin's whole GPUs), H200 nodes
cut into `3g.71gb` MIG slices, and a GPU node no product label names (its pods billed on the catalogue's default
model). Every pod names no GPU model (a tenant's own, below, excepted): it is steered to its node by the simulator's
pool label alone, and kube-scheduler binds it; KAI's pods name kai-scheduler, which does not run here, so the test
binds them as KAI's binder does (the Binding subresource). Each runs a few seconds and succeeds.

It shows that
- each pod is billed its request priced on its node's model: a memory size as a fraction of that model's memory, a MIG
  profile as a slice of that model; never below the share the webhook admitted it at (read on the default model);
- each pod has one GPU model in the usage report (grouped by pod and model), and it is its node's;
- each pod's GPU-seconds are that share for the time the API server recorded it running (its startTime to its
  containers' finishedAt), to the micro-GPU-second: a bill grown past the end while it ran is corrected when the end
  arrives; the usage report's are the same;
- a tenant who names a bigger GPU than it runs on (HAMi's `nvidia.com/use-gputype`, which kube-scheduler ignores), to
  be admitted at the bigger GPU's smaller share, is billed on the T4 it runs on;
- a pod whose meter reports before the kubelet records its start, so that the web timekeeper (which reads the
  reporting pod's node) charges it first, is billed on its node's model too: the model is fixed at the first charge;
- a GPU node without a product label bills its pods on the catalogue's default model, and is flagged by one
  `GPUModelUnknown` Warning Event about the Node (none about the labelled nodes).

The timekeeper and its controller run as the manifests' ServiceAccounts (tests/e2e/system.py): their RBAC must let the
controller list and watch nodes (it bills nothing without its node cache) and the web timekeeper get a node.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpusharing.contract import ANNOTATION_GPU_MODEL, ANNOTATION_GPU_SHARE
from gpusharing.gpu.catalogue import GpuModel, shipped_catalogue
from gpusharing.gpu.request import GpuRequestSettings, parse_gpu_request
from tests.cluster.nodes import (
    METER,
    POOL_LABEL,
    RECORDS_START_AFTER,
    RUNS_FOR,
    NodeSimulator,
    advertised,
    mig_slices,
)
from tests.cluster.workloads import delete_namespaces, pod, pod_template
from tests.e2e.system import GpuSharing, wait_for

CATALOGUE = shipped_catalogue()
A100, T4, H200 = "NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA H200"
PRODUCT = "nvidia.com/gpu.product"  # GPU feature discovery's label: the model's name, its spaces as dashes
RUNS_SECONDS = 3
# Seconds the slow kubelet takes to record the start: its meter (simulated) reports as the pod starts, and every second
# after.
REPORTED_FIRST_AFTER = 5
BILLING_INTERVAL_SECONDS = 2  # the cluster fixture's TIMEKEEPER_BILLING_INTERVAL_SECONDS
GPU_MODEL_UNKNOWN = "GPUModelUnknown"

GPUSHARE = {"aliyun.com/gpu-mem": 5}  # GiB
HAMI = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 6000, "nvidia.com/gpucores": 5}  # MiB; 5 % of the compute
KAI = {"gpu-memory": "2000"}  # MiB, an annotation
MIG = {"nvidia.com/mig-3g.71gb": 1}


@dataclass(frozen=True)
class Pool:
    """Nodes of one GPU model (None: no product label) under one backend."""

    name: str
    model: str | None
    dialect: str  # the simulator's label of the backend
    resources: dict[str, str]

    @property
    def billed_model(self) -> GpuModel:
        model = CATALOGUE.by_name(self.model) if self.model else CATALOGUE.default
        assert model is not None
        return model


def pool(name: str, model: str | None, backend: str) -> Pool:
    """A pool of `model` (None: unlabelled, with an A100's memory) advertising what `backend` does for its memory."""
    gpu = CATALOGUE.by_name(model or A100)
    assert gpu is not None
    return Pool(f"gpu-models-{name}", model, backend, advertised(backend, gpu.memory_mib))


POOLS = {
    p.name.removeprefix("gpu-models-"): p
    for p in (
        pool("a100-gpushare", A100, "aliyun"),
        pool("t4-gpushare", T4, "aliyun"),
        pool("a100-hami", A100, "hami"),
        pool("t4-hami", T4, "hami"),
        pool("a100-kai", A100, "whole"),
        pool("t4-kai", T4, "whole"),
        Pool("gpu-models-h200-mig", H200, "mig", mig_slices("3g.71gb", 2)),  # two 3g.71gb slices to an H200
        pool("unlabelled", None, "aliyun"),
    )
}


@dataclass(frozen=True)
class Workload:
    name: str
    pool: str
    limits: dict[str, int] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    kai: bool = False  # KAI's: scheduled (here: bound) by KAI Scheduler


WORKLOADS = [
    Workload("gpushare-a100", "a100-gpushare", GPUSHARE),
    Workload("gpushare-t4", "t4-gpushare", GPUSHARE),
    Workload("hami-a100", "a100-hami", HAMI),
    Workload("hami-t4", "t4-hami", HAMI),
    Workload("kai-a100", "a100-kai", annotations=KAI, kai=True),
    Workload("kai-t4", "t4-kai", annotations=KAI, kai=True),
    Workload("mig-h200", "h200-mig", MIG),
    # A tenant names the H200 (HAMi's scheduler would place it on one; kube-scheduler ignores the annotation) and
    # steers it to a T4 node.
    Workload("names-h200", "t4-hami", HAMI, {"nvidia.com/use-gputype": "H200"}),
    # Its meter reports for seconds before the kubelet records that it started: a report is its first charge.
    Workload("reported-first", "t4-gpushare", GPUSHARE,
             {METER: "simulated", RECORDS_START_AFTER: str(REPORTED_FIRST_AFTER)}),
    Workload("unlabelled", "unlabelled", GPUSHARE),
]


@dataclass
class Billed:
    """What the API server recorded of each pod, and what the timekeeper billed it."""

    namespace: str
    nodes: dict[str, dict[str, Any]]  # by pool key: its (one) Node
    pods: dict[str, dict[str, Any]]  # by name: as the API server has it once it succeeded
    ledgers: dict[str, dict[str, Any]]  # by name: GET /api/v1/pods
    usage: dict[str, list[dict[str, Any]]]  # by name: its rows of the usage report grouped by pod and model
    events: list[dict[str, Any]]  # every GPUModelUnknown Event about a Node, once the unlabelled node's was sent

    def node_model(self, name: str) -> GpuModel:
        return POOLS[workload(name).pool].billed_model

    def admitted(self, name: str) -> float:
        return float(self.pods[name]["metadata"]["annotations"][ANNOTATION_GPU_SHARE])

    def priced_on_node(self, name: str) -> float:
        """The pod's request as the webhook read it when it was created, priced on its node's model: read without
        the spec.nodeName it was bound to since, which HAMi's admission rules refuse in a pod."""
        stored = self.pods[name]
        unbound = {**stored, "spec": {k: v for k, v in stored["spec"].items() if k != "nodeName"}}
        gpu = parse_gpu_request(unbound, GpuRequestSettings(), on_model=self.node_model(name))
        assert gpu is not None
        return float(gpu.share)

    def recorded_seconds(self, name: str) -> float:
        """From its startTime to its containers' latest finishedAt, as the API server recorded them."""
        status = self.pods[name]["status"]
        ends = [c["state"]["terminated"]["finishedAt"]
                for c in [*status.get("containerStatuses", []), *status.get("initContainerStatuses", [])]]
        return (instant(max(ends)) - instant(status["startTime"])).total_seconds()


def workload(name: str) -> Workload:
    return next(w for w in WORKLOADS if w.name == name)


def instant(raw: str) -> dt.datetime:
    return dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))


def manifest(w: Workload) -> dict[str, Any]:
    template = pod_template(None, POOLS[w.pool].name, {RUNS_FOR: str(RUNS_SECONDS), METER: "none", **w.annotations},
                            restart="Never")
    if w.limits:
        template["spec"]["containers"][0]["resources"] = {"limits": dict(w.limits)}
    if w.kai:
        template["metadata"]["labels"]["kai.scheduler/queue"] = "default-queue"
        template["spec"]["schedulerName"] = "kai-scheduler"
    return pod(w.name, template)


def ledgers(cluster: GpuSharing, namespace: str) -> dict[str, dict[str, Any]]:
    answer = cluster.timekeeper_call("GET", f"/api/v1/pods?namespace={namespace}", cluster.budget_admin_token())
    assert answer.status_code == 200, answer.text
    return {item["pod"]: item for item in answer.json()["items"]}


def usage_by_pod_and_model(cluster: GpuSharing, namespace: str) -> list[dict[str, Any]]:
    today = dt.datetime.now(dt.timezone.utc).date()
    query = f"from={today - dt.timedelta(days=1)}&to={today + dt.timedelta(days=2)}&groupBy=pod,model"
    answer = cluster.timekeeper_call("GET", f"/api/v1/usage?{query}&namespace={namespace}",
                                     cluster.budget_admin_token())
    assert answer.status_code == 200, answer.text
    return list(answer.json()["items"])


def node_events(cluster: GpuSharing, reason: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind=Node,reason={reason}"
    return list(cluster.rest("GET", "/api/v1/events", query={"fieldSelector": selector})["items"])


def unknown_flagged(cluster: GpuSharing, node: str) -> list[dict[str, Any]]:
    """Every GPUModelUnknown Event about a Node, once one is about `node`; else nothing."""
    events = node_events(cluster, GPU_MODEL_UNKNOWN)
    return events if any(e["involvedObject"]["name"] == node for e in events) else []


@pytest.fixture(scope="module")
def billed(cluster: GpuSharing, nodes: NodeSimulator) -> Iterator[Billed]:
    """The pools added, every workload run to success on its node and its bill closed."""
    placed = {}
    for key, p in POOLS.items():
        (name,) = nodes.add_pool(p.name, 1, p.dialect, labels={PRODUCT: p.model.replace(" ", "-")} if p.model else {},
                                 resources=p.resources)
        placed[key] = cluster.rest("GET", f"/api/v1/nodes/{name}")
    namespace = cluster.namespace("gpu-models")
    try:
        for w in WORKLOADS:
            cluster.create(namespace, manifest(w))
        for w in (w for w in WORKLOADS if w.kai):  # KAI's binder, as kai-scheduler would bind it to its pool's node
            target = placed[w.pool]["metadata"]["name"]
            cluster.rest("POST", f"/api/v1/namespaces/{namespace}/pods/{w.name}/binding", {
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": w.name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": target}})

        def done() -> dict[str, dict[str, Any]]:
            """Every pod's bill, once each succeeded and its bill closed; else nothing."""
            pods = {p["metadata"]["name"]: p for p in cluster.pods(namespace)}
            if len(pods) < len(WORKLOADS) or any(p["status"].get("phase") != "Succeeded" for p in pods.values()):
                return {}
            closed = ledgers(cluster, namespace)
            return closed if all(closed.get(w.name, {}).get("endedAt") for w in WORKLOADS) else {}

        def progress() -> str:
            closed = {name for name, item in ledgers(cluster, namespace).items() if item.get("endedAt")}
            pods = sorted((p["metadata"]["name"], p["status"].get("phase")) for p in cluster.pods(namespace))
            return "; ".join(f"{name} {phase}, bill {'closed' if name in closed else 'open'}" for name, phase in pods)

        # A minute on a quiet machine; CI runs this tier beside the e2e tier.
        closed = wait_for(done, "every pod to succeed and its bill to close", timeout=300, found=progress)
        pods = {p["metadata"]["name"]: p for p in cluster.pods(namespace)}
        rows = usage_by_pod_and_model(cluster, namespace)
        yield Billed(
            namespace, placed, pods, closed,
            {w.name: [r for r in rows if r["podUid"] == pods[w.name]["metadata"]["uid"]] for w in WORKLOADS},
            # The controller's Events queue may still hold those of every unlabelled node the tier made before.
            wait_for(lambda: unknown_flagged(cluster, placed["unlabelled"]["metadata"]["name"]),
                     "the GPUModelUnknown Event about the unlabelled node", timeout=180),
        )
    finally:
        delete_namespaces(cluster, namespace)


def test_every_pod_ran_where_it_was_steered_naming_no_model(billed: Billed) -> None:
    for w in WORKLOADS:
        stored = billed.pods[w.name]
        assert stored["spec"]["nodeName"] == billed.nodes[w.pool]["metadata"]["name"], w.name
        assert stored["spec"]["nodeSelector"] == {POOL_LABEL: POOLS[w.pool].name}, w.name
        if w.name != "names-h200":  # admitted on the default model: nothing better is known before it is bound
            assert stored["metadata"]["annotations"][ANNOTATION_GPU_MODEL] == CATALOGUE.default.name, w.name


def test_each_pod_is_billed_its_request_priced_on_its_nodes_model_never_below_what_was_admitted(billed: Billed) -> None:
    wrong = [
        f"{w.name} on {billed.node_model(w.name).name}: billed {billed.ledgers[w.name]['gpuShare']}, "
        f"admitted {billed.admitted(w.name)}, priced on its node {billed.priced_on_node(w.name)}"
        for w in WORKLOADS
        if billed.ledgers[w.name]["gpuShare"]
        != pytest.approx(max(billed.admitted(w.name), billed.priced_on_node(w.name)), rel=1e-12)
    ]
    assert not wrong, "\n".join(wrong)
    # A memory size costs more of a T4 (15 GiB) than of an A100 (80 GiB), in every dialect.
    for dialect in ("gpushare", "hami", "kai"):
        on_a100, on_t4 = (billed.ledgers[f"{dialect}-{m}"]["gpuShare"] for m in ("a100", "t4"))
        assert on_a100 == pytest.approx(billed.admitted(f"{dialect}-a100")), dialect  # admitted on the default A100
        assert on_t4 > 4 * on_a100, dialect
    assert billed.ledgers["gpushare-t4"]["gpuShare"] == pytest.approx(5120 / 15360, rel=1e-12)
    # A 3g.71gb slice is half an H200, less than the 7/8 of an A100 it was admitted at: billed as admitted.
    assert billed.priced_on_node("mig-h200") == 0.5
    assert billed.ledgers["mig-h200"]["gpuShare"] == billed.admitted("mig-h200") == 0.875


def test_each_pod_has_one_model_in_the_usage_report_its_nodes(billed: Billed) -> None:
    assert {billed.node_model(w.name).name for w in WORKLOADS} == {A100, T4, H200}
    wrong = [
        f"{w.name} on {billed.node_model(w.name).name}: billed on {billed.ledgers[w.name]['gpuModel']}, "
        f"in the usage report on {[row['model'] for row in billed.usage[w.name]]}"
        for w in WORKLOADS
        if billed.ledgers[w.name]["gpuModel"] != billed.node_model(w.name).name
        or [row["model"] for row in billed.usage[w.name]] != [billed.node_model(w.name).name]
    ]
    assert not wrong, "\n".join(wrong)
    for w in WORKLOADS:  # the report's GPU-seconds are the pod's bill, to the micro-GPU-second
        assert billed.usage[w.name][0]["gpuSeconds"] == pytest.approx(billed.ledgers[w.name]["gpuSeconds"], abs=1e-6)


def test_each_pod_is_billed_its_share_for_the_time_the_api_server_recorded_it_running(billed: Billed) -> None:
    """Not a second past its recorded end: a bill grown while the pod ran past the finishedAt its kubelet wrote a
    moment later is corrected when the end arrives (docs/budgets.md, "Never past the record")."""
    for w in WORKLOADS:
        entry, seconds = billed.ledgers[w.name], billed.recorded_seconds(w.name)
        assert seconds >= RUNS_SECONDS, w.name
        recorded = entry["gpuShare"] * seconds
        # Each observation is rounded to the micro-GPU-second: one every billing pass, and the one that closes it.
        rounding = 0.5e-6 * (seconds / BILLING_INTERVAL_SECONDS + 3)
        for billed_as in ("observedGpuSeconds", "gpuSeconds"):
            assert entry[billed_as] == pytest.approx(recorded, abs=rounding), (w.name, seconds, entry)


def test_a_tenant_naming_a_bigger_gpu_is_billed_on_the_t4_it_runs_on(billed: Billed) -> None:
    annotations = billed.pods["names-h200"]["metadata"]["annotations"]
    assert annotations["nvidia.com/use-gputype"] == "H200"
    assert annotations[ANNOTATION_GPU_MODEL] == H200  # admitted at an H200's share, smaller than the default's
    assert billed.admitted("names-h200") < billed.admitted("hami-a100")
    entry = billed.ledgers["names-h200"]
    assert entry["gpuModel"] == T4
    assert entry["gpuShare"] == pytest.approx(billed.priced_on_node("names-h200"), rel=1e-12)
    assert entry["gpuShare"] == billed.ledgers["hami-t4"]["gpuShare"] > 5 * billed.admitted("names-h200")


def test_a_pod_first_charged_on_its_meters_report_is_billed_on_its_nodes_model(billed: Billed) -> None:
    entry = billed.ledgers["reported-first"]
    # its ledger was opened by its meter's report, through the web timekeeper, before the start was on record
    assert entry["firstReportAt"] is not None and entry["meteredGpuSeconds"] > 0, entry
    assert instant(entry["firstReportAt"]) < instant(entry["startedAt"]), entry
    assert instant(entry["startedAt"]) == instant(billed.pods["reported-first"]["status"]["startTime"])
    assert entry["gpuModel"] == T4
    assert entry["gpuShare"] == billed.ledgers["gpushare-t4"]["gpuShare"]


def test_a_gpu_node_without_a_product_label_bills_on_the_default_model_and_is_flagged_once(billed: Billed) -> None:
    node = billed.nodes["unlabelled"]
    assert PRODUCT not in node["metadata"]["labels"]
    entry = billed.ledgers["unlabelled"]
    assert entry["gpuModel"] == CATALOGUE.default.name
    assert entry["gpuShare"] == billed.ledgers["gpushare-a100"]["gpuShare"] == pytest.approx(5 / 80)
    about = [e for e in billed.events if e["involvedObject"]["name"] == node["metadata"]["name"]]
    assert len(about) == 1, about
    (event,) = about
    assert event["type"] == "Warning" and event.get("count", 1) == 1, event
    assert event["involvedObject"]["uid"] == node["metadata"]["uid"]
    assert f"billed on the catalogue's default model, {CATALOGUE.default.name}" in event["message"], event["message"]
    labelled = {n["metadata"]["name"] for key, n in billed.nodes.items() if key != "unlabelled"}
    assert not [e for e in billed.events if e["involvedObject"]["name"] in labelled]
