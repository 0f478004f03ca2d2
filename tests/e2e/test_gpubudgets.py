"""GPUBudget and ClusterGPUBudget on the real API server: the CRDs of manifests/ (their CEL rules refuse what they
must), the timekeeper's controller writing budgets into its ledger and their status back, the REST API's 409 for
a namespace a resource owns, hierarchy, warnings (Events, admission warnings), RBAC, `kubectl get`, and leader
election through a Lease."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import requests
import yaml

from demo.apiserver import EXAMPLES
from tests.e2e.system import CONTROLLER_ACCOUNT, SYSTEM_NAMESPACE, ApiError, GpuSharing, wait_for
from tests.e2e.test_timekeeper import events, gpu_pod
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.leader import LEASE_NAME, LeaderElection

GROUP = "/apis/gpusharing.io/v1alpha1"


def gpu_budget(namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpusharing.io/v1alpha1",
        "kind": "GPUBudget",
        "metadata": {"name": "budget", "namespace": namespace},
        "spec": spec,
    }


def cluster_budget(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpusharing.io/v1alpha1",
        "kind": "ClusterGPUBudget",
        "metadata": {"name": name},
        "spec": spec,
    }


def budget_path(namespace: str) -> str:
    return f"{GROUP}/namespaces/{namespace}/gpubudgets"


def status_of(gpusharing: GpuSharing, path: str) -> dict[str, Any]:
    return dict(gpusharing.rest("GET", path).get("status") or {})


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


def refusal(gpusharing: GpuSharing, path: str, body: dict[str, Any]) -> str:
    with pytest.raises(ApiError) as refused:
        gpusharing.rest("POST", path, body)
    assert refused.value.status == 422, refused.value.message
    return refused.value.message


def test_the_api_server_refuses_what_the_crds_cel_rules_forbid(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-cel")
    path = budget_path(namespace)
    named = {**gpu_budget(namespace, gpuMinutes=10), "metadata": {"name": "mine", "namespace": namespace}}
    assert "a namespace has one GPUBudget, and it is named budget" in refusal(gpusharing, path, named)
    assert "set either gpuMinutes (GPU-minutes per period) or unlimited: true" in refusal(
        gpusharing, path, gpu_budget(namespace, gpuMinutes=10, unlimited=True))
    assert "set either gpuMinutes" in refusal(gpusharing, path, gpu_budget(namespace, period="daily"))
    assert "gpuMinutes is a number of GPU-minutes from 0 to 1e12" in refusal(
        gpusharing, path, gpu_budget(namespace, gpuMinutes=-1)
    )
    assert "warning thresholds must be strictly increasing" in refusal(
        gpusharing, path, gpu_budget(namespace, gpuMinutes=10, warningThresholds=[95, 80]))
    assert "each warning threshold is a whole percent from 1 to 99" in refusal(
        gpusharing, path, gpu_budget(namespace, gpuMinutes=10, warningThresholds=[50, 100]))
    assert "parent is a group budget's name" in refusal(
        gpusharing, path, gpu_budget(namespace, gpuMinutes=10, parent="vision")
    )
    clusters = f"{GROUP}/clustergpubudgets"
    assert "a ClusterGPUBudget is named as its group" in refusal(
        gpusharing, clusters, cluster_budget("vision", gpuMinutes=1)
    )
    assert "a budget cannot be its own parent" in refusal(
        gpusharing, clusters, cluster_budget("loop.group", gpuMinutes=1, parent="loop.group"))
    created = gpusharing.rest("POST", path, gpu_budget(namespace, unlimited=True))
    # the schema's defaults
    assert created["spec"]["period"] == "monthly" and created["spec"]["warningThresholds"] == [80, 95]
    gpusharing.rest("DELETE", f"{path}/budget")


def test_a_gpubudget_owns_its_namespaces_budget_its_status_follows_use_hierarchy_and_edits(
    gpusharing: GpuSharing,
) -> None:
    namespace = gpusharing.namespace("e2e-gb")
    group = f"{namespace}.group"
    gpusharing.rest("POST", f"{GROUP}/clustergpubudgets", cluster_budget(group, gpuMinutes=100))
    path = f"{budget_path(namespace)}/budget"
    gpusharing.rest("POST", budget_path(namespace), gpu_budget(namespace, gpuMinutes=2, parent=group))
    # The two watches may deliver the GPUBudget first (ParentNotFound for a pass): Ready once both are in.
    status = wait_for(
        lambda: condition(s := status_of(gpusharing, path), "Ready").get("status") == "True" and s, "Ready"
    )
    assert status["observedGeneration"] == 1 and condition(status, "Ready")["reason"] == "Reconciled"
    assert (status["budgetGpuMinutes"], status["state"], status["ancestors"]) == (2, "in-budget", [group])
    group_status = wait_for(
        lambda: status_of(gpusharing, f"{GROUP}/clustergpubudgets/{group}").get("children"), "the group's status"
    )
    assert group_status == [namespace]

    # The resource owns the namespace: the REST API says so; top-ups stay open.
    admin = gpusharing.budget_admin_token()
    refused = gpusharing.timekeeper_call("PUT", f"/api/v1/budgets/{namespace}", admin, {"gpuMinutes": 600})
    assert refused.status_code == 409, refused.text
    assert f"managed by the GPUBudget {namespace}/budget resource" in refused.json()["error"]
    listed = gpusharing.timekeeper_call("GET", f"/api/v1/budgets/{namespace}", admin).json()
    assert (listed["gpuMinutes"], listed["parent"], listed["managedBy"]) == (2, group, f"GPUBudget {namespace}/budget")

    # 1.8 of 2 GPU-minutes: 90 %, a warning once: an Event on the namespace and on the GPUBudget, and every GPU pod
    # admitted there is warned (the API server hands the webhook's warnings to the client as Warning headers).
    pod = gpu_pod(gpusharing, namespace, "trainer")
    assert gpusharing.report(pod, gpusharing.token(namespace, "default", pod=pod), gpu_seconds=108).status_code == 200
    status = wait_for(lambda: (s := status_of(gpusharing, path)).get("state") == "warning" and s, "the warning state")
    assert condition(status, "Warning")["status"] == "True" and status["percentUsed"] == 90
    (warned,) = wait_for(lambda: events(gpusharing, namespace, "GPUBudgetWarning"), "the GPUBudgetWarning Event")
    assert (
        warned["type"] == "Warning"
        and f"namespace {namespace} has used 90 % of its 2 GPU-minutes for" in warned["message"]
    )
    on_resource = wait_for(
        lambda: gpusharing.rest(
            "GET",
            f"/api/v1/namespaces/{namespace}/events",
            query={"fieldSelector": "involvedObject.kind=GPUBudget,reason=GPUBudgetWarning"},
        )["items"],
        "the warning on the GPUBudget too",
    )
    assert len(on_resource) == 1
    # Many passes later, the budget was written into the ledger once: unchanged resources are not written again.
    changes = gpusharing.timekeeper_call("GET", f"/api/v1/budgets/{namespace}/changes", admin).json()["items"]
    assert [(c["action"], c["actor"]) for c in changes] == [("set", f"GPUBudget {namespace}/budget")]
    probe = yaml.safe_load((EXAMPLES / "kai-fraction.yaml").read_text())
    probe["metadata"]["name"] = "warned"
    wait_for(lambda: gpusharing.webhook_state(namespace, probe) == "warning", "the webhook's poll to see the warning")
    answer = gpusharing.session.post(f"{gpusharing.plane.url}/api/v1/namespaces/{namespace}/pods", json=probe,
                                     params={"dryRun": "All"}, timeout=30)
    assert answer.status_code == 201, answer.text
    assert f"namespace {namespace} has used 90 % of its 2 GPU-minutes for" in answer.headers.get("Warning", "")

    # Edited: a larger budget; the status follows the new generation.
    gpusharing.rest("PATCH", path, {"spec": {"gpuMinutes": 100}}, patch="merge")
    status = wait_for(
        lambda: (s := status_of(gpusharing, path)).get("observedGeneration") == 2 and s, "the edited status"
    )
    assert (status["state"], condition(status, "Warning")["status"]) == ("in-budget", "False")
    # The group's budget is spent by its namespace's use: the namespace is over budget through it.
    gpusharing.rest("PATCH", f"{GROUP}/clustergpubudgets/{group}", {"spec": {"gpuMinutes": 1}}, patch="merge")
    status = wait_for(
        lambda: (s := status_of(gpusharing, path)).get("state") == "over-budget" and s, "over budget through the group"
    )
    assert (status["ownState"], status["limitedBy"], condition(status, "Exhausted")["reason"]) == (
        "in-budget",
        group,
        "AncestorExhausted",
    )
    wait_for(
        lambda: gpusharing.webhook_state(namespace, probe) == "over-budget", "the webhook to demote through the group"
    )

    # Deleted: the namespace's budget goes with it, and the REST API may set it again.
    gpusharing.rest("DELETE", path)
    wait_for(
        lambda: gpusharing.timekeeper_call("GET", f"/api/v1/budgets/{namespace}", admin).json()["managedBy"] is None,
        "the budget to go with its resource",
    )
    assert (
        gpusharing.timekeeper_call("PUT", f"/api/v1/budgets/{namespace}", admin, {"gpuMinutes": 600}).status_code == 201
    )
    gpusharing.rest("DELETE", f"{GROUP}/clustergpubudgets/{group}")


def test_a_gpubudgets_safe_admission_settings_reach_the_timekeeper(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-gb-admission")
    path = budget_path(namespace)
    assert 'supported values: "open", "safe", "strict"' in refusal(
        gpusharing, path, gpu_budget(namespace, gpuMinutes=10, admission="unsafe"))
    assert 'supported values: "demote", "refuse"' in refusal(
        gpusharing, path, gpu_budget(namespace, gpuMinutes=10, onShortfall="evict"))
    created = gpusharing.rest("POST", path, gpu_budget(namespace, gpuMinutes=10, admission="safe"))
    assert (created["spec"]["admission"], created["spec"]["onShortfall"]) == ("safe", "demote")  # the schema's default
    admin = gpusharing.budget_admin_token()

    def ledger() -> tuple[str, str] | None:
        budget = gpusharing.timekeeper_call("GET", f"/api/v1/budgets/{namespace}", admin).json()
        return (budget["admission"], budget["onShortfall"]) if budget["managedBy"] else None

    assert wait_for(ledger, "the GPUBudget in the ledger") == ("safe", "demote")
    gpusharing.rest(
        "PATCH", f"{path}/budget", {"spec": {"admission": "strict", "onShortfall": "refuse"}}, patch="merge"
    )
    wait_for(lambda: ledger() == ("strict", "refuse"), "the edited settings in the ledger")
    gpusharing.rest("DELETE", f"{path}/budget")


def test_kubectl_get_gpubudgets_reads_as_a_budget_report(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-kubectl")
    path = f"{budget_path(namespace)}/budget"
    gpusharing.rest("POST", budget_path(namespace), gpu_budget(namespace, gpuMinutes=6000))
    wait_for(lambda: status_of(gpusharing, path).get("idleGpuHours") is not None, "the status, with its idle GPU-hours")
    shown = subprocess.run(["kubectl", "--kubeconfig", str(gpusharing.plane.admin_kubeconfig), "get", "gb", "-A"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert shown[0].split() == ["NAMESPACE", "NAME", "BUDGET", "USED", "REMAINING", "PERCENT", "IDLE", "STATE", "BAND",
                                "FAIR-SHARE", "RATIO", "PERIOD", "END", "AGE"]
    (row,) = [line.split() for line in shown if line.startswith(f"{namespace} ")]
    assert row[:8] == [namespace, "budget", "6000", "0", "6000", "0", "0", "in-budget"] and row[8].endswith(
        "T00:00:00Z"
    )
    assert len(row) == 10  # band and ratio empty: fair share is off


def test_namespace_members_read_their_gpubudget_and_cannot_change_it(gpusharing: GpuSharing) -> None:
    gpusharing.require_controllers()  # the aggregation of the built-in roles is a controller's
    namespace = gpusharing.namespace("e2e-gb-rbac")
    gpusharing.rest("POST", budget_path(namespace), gpu_budget(namespace, gpuMinutes=10))
    for role in ("view", "edit", "admin"):
        gpusharing.service_account(namespace, role)
        gpusharing.rest("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": role, "namespace": namespace}],
        })
        member = requests.Session()  # the member's token alone, not the admin's client certificate
        member.trust_env, member.verify = False, str(gpusharing.plane.ca_file)
        member.headers.update({"Authorization": f"Bearer {gpusharing.token(namespace, role, audience=None)}",
                               "Content-Type": "application/merge-patch+json"})
        url = f"{gpusharing.plane.url}{budget_path(namespace)}/budget"
        read = wait_for(
            lambda: (r := member.get(url, timeout=30)).status_code == 200 and r,
            f"{role} to read the GPUBudget (aggregated roles)",
        )
        assert read.json()["spec"]["gpuMinutes"] == 10
        raised = member.patch(url, data=json.dumps({"spec": {"gpuMinutes": 1e6}}), timeout=30)
        assert raised.status_code == 403, (role, raised.text)
        elsewhere = member.get(f"{gpusharing.plane.url}{GROUP}/gpubudgets", timeout=30)
        assert elsewhere.status_code == 403  # their own namespace's only


def test_one_controller_leads_and_another_takes_over_a_lapsed_lease(gpusharing: GpuSharing) -> None:
    lease = gpusharing.rest("GET", f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/{LEASE_NAME}")
    assert lease["spec"]["holderIdentity"]  # the running timekeeper leads
    # Two more candidates, with the controller's own ServiceAccount (the RBAC of manifests/), on a Lease of their own.
    kubeconfig = gpusharing.service_account_kubeconfig("candidate", CONTROLLER_ACCOUNT)
    kube = KubeApi.from_kubeconfig(str(kubeconfig))
    first, second = (
        LeaderElection(kube, SYSTEM_NAMESPACE, who, lease_seconds=1, name="e2e-election") for who in ("first", "second")
    )
    assert first.try_acquire_or_renew() and not second.try_acquire_or_renew()
    assert first.try_acquire_or_renew() and not second.try_acquire_or_renew()  # renewed: still the first's
    # The first stops renewing: once the second has seen the same record for the lease's duration, it takes over.
    wait_for(second.try_acquire_or_renew, "the second to take over the lapsed lease")
    taken = gpusharing.rest("GET", f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/e2e-election")[
        "spec"
    ]
    assert (taken["holderIdentity"], taken["leaseTransitions"]) == ("second", 1)
    assert not first.try_acquire_or_renew()
    second.release()  # given up: the first takes it at once, without waiting for it to lapse
    assert first.try_acquire_or_renew()
