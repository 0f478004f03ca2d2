"""A hostile tenant on the real control plane: a namespace's admin in one namespace, and any pod in the cluster
network. Each test is one way issue 22 found to game admission or reads, and shows it closed (docs/security.md).

The control plane authenticates itself to admission webhooks as a self-managed one can (tests/e2e/controlplane.py:
an AdmissionConfiguration whose kubeconfig gives a client certificate), and the webhook answers nobody else.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable
from typing import Any

import requests
import sqlalchemy
import yaml

from demo.apiserver import EXAMPLES, admission_review, api_server_pod
from gpusharing.contract import ANNOTATION_ADMISSION_ID
from tests.e2e.system import ALLOWED_PRIORITY_CLASS, ApiError, GpuSharing, wait_for
from timekeeper.database.tables import webhook_listings


def gpu_pod(name: str, deadline: int | None = None, share: str = "0.5", **metadata: Any) -> dict[str, Any]:
    """KAI's example pod (half a GPU by default), with a deadline when given."""
    pod = yaml.safe_load((EXAMPLES / "kai-fraction.yaml").read_text())
    pod["metadata"] = {
        **metadata,
        "name": name,
        "annotations": {**pod["metadata"]["annotations"], "gpu-fraction": share, **metadata.get("annotations", {})},
    }
    if deadline is not None:
        pod["spec"]["activeDeadlineSeconds"] = deadline
    return dict(pod)


def cpu_pod(name: str, **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **metadata},
            "spec": {"activeDeadlineSeconds": 315_360_000, "containers": [{"name": "web", "image": "nginx:1.27"}]}}


def set_budget(gpusharing: GpuSharing, name: str, **body: Any) -> None:
    answer = gpusharing.timekeeper_call("PUT", f"/api/v1/budgets/{name}", gpusharing.budget_admin_token(), body)
    assert answer.status_code in (200, 201), answer.text


def outcome(gpusharing: GpuSharing, namespace: str, pod: dict[str, Any], dry_run: bool = False) -> dict[str, Any] | str:
    """The pod as created, or the API server's message when it refuses it."""
    try:
        return gpusharing.create(namespace, pod, dry_run)
    except ApiError as refused:
        return refused.message


def created(gpusharing: GpuSharing, namespace: str, pod: dict[str, Any]) -> bool:
    return isinstance(outcome(gpusharing, namespace, pod), dict)


def at_once(count: int, create: Callable[[int], bool]) -> int:
    """`count` creations started together; how many succeeded."""
    start, results = threading.Barrier(count), []

    def one(index: int) -> None:
        start.wait()
        results.append(create(index))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(results)


def applying(gpusharing: GpuSharing, namespace: str, refused: str) -> None:
    """Waits for the webhook's next poll of the timekeeper: a dry run (which holds nothing) refused as `refused`
    says."""
    probe = gpu_pod("probe", 36_000)
    wait_for(
        lambda: refused in str(outcome(gpusharing, namespace, probe, dry_run=True)),
        f"the webhook applying {namespace}'s budget",
    )


# -- 1: anyone can talk to the webhook -----------------------------------------------------------------------------


def test_forged_reviews_are_refused_and_hold_nothing(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-forged")
    set_budget(gpusharing, namespace, gpuMinutes=10, admission="strict", onShortfall="refuse")
    applying(gpusharing, namespace, "cannot cover this pod's deadline")
    forged = admission_review(api_server_pod(gpu_pod("forged", 120), namespace))  # 1 GPU-minute each
    for _ in range(10):
        answer = requests.post(
            f"{gpusharing.webhook_url}/mutate", json=forged, verify=gpusharing.webhook_ca_file, timeout=10
        )
        assert answer.status_code == 401, answer.text
        assert answer.json() == {
            "error": "the GPU-sharing webhook answers only the API server: "
            "present a client certificate of the API server"
        }
    # The namespace's own half GPU-minute, with 10 budgeted and nothing running, is admitted.
    assert created(gpusharing, namespace, gpu_pod("small-job", 60))


# -- 2: blocking a sibling with pods that ask for no GPU --------------------------------------------------------------


def test_pods_that_ask_for_no_gpu_may_not_carry_the_record(gpusharing: GpuSharing) -> None:
    group = f"e2e-team-{uuid.uuid4().hex[:6]}.siblings"
    set_budget(gpusharing, group, gpuMinutes=5)
    hostile, sibling = gpusharing.namespace("e2e-hostile"), gpusharing.namespace("e2e-sibling")
    for namespace in (hostile, sibling):
        set_budget(gpusharing, namespace, gpuMinutes=100, parent=group, admission="strict", onShortfall="refuse")
    for index, where in enumerate(("annotations", "labels", "annotations")):
        message = outcome(
            gpusharing, hostile, cpu_pod(f"blocker-{index}", **{where: {"gpusharing.io/gpu-share": "1000"}})
        )
        assert isinstance(message, str), "a pod asking for no GPU was admitted with the webhook's record"
        assert (
            "annotations and labels under gpusharing.io/ are the GPU-sharing webhook's record and this pod asks for no "
            "GPU: "
            f"remove {where[:-1]} gpusharing.io/gpu-share" in message
        )
    applying(gpusharing, sibling, "the budget of " + group)
    assert created(gpusharing, sibling, gpu_pod("fits", 600))  # 5 GPU-minutes: all the group has, all uncommitted


# -- 3: one commitment for forty pods ---------------------------------------------------------------------------------


def test_forty_pods_carrying_one_admission_id_are_forty_commitments(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-one-id")
    set_budget(gpusharing, namespace, gpuMinutes=10, admission="strict", onShortfall="refuse")
    applying(gpusharing, namespace, "cannot cover this pod's deadline")
    forged = {ANNOTATION_ADMISSION_ID: "a" * 16}
    admitted = at_once(40, lambda i: created(gpusharing, namespace, gpu_pod(f"shared-{i}", 120, annotations=forged)))
    assert admitted == 10  # of 1 GPU-minute each, under a strict budget of 10
    pods = gpusharing.pods(namespace)
    ids = {p["metadata"]["annotations"][ANNOTATION_ADMISSION_ID] for p in pods}
    assert len(ids) == 10 and "a" * 16 not in ids and all(uuid.UUID(i) for i in ids)  # each the uid of its own review
    # Someone else's id, once the timekeeper sees its pod, is refused outright.
    stolen = pods[0]["metadata"]
    wait_for(lambda: gpusharing.timekeeper_call("GET", f"/api/v1/budgets/{namespace}", gpusharing.budget_admin_token())
             .json()["committedGpuMinutes"] == 10, "the timekeeper seeing the pods")
    set_budget(gpusharing, namespace, gpuMinutes=100, admission="strict", onShortfall="refuse")
    copied = gpu_pod("copy", 120, annotations={ANNOTATION_ADMISSION_ID: stolen["annotations"][ANNOTATION_ADMISSION_ID]})
    message = wait_for(
        lambda: (m := outcome(gpusharing, namespace, copied)) and isinstance(m, str) and "admission of pod" in m and m,
        "the copied id refused",
    )
    assert f"the admission of pod {namespace}/{stolen['name']}: remove the annotation" in message


# -- 4: sibling bursts ----------------------------------------------------------------------------------------------


def test_sibling_namespaces_bursting_at_once_commit_no_more_than_their_parent(gpusharing: GpuSharing) -> None:
    group = f"e2e-team-{uuid.uuid4().hex[:6]}.burst"
    set_budget(gpusharing, group, gpuMinutes=10)
    siblings = [gpusharing.namespace("e2e-burst") for _ in range(4)]
    for namespace in siblings:
        set_budget(gpusharing, namespace, gpuMinutes=100, parent=group, admission="strict", onShortfall="refuse")
    for namespace in siblings:
        applying(gpusharing, namespace, "cannot cover this pod's deadline")
    admitted = at_once(40, lambda i: created(gpusharing, siblings[i % 4], gpu_pod(f"job-{i}", 120)))
    assert admitted == 10  # 1 GPU-minute each: the parent's 10, whichever namespaces won them


# -- 5: a priority of one's own choosing ------------------------------------------------------------------------------


def running(gpusharing: GpuSharing, pod: dict[str, Any]) -> None:
    """The pod made Running the way a kubelet reports it (no kubelet runs here)."""
    path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}/status"
    gpusharing.rest(
        "PATCH",
        path,
        {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
        patch="merge",
    )


def test_the_priority_class_is_the_governors_and_eviction_spares_none_admitted_in_budget(
    gpusharing: GpuSharing,
) -> None:
    namespace = gpusharing.namespace("e2e-priority")
    critical = gpu_pod("critical")
    critical["spec"]["priorityClassName"] = "system-cluster-critical"
    message = outcome(gpusharing, namespace, critical)
    assert isinstance(message, str), "a GPU pod kept a priority class of its own choosing"
    assert "GPU pods get their priority class from the GPU-sharing webhook ('gpusharing-in-budget' in budget), not " \
           "'system-cluster-critical'" in message
    # A class an administrator allows stays; exhaustion evicts its pod as it does its ordinary neighbour.
    gpusharing.replace(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": ALLOWED_PRIORITY_CLASS},
            "value": 5000,
        }
    )
    set_budget(gpusharing, namespace, gpuMinutes=1, period="monthly", evictOnExhaustion=True)
    allowed = gpu_pod("allowed")
    allowed["spec"]["priorityClassName"] = ALLOWED_PRIORITY_CLASS
    pods = [gpusharing.create(namespace, allowed), gpusharing.create(namespace, gpu_pod("ordinary"))]
    assert [p["spec"]["priorityClassName"] for p in pods] == [ALLOWED_PRIORITY_CLASS, "gpusharing-in-budget"]
    for pod in pods:
        running(gpusharing, pod)
    token = gpusharing.token(namespace, "default", pod=pods[1])
    assert gpusharing.report(pods[1], token, gpu_seconds=120).status_code == 200  # over its one GPU-minute
    wait_for(lambda: all(gpusharing.pod(namespace, p["metadata"]["name"]) is None for p in pods), "both pods evicted")


# -- 6: everyone reads everything ------------------------------------------------------------------------------------


READS = ("/api/v1/budgets/{ns}", "/api/v1/budgets/{ns}/changes", "/api/v1/pods?namespace={ns}",
         "/api/v1/usage?from=2026-01-01&to=2026-12-31&namespace={ns}")
CLUSTER_READS = ("/api/v1/budgets", "/api/v1/pods", "/api/v1/usage?from=2026-01-01&to=2026-12-31")


def statuses(gpusharing: GpuSharing, token: str, paths: tuple[str, ...], namespace: str) -> list[int]:
    return [gpusharing.timekeeper_call("GET", path.format(ns=namespace), token).status_code for path in paths]


def test_reads_are_scoped_to_the_namespaces_kubernetes_lets_the_caller_read(gpusharing: GpuSharing) -> None:
    mine, theirs = gpusharing.namespace("e2e-reader"), gpusharing.namespace("e2e-victim")
    set_budget(gpusharing, theirs, gpuMinutes=60)
    victim_pod = gpusharing.create(theirs, gpu_pod("victim"))
    tenant = gpusharing.token(mine, "default")
    assert (
        statuses(gpusharing, tenant, READS, theirs) + statuses(gpusharing, tenant, CLUSTER_READS, theirs) == [403] * 7
    )
    # A member of a namespace (RBAC's view role there) reads it, and it alone.
    gpusharing.bind(mine, "member", "view")
    member = gpusharing.token(mine, "member")
    assert wait_for(lambda: statuses(gpusharing, member, READS, mine) == [200] * 4, "the view role aggregated")
    assert (
        statuses(gpusharing, member, READS, theirs) + statuses(gpusharing, member, CLUSTER_READS, theirs) == [403] * 7
    )
    # A meter's token (bound to its pod) reads nothing, not even its own namespace.
    meter = gpusharing.token(theirs, "default", pod=victim_pod)
    assert statuses(gpusharing, meter, READS, theirs) == [403] * 4
    # The budget admin (gpusharing-budget-admin) reads everything, as the admin command line does.
    admin = gpusharing.budget_admin_token()
    assert statuses(gpusharing, admin, READS, theirs) + statuses(gpusharing, admin, CLUSTER_READS, theirs) == [200] * 7


# -- 7: strict admission fails open -----------------------------------------------------------------------------------


def test_strict_admission_refuses_while_the_timekeeper_cannot_count_and_safe_says_so(gpusharing: GpuSharing) -> None:
    strict, safe = gpusharing.namespace("e2e-strict-closed"), gpusharing.namespace("e2e-safe-open")
    set_budget(gpusharing, strict, gpuMinutes=100, admission="strict", onShortfall="refuse")
    set_budget(gpusharing, safe, gpuMinutes=100, admission="safe", onShortfall="refuse")
    applying(gpusharing, strict, "cannot cover this pod's deadline")
    applying(gpusharing, safe, "cannot cover this pod's deadline")
    assert created(gpusharing, strict, gpu_pod("before", 60))
    gpusharing.timekeeper_link.cut()  # the timekeeper loses the API server: its pod watch fails and cannot relist
    try:
        message = wait_for(lambda: (m := outcome(gpusharing, strict, gpu_pod(f"during-{uuid.uuid4().hex[:6]}", 60)))
                           and isinstance(m, str) and m, "strict admission refusing")
        assert (
            f"namespace '{strict}' has safe admission, and what its budgets have left uncommitted cannot be counted "
            f"now "
            "(the timekeeper" in message
        )
        assert "its budget's admission is strict, so no GPU pod is admitted until it can be" in message
        admitted = outcome(gpusharing, safe, gpu_pod("during", 60))
        assert (
            isinstance(admitted, dict)
            and admitted["metadata"]["annotations"]["gpusharing.io/safe-admission"] == "unchecked"
        )
    finally:
        gpusharing.timekeeper_link.mend()
    wait_for(
        lambda: created(gpusharing, strict, gpu_pod(f"after-{uuid.uuid4().hex[:6]}", 60)),
        "strict admission counting again",
    )


def test_the_webhook_answers_the_api_server_alone_and_probes(gpusharing: GpuSharing) -> None:
    review = copy.deepcopy(admission_review(api_server_pod(gpu_pod("direct"), "default")))
    ca = gpusharing.webhook_ca_file
    assert requests.post(f"{gpusharing.webhook_url}/validate", json=review, verify=ca, timeout=10).status_code == 401
    assert requests.get(f"{gpusharing.webhook_url}/readyz", verify=ca, timeout=10).status_code == 200


def test_only_the_webhook_may_say_what_listing_it_holds_which_holds_a_crossings_evictions(
    gpusharing: GpuSharing,
) -> None:
    """A poll naming itself as a webhook process that holds an old listing would hold every crossing's evictions back:
    a namespace admin reads no listing at all, and a reader of every namespace who is not the webhook may read it
    but not name itself."""
    tenant_namespace = gpusharing.namespace("e2e-forger")
    gpusharing.bind(tenant_namespace, "ns-admin", "admin")
    namespace_admin, reader = gpusharing.token(tenant_namespace, "ns-admin"), gpusharing.budget_admin_token()
    poll = "/api/v1/budgets?webhook=forged-webhook&inForce=0&refreshSeconds=3600"
    assert wait_for(
        lambda: (
            gpusharing.timekeeper_call("GET", f"/api/v1/budgets/{tenant_namespace}", namespace_admin).status_code == 200
        ),
        "the admin role aggregated",
    )  # it reads its own namespace: its refusal below is the poll's
    assert gpusharing.timekeeper_call("GET", poll, namespace_admin).status_code == 403
    assert gpusharing.timekeeper_call("GET", "/api/v1/budgets", reader).status_code == 200
    refused = gpusharing.timekeeper_call("GET", poll, reader)
    assert refused.status_code == 403 and "may not name itself as a webhook process" in refused.json()["error"]
    engine = sqlalchemy.create_engine(gpusharing.database)
    with engine.connect() as conn:
        listed = {row.webhook for row in conn.execute(sqlalchemy.select(webhook_listings))}
    engine.dispose()
    assert "forged-webhook" not in listed and listed  # the webhook's own polls are there
