"""A day of several teams on a small GPU pool, with the real scheduler, controllers, webhook, timekeeper and meters.

vision trains a Deployment with a PodDisruptionBudget until its budget runs out: it is demoted, its running pods are
evicted within the disruption budget, once each, and its replacements are admitted over budget (never in budget, to
be evicted again). speech then fills the pool, and the scheduler preempts vision's demoted pods to make room. nlp's
Job completes. audio admits only pods whose deadline its budget covers. Every pod is billed what the API server
recorded of it (its share from its start to its containers' end), its meter's reports never adding more.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.cluster.nodes import METER, RUNS_FOR, NodeSimulator
from tests.cluster.workloads import create_all, delete_namespaces, pod, pod_template
from tests.e2e.system import ApiError, GpuSharing, wait_for

GPU = {"tencent.com/vcuda-core": 100, "tencent.com/vcuda-memory": 40}  # a whole device: 8 to a node
SLOTS = 16  # two nodes


def whole_gpu(template: dict[str, Any]) -> dict[str, Any]:
    template["spec"]["containers"][0]["resources"] = {"limits": dict(GPU)}
    return template


def events(cluster: GpuSharing, namespace: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.rest("GET", f"/api/v1/namespaces/{namespace}/events")["items"] if e["reason"] == reason]


def billed(cluster: GpuSharing, namespace: str) -> dict[str, dict[str, Any]]:
    answer = cluster.timekeeper_call("GET", f"/api/v1/pods?namespace={namespace}", cluster.budget_admin_token())
    return {item["podUid"]: item for item in answer.json()["items"]}


def test_a_day_of_several_teams(cluster: GpuSharing, nodes: NodeSimulator) -> None:
    cluster.require_controllers()
    nodes.add_pool("day", 2, "vcuda")
    nodes.add_pool("day-audio", 1, "vcuda")
    vision, speech, nlp, audio = (cluster.namespace(f"day-{team}") for team in ("vision", "speech", "nlp", "audio"))
    try:
        # vision: four trainers behind a disruption budget, metered by real meter processes; 30 GPU-seconds of budget.
        cluster.set_budget(vision, gpu_minutes=0.5, evict=True)
        trainers = whole_gpu(pod_template("vcuda", "day", {METER: "process"}, {"app": "train"}))
        cluster.create(vision, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "train"},
                                "spec": {"minAvailable": 3, "selector": {"matchLabels": {"app": "train"}}}})
        cluster.create(vision, {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "train"}, "spec": {
            "replicas": 4, "selector": {"matchLabels": {"app": "train"}}, "template": trainers}})
        # nlp: a Job of three pods that each run 4 s and complete.
        evaluation = whole_gpu(pod_template("vcuda", "day", {METER: "process", RUNS_FOR: "4"}, restart="Never"))
        cluster.create(nlp, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "eval"}, "spec": {
            "parallelism": 3, "completions": 3, "backoffLimit": 0, "template": evaluation}})

        # vision runs out: an Event, and its in-budget pods evicted within the disruption budget.
        on_namespace = {
            "fieldSelector": f"involvedObject.kind=Namespace,involvedObject.name={vision},reason=GPUBudgetExhausted"
        }
        wait_for(
            lambda: cluster.rest("GET", "/api/v1/events", query=on_namespace)["items"],
            "vision's budget to run out",
            timeout=120,
        )
        def in_budget() -> list:
            return [
                p for p in nodes.pods.values() if p.namespace == vision and p.priority_class == "gpusharing-in-budget"
            ]

        wait_for(
            lambda: len(in_budget()) >= 4 and all(p.stopped for p in in_budget()),
            "vision's in-budget pods to be evicted",
            timeout=180,
        )
        job = wait_for(
            lambda: (
                (j := cluster.rest("GET", f"/apis/batch/v1/namespaces/{nlp}/jobs/eval"))
                .get("status", {})
                .get("succeeded")
                == 3
                and j
            ),
            "nlp's Job to complete",
            timeout=120,
        )
        assert job["status"]["succeeded"] == 3

        # speech fills the pool: the scheduler preempts vision's demoted replacements to make room.
        def demoted() -> list:
            return [p for p in cluster.pods(vision) if p["spec"].get("priorityClassName") == "gpusharing-over-budget"]

        wait_for(
            lambda: sum(p["status"].get("phase") == "Running" for p in demoted()) == 4,
            "vision's demoted replacements running",
            timeout=120,
        )
        speakers = whole_gpu(pod_template("vcuda", "day", {METER: "simulated"}))
        made = create_all(cluster, speech, [pod(f"speak-{i:02d}", speakers) for i in range(SLOTS - 2)], clients=4)
        assert not made.refused
        wait_for(lambda: sum(p["status"].get("phase") == "Running" for p in cluster.pods(speech)) == SLOTS - 2,
                 "every speech pod running, room made by preemption", timeout=180)
        assert len(events(cluster, vision, "Preempted")) >= 2

        # audio admits a pod only when what its budget has left uncommitted covers the pod's deadline.
        cluster.timekeeper_call("PUT", f"/api/v1/budgets/{audio}", cluster.budget_admin_token(),
                                {"gpuMinutes": 10, "admission": "strict", "onShortfall": "refuse"})
        short = whole_gpu(pod_template("vcuda", "day-audio", {METER: "none"}))
        short["spec"]["activeDeadlineSeconds"] = 120  # two GPU-minutes
        for name, deadline, refusal in (("forever", None, "admits only GPU pods with a deadline"),
                                        ("too-long", 3600, "cannot cover this pod's deadline")):
            manifest = pod(name, short)
            if deadline is None:
                del manifest["spec"]["activeDeadlineSeconds"]
            else:
                manifest["spec"]["activeDeadlineSeconds"] = deadline
            with pytest.raises(ApiError, match=refusal):
                wait_for(lambda m=manifest: _admitted_or_refused(cluster, audio, m), "audio's commitments to be known")
        admitted = cluster.create(audio, pod("short", short))
        assert admitted["metadata"]["annotations"]["gpusharing.io/safe-admission"] == "reserved"

        # Each of vision's pods was evicted once; none of its replacements was admitted in budget.
        granted = Counter(name for name, status in cluster.plane.evictions(vision) if status == 201)
        assert sorted(granted) == sorted(p.name for p in in_budget()) and set(granted.values()) == {1}
        # the disruption budget held some back
        assert any(status == 429 for _, status in cluster.plane.evictions(vision))
        replacements = {p.uid: p.priority_class for p in nodes.pods.values() if p.namespace == vision} | {
            p["metadata"]["uid"]: p["spec"].get("priorityClassName") for p in cluster.pods(vision)}
        assert Counter(replacements.values())["gpusharing-in-budget"] == 4  # the four first pods, and no replacement

        # Billing is what ran: each pod's bill is what the API server recorded of it (its share from its start to its
        # containers' end, whole seconds), which the bill grown while it ran may pass by the second the end is rounded
        # down to and the kubelet's delay in writing it; its meter, which starts before the kubelet records the
        # start, adds at most as much.
        for namespace in (vision, nlp):
            stopped = [
                p
                for p in nodes.finished.values()
                if p.namespace == namespace and p.meter is not None and p.recorded_end
            ]
            assert stopped
            recorded = {p.uid: nodes.recorded_gpu_seconds(p) for p in stopped}
            observed = lambda ns=namespace: {  # noqa: E731
                uid: e["observedGpuSeconds"] for uid, e in billed(cluster, ns).items()
            }
            wait_for(
                lambda ns=namespace: (
                    observed(ns).keys() >= recorded.keys()
                    and all(  # type: ignore[misc]
                        observed(ns)[uid] >= seconds - 0.001 for uid, seconds in recorded.items()
                    )
                ),
                f"{namespace}'s bills closed",
            )
            ledger = billed(cluster, namespace)
            for running in stopped:
                entry, seconds = ledger[running.uid], recorded[running.uid]
                slack = 2 * (running.share or 0)  # two seconds of its share
                assert seconds - 0.001 <= entry["observedGpuSeconds"] <= seconds + slack, (running.name, seconds, entry)
                assert seconds - 0.001 <= entry["gpuSeconds"] <= seconds + slack, (running.name, seconds, entry)
    finally:
        delete_namespaces(cluster, vision, speech, nlp, audio)


def _admitted_or_refused(cluster: GpuSharing, namespace: str, manifest: dict[str, Any]) -> bool:
    """Creates the pod; raises the refusal once the webhook knows what the namespace committed (before, it admits
    the pod unchecked, which is then deleted and tried again)."""
    created = cluster.create(namespace, manifest)
    cluster.rest("DELETE", f"/api/v1/namespaces/{namespace}/pods/{created['metadata']['name']}")
    wait_for(lambda: cluster.pod(namespace, created["metadata"]["name"]) is None, "the unchecked pod gone")
    return False
