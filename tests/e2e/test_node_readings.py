"""The node's word on GPU utilisation on a real control plane (issue 31): a node agent's projected ServiceAccount
token, bound to its pod on a node, sends that node's readings (`POST /api/v1/node-readings`), and they outrank the
meter's; what TokenReview says of such a token; and what a hostile tenant would try: its own pods' tokens, a
ServiceAccount of the agent's name in its own namespace, speaking for another node's pod, and its meter posting
"busy" for its own idle pod.

No kubelet and no scheduler run here: pods are bound to Node objects the test creates, through `spec.nodeName`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpusharing.contract import TIMEKEEPER_TOKEN_AUDIENCE
from tests.e2e.system import ApiError, GpuSharing
from tests.e2e.test_tenancy import cpu_pod, gpu_pod

# Where the chart puts the node agent: a namespace of its own (privileged Pod Security, for its hostPath volumes), a
# ServiceAccount of its name, which the chart's timekeeper takes node readings from (TIMEKEEPER_NODE_AGENT_USERS).
AGENTS = AGENT_ACCOUNT = "gpusharing-node-agent"
WINDOW = 600.0  # fresh for 20 minutes: through the whole test, whatever the machine's load


class Nodes:
    """Two Nodes of this test, a node agent's pod on the first, and a tenant's GPU pod on each."""

    def __init__(self, gpusharing: GpuSharing):
        self.gpusharing = gpusharing
        self.tenant = gpusharing.namespace("e2e-node")
        self.a, self.b = f"{self.tenant}-gpu-a", f"{self.tenant}-gpu-b"
        for node in (self.a, self.b):
            gpusharing.rest("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        try:
            gpusharing.rest("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": AGENTS, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}})
            gpusharing.service_account(AGENTS, AGENT_ACCOUNT)
        except ApiError as exc:
            if exc.status != 409:  # made by an earlier test, or by the manifests
                raise
        self.agent = self.create(AGENTS, on(agent_pod(f"agent-{self.tenant}"), self.a, AGENT_ACCOUNT))
        self.mine = self.create(self.tenant, on(gpu_pod("mine"), self.a))
        self.theirs = self.create(self.tenant, on(gpu_pod("theirs"), self.b))

    def create(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        return self.gpusharing.create(namespace, pod)

    def agent_token(self) -> str:
        return self.gpusharing.token(AGENTS, AGENT_ACCOUNT, pod=self.agent)

    def pod_token(self, pod: dict[str, Any], account: str = "default") -> str:
        return self.gpusharing.token(pod["metadata"]["namespace"], account, pod=pod)

    def send(self, token: str, node: str, *pods: dict[str, Any], utilisation: float = 0.0) -> Any:
        body = {"node": node, "windowSeconds": WINDOW, "readings": [
            {"podUid": p["metadata"]["uid"], "namespace": p["metadata"]["namespace"], "pod": p["metadata"]["name"],
             "utilisationPercent": utilisation} for p in pods]}
        return self.gpusharing.timekeeper_call("POST", "/api/v1/node-readings", token, body)

    def meter(self, pod: dict[str, Any], seq: int, utilisation: float) -> None:
        metadata = pod["metadata"]
        body = {"podUid": metadata["uid"], "namespace": metadata["namespace"], "pod": metadata["name"], "gpuShare": 0.5,
                "seq": seq, "gpuSeconds": 0.0, "gpuUtilizationPercent": utilisation}
        answer = self.gpusharing.timekeeper_call("POST", "/api/v1/reports", self.pod_token(pod), body)
        assert answer.status_code == 200, answer.text

    def ledger(self, pod: dict[str, Any]) -> dict[str, Any]:
        answer = self.gpusharing.timekeeper_call(
            "GET", f"/api/v1/pods?namespace={self.tenant}", self.gpusharing.budget_admin_token()
        )
        return next(item for item in answer.json()["items"] if item["podUid"] == pod["metadata"]["uid"])


def agent_pod(name: str) -> dict[str, Any]:
    """A node agent's pod as far as the timekeeper cares (within restricted Pod Security all the same)."""
    container = {"name": "agent", "image": "gpusharing:e2e", "securityContext": {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True, "runAsUser": 65532,
        "seccompProfile": {"type": "RuntimeDefault"}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [container]}}


def on(pod: dict[str, Any], node: str, account: str | None = None) -> dict[str, Any]:
    """The pod bound to `node` (as the scheduler would bind it), running as `account` if given."""
    return {**pod, "spec": {**pod["spec"], "nodeName": node, **({"serviceAccountName": account} if account else {})}}


@pytest.fixture(scope="module")
def nodes(gpusharing: GpuSharing) -> Iterator[Nodes]:
    """The system's timekeeper taking node readings from the agent's ServiceAccount as the chart sets it."""
    with gpusharing.timekeeper_settings(TIMEKEEPER_NODE_AGENT_USERS=f"system:serviceaccount:{AGENTS}:{AGENT_ACCOUNT}"):
        yield Nodes(gpusharing)


def test_a_pod_bound_token_names_its_pod_and_node_in_the_token_review(nodes: Nodes) -> None:
    """What the timekeeper reads of an agent's token (kube-apiserver, ServiceAccountTokenPodNodeInfo): the pod's name
    and uid, and the node the pod was bound to when the token was issued (name and uid)."""
    review = nodes.gpusharing.rest("POST", "/apis/authentication.k8s.io/v1/tokenreviews", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": nodes.agent_token(), "audiences": [TIMEKEEPER_TOKEN_AUDIENCE]}})
    user = review["status"]["user"]
    assert user["username"] == f"system:serviceaccount:{AGENTS}:{AGENT_ACCOUNT}"
    extra = user["extra"]
    assert extra["authentication.kubernetes.io/pod-name"] == [nodes.agent["metadata"]["name"]]
    assert extra["authentication.kubernetes.io/pod-uid"] == [nodes.agent["metadata"]["uid"]]
    assert extra["authentication.kubernetes.io/node-name"] == [nodes.a]
    assert "authentication.kubernetes.io/node-uid" in extra


def test_the_agents_token_speaks_for_its_own_nodes_pods_and_outranks_the_tenants_meter(nodes: Nodes) -> None:
    nodes.meter(nodes.mine, 1, 97.0)  # the tenant's meters report first: their pods' ledgers open
    nodes.meter(nodes.theirs, 1, 97.0)
    answer = nodes.send(nodes.agent_token(), nodes.a, nodes.mine, nodes.theirs)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "accepted": 1,
        "ignored": [
            {
                "podUid": nodes.theirs["metadata"]["uid"],
                "reason": f"no pod of this uid is bound to node {nodes.a} (another node's, or unknown)",
            }
        ],
    }
    mine = nodes.ledger(nodes.mine)
    assert (mine["utilisationSource"], mine["gpuUtilizationPercent"]) == ("node", 0.0) and mine["idleSince"] is not None
    assert nodes.ledger(nodes.theirs)["utilisationSource"] == "meter"
    # The tenant's meter claims a busy GPU: the node's word stands, and the idle streak goes on.
    nodes.meter(nodes.mine, 2, 99.0)
    after = nodes.ledger(nodes.mine)
    assert (after["utilisationSource"], after["gpuUtilizationPercent"], after["idleSince"]) == (
        "node",
        0.0,
        mine["idleSince"],
    )
    assert after["lastReportAt"] is not None and after["seq"] == 2  # the report itself was accounted


def test_the_agents_token_may_not_speak_for_another_node(nodes: Nodes) -> None:
    answer = nodes.send(nodes.agent_token(), nodes.b, nodes.theirs)
    assert answer.status_code == 403
    assert f"runs on node {nodes.a}, not on node {nodes.b}" in answer.json()["error"]
    assert nodes.ledger(nodes.theirs)["utilisationSource"] == "meter"


def test_a_tenants_tokens_send_no_node_readings(nodes: Nodes) -> None:
    # Its own GPU pod's token, of a pod on the agent's node.
    answer = nodes.send(nodes.pod_token(nodes.mine), nodes.a, nodes.mine, utilisation=100.0)
    assert answer.status_code == 403 and "is not a node agent's token" in answer.json()["error"]
    # A ServiceAccount of the agent's name in its own namespace, a pod of it bound to the agent's node.
    nodes.gpusharing.service_account(nodes.tenant, AGENT_ACCOUNT)
    impostor = nodes.create(nodes.tenant, on(cpu_pod("impostor"), nodes.a, AGENT_ACCOUNT))
    answer = nodes.send(nodes.pod_token(impostor, AGENT_ACCOUNT), nodes.a, nodes.mine, utilisation=100.0)
    assert answer.status_code == 403
    assert f"system:serviceaccount:{nodes.tenant}:{AGENT_ACCOUNT} is not a node agent's token" in answer.json()["error"]
    # A token of the agent's ServiceAccount itself, had the tenant one, but bound to no pod, is refused too.
    unbound = nodes.gpusharing.token(AGENTS, AGENT_ACCOUNT)
    answer = nodes.send(unbound, nodes.a, nodes.mine, utilisation=100.0)
    assert answer.status_code == 403 and "not bound to a pod" in answer.json()["error"]
    assert nodes.ledger(nodes.mine)["gpuUtilizationPercent"] != 100.0
