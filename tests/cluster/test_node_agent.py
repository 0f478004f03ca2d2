"""The node's word on GPU utilisation in a cluster (issue 31): every simulated node of a pool runs the real node agent
(`gpusharing node-agent`, tests/cluster/nodeagents.py) with the projected token of an agent pod bound to that node,
reading the GPU trace the simulated kubelet plays for each pod (tests/cluster/nodes.py, NODE_UTILISATION).

- A Deployment's pod whose GPU the node sees idle (0 %) is warned of and demoted by the node's readings alone, while
  its own meter (the tenant's word) claims 100 % in every report; a busy pod (90 %) and a pod whose GPU the node cannot
  read (unknown) are neither warned of nor acted on.
- An agent's token speaking for another node's pod: that reading is ignored and the pod's ledger keeps its own
  node's word.
- The usage report's idle GPU-minutes of the idle pod are the node trace's: its share x the time the node's readings
  stood x (1 - 0 %).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.cluster.nodes import METER, NODE_UTILISATION, UTILISATION, NodeSimulator
from tests.cluster.test_controller import IDLE_INTERVAL, IN_BUDGET, deployment, events, granted, running
from tests.cluster.workloads import delete_namespaces, pod, pod_template
from tests.e2e.system import ApiError, GpuSharing, wait_for

# Where the chart puts the node agent, and whose readings the timekeeper takes by default (TIMEKEEPER_NODE_AGENT_USERS).
AGENTS = AGENT_ACCOUNT = "gpusharing-node-agent"
# Seconds between a node's batches (the agent's GPUSHARING_NODE_AGENT_INTERVAL_SECONDS). A streak goes on while its
# readings come within two windows and a batch is given up at the next beat: at 1 s, a timekeeper slowed past 1 s by
# a saturated CI host lost a batch, the meter's 100 % was heard in the gap and the streak began again (CI, twice).
AGENT_INTERVAL = 3.0
BILLING_INTERVAL = 2.0  # the cluster's TIMEKEEPER_BILLING_INTERVAL_SECONDS (tests/cluster/conftest.py)
AFTER, WARN_BEFORE = 16, 8  # the idle policy: warned after 8 s idle, demoted after 16 s (the webhook polls every 2 s)
POOL = "agents"


@dataclass
class Scene:
    """Two nodes with an agent each: on the first, the idle Deployment's pod and the unknown pod; on the second, the
    busy pod; all in one namespace under an idle policy that demotes."""

    namespace: str
    first: str
    second: str
    busy: dict[str, Any]
    unknown: dict[str, Any]


def on_node(template: dict[str, Any], node: str) -> dict[str, Any]:
    template["spec"]["nodeSelector"]["kubernetes.io/hostname"] = node
    return template


@pytest.fixture(scope="module")
def scene(cluster: GpuSharing, nodes: NodeSimulator) -> Iterator[Scene]:
    cluster.require_controllers()
    first, second = nodes.add_pool(POOL, 2, "whole")
    try:
        cluster.rest("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": AGENTS, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}})
        cluster.service_account(AGENTS, AGENT_ACCOUNT)
    except ApiError as exc:
        if exc.status != 409:  # made by the manifests
            raise
    for node in (first, second):
        nodes.run_node_agent(node, AGENTS, AGENT_ACCOUNT, AGENT_INTERVAL)
    namespace = cluster.namespace("agents")
    idle = {"after": f"{AFTER}s", "action": "demote", "warnBefore": f"{WARN_BEFORE}s", "utilisationPercent": 1}
    answer = cluster.timekeeper_call("PUT", f"/api/v1/budgets/{namespace}", cluster.budget_admin_token(),
                                     {"gpuMinutes": 6000, "period": "monthly", "idle": idle})
    assert answer.status_code in (200, 201), answer.text
    # The idle pod's meter says its GPU is busy in every report: the tenant's word.
    cluster.create(namespace, deployment("idle", 1, on_node(pod_template(
        "whole", POOL, {METER: "simulated", UTILISATION: "100", NODE_UTILISATION: "0"}), first)))
    busy = cluster.create(
        namespace,
        pod("busy", on_node(pod_template("whole", POOL, {METER: "simulated", NODE_UTILISATION: "90"}), second)),
    )
    unknown = cluster.create(
        namespace, pod("unknown", on_node(pod_template("whole", POOL, {METER: "simulated"}), first))
    )
    try:
        yield Scene(namespace, first, second, busy, unknown)
    finally:
        delete_namespaces(cluster, namespace)


def ledger(cluster: GpuSharing, namespace: str, uid: str) -> dict[str, Any] | None:
    answer = cluster.timekeeper_call("GET", f"/api/v1/pods?namespace={namespace}", cluster.budget_admin_token())
    assert answer.status_code == 200, answer.text
    return next((item for item in answer.json()["items"] if item["podUid"] == uid), None)


def ledger_once(cluster: GpuSharing, namespace: str, uid: str, field: str, value: Any, what: str) -> dict[str, Any]:
    """The pod's ledger once its `field` is `value` (None: once it is anything but None)."""
    def read() -> dict[str, Any]:
        found = ledger(cluster, namespace, uid) or {}
        return found if (found.get(field) is not None if value is None else found.get(field) == value) else {}
    return wait_for(read, f"pod {uid}'s ledger: {what}")


def nodes_word(cluster: GpuSharing, namespace: str, uid: str) -> dict[str, Any]:
    """The pod's ledger once its node's reading stands in it."""
    return ledger_once(cluster, namespace, uid, "utilisationSource", "node", "its node's reading taken")


def instant(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_an_agents_token_speaking_for_another_nodes_pod_is_ignored(
    cluster: GpuSharing, nodes: NodeSimulator, scene: Scene
) -> None:
    busy = scene.busy["metadata"]
    before = nodes_word(cluster, scene.namespace, busy["uid"])
    assert (before["gpuUtilizationPercent"], before["idleSince"]) == (90.0, None)
    # The first node's agent says the second node's pod is idle (over a five-minute window).
    token = nodes.agents[scene.first].token_file.read_text()
    claim = {"podUid": busy["uid"], "namespace": scene.namespace, "pod": busy["name"], "utilisationPercent": 0.0}
    answer = cluster.timekeeper_call("POST", "/api/v1/node-readings", token,
                                     {"node": scene.first, "windowSeconds": 300, "readings": [claim]})
    # Read at once: a reading taken would stand until the second node's agent next spoke (within an agent interval).
    after = ledger(cluster, scene.namespace, busy["uid"])
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "accepted": 0,
        "ignored": [
            {
                "podUid": busy["uid"],
                "reason": f"no pod of this uid is bound to node {scene.first} (another node's, or unknown)",
            }
        ],
    }
    assert after is not None
    assert (after["utilisationSource"], after["gpuUtilizationPercent"], after["idleSince"]) == ("node", 90.0, None)
    # Naming the other node in the batch is refused outright.
    answer = cluster.timekeeper_call("POST", "/api/v1/node-readings", token,
                                     {"node": scene.second, "windowSeconds": 300, "readings": [claim]})
    assert answer.status_code == 403, answer.text
    assert f"runs on node {scene.first}, not on node {scene.second}" in answer.json()["error"]
    after = ledger(cluster, scene.namespace, busy["uid"])
    assert after is not None and (after["gpuUtilizationPercent"], after["idleSince"]) == (90.0, None)


def test_an_idle_pod_is_demoted_by_its_nodes_readings_alone_and_its_idle_minutes_are_the_nodes(
    cluster: GpuSharing, nodes: NodeSimulator, scene: Scene,
) -> None:
    namespace = scene.namespace
    (idle,) = wait_for(lambda: running(cluster, namespace, "app=idle"), "the idle Deployment's pod running")
    assert idle["spec"]["priorityClassName"] == IN_BUDGET
    name, uid = idle["metadata"]["name"], idle["metadata"]["uid"]
    first = nodes_word(cluster, namespace, uid)
    assert first["gpuUtilizationPercent"] == 0.0 and first["idleSince"] is not None
    # Its meter says 100 % in every report and a streak goes on only from one source's readings: the streak began
    # with the node's first reading and stands on the node's readings alone.
    stood_from = instant(first["idleSince"])

    (warning,) = wait_for(
        lambda: events(cluster, namespace, "GPUIdleWarning", uid), "the GPUIdleWarning Event", AFTER + 60
    )
    assert "it will be demoted at" in warning["message"], warning["message"]
    (evicted,) = wait_for(lambda: granted(cluster, namespace), f"the eviction of {namespace}/{name}", AFTER + 60)
    assert evicted.pod == name
    (told,) = wait_for(lambda: events(cluster, namespace, "GPUIdle", uid), "the GPUIdle Event")
    assert "; evicted; ReplicaSet" in told["message"], told["message"]
    # The tenant's meter claimed a busy GPU all along, and was heard: its reports were taken, its word was not.
    idle_pod = nodes.pods[uid]
    heard = ledger(cluster, namespace, uid) or {}
    # heard again and again (as often as a busy host lets it)
    assert idle_pod.utilisation == 100.0 and heard.get("seq", 0) >= 2, heard

    # The busy pod and the unknown one: never warned of, never acted on.
    time.sleep(4 * IDLE_INTERVAL)  # a few more idle passes, each of which could have acted
    for other in (scene.busy, scene.unknown):
        other_uid = other["metadata"]["uid"]
        assert [
            e["reason"]
            for reason in ("GPUIdleWarning", "GPUIdle")
            for e in events(cluster, namespace, reason, other_uid)
        ] == []
        kept = ledger(cluster, namespace, other_uid)
        assert kept is not None and kept["idleSince"] is None and kept["idleWarnedAt"] is None, kept
    # The node's word on each: 90 %, and unknown (its driver can say nothing of that GPU), which is never idle.
    busy, unknown = (
        ledger(cluster, namespace, other["metadata"]["uid"]) or {} for other in (scene.busy, scene.unknown)
    )
    assert (busy["utilisationSource"], busy["gpuUtilizationPercent"]) == ("node", 90.0), busy
    assert (unknown["utilisationSource"], unknown["gpuUtilizationPercent"]) == ("node", None), unknown
    assert [(a.pod, a.code) for a in cluster.plane.eviction_answers(namespace)] == [(name, 201)]

    # The usage report's idle GPU-minutes: the node trace's 0 % over the time its readings stood, from the first
    # one (the streak's start, unbroken until the eviction) to the end of the pod's containers (as this kubelet
    # recorded it).
    wait_for(lambda: idle_pod.recorded_end, "the evicted pod's containers stopped")
    closed = ledger_once(cluster, namespace, uid, "endedAt", None, "the evicted pod's bill closed")
    assert closed["idleSince"] == first["idleSince"], "the node's readings stood without a break"
    stood = (instant(idle_pod.recorded_end) - stood_from).total_seconds()
    assert idle_pod.share == 1.0 and stood >= AFTER - 1, (idle_pod.share, stood)  # a whole GPU, idle past the deadline
    expected = idle_pod.share * stood / 60
    today = dt.datetime.now(dt.timezone.utc).date()
    answer = cluster.timekeeper_call(
        "GET",
        f"/api/v1/usage?namespace={namespace}&groupBy=pod&from={stood_from.date()}&to={today + dt.timedelta(days=1)}",
        cluster.budget_admin_token(),
    )
    assert answer.status_code == 200, answer.text
    (row,) = [item for item in answer.json()["items"] if item["podUid"] == uid]
    minutes = row["idleGpuMinutes"]
    # The slack, in the protocol's units: both ends are whole seconds as the API and the kubelet write them (1 s);
    # the charge that straddles the first reading is idle whole though part of its evidence came before it (at most
    # one billing interval: the record's observations, the meter's 1 s reports being shorter); and a batch late by up
    # to one agent interval lets the node's reading go stale (fresh for two windows), the meter's 100 % then counting
    # for that charge. So share x (1 s + billing interval + agent interval).
    slack = idle_pod.share * (1 + BILLING_INTERVAL + AGENT_INTERVAL) / 60
    print(f"\nidle pod: the node's readings stood {stood:.0f} s; idle GPU-minutes {minutes:.4f}, the node trace's "
          f"{expected:.4f} (of {row['gpuMinutes']:.4f} billed)")
    assert abs(minutes - expected) <= slack, (minutes, expected, slack)
