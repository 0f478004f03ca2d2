"""Safe admission on the real API server: the timekeeper follows the cluster's pods with the manifests' RBAC and
counts what their deadlines commit, the webhook admits or refuses pods by what is left uncommitted, and carries a
Job's deadline onto the pods the Job controller creates."""

from __future__ import annotations

import uuid
from typing import Any

import yaml

from demo.apiserver import EXAMPLES
from gpusharing.contract import ANNOTATION_ADMISSION_ID, ANNOTATION_SAFE_ADMISSION
from tests.e2e.system import ApiError, GpuSharing, wait_for


def half_gpu_pod(name: str, deadline: int | None) -> dict[str, Any]:
    """KAI's example pod (half a GPU), with a deadline."""
    pod = yaml.safe_load((EXAMPLES / "kai-fraction.yaml").read_text())
    pod["metadata"]["name"] = name
    if deadline is not None:
        pod["spec"]["activeDeadlineSeconds"] = deadline
    return pod


def set_safe_budget(
    gpusharing: GpuSharing, namespace: str, gpu_minutes: float, admission: str, on_shortfall: str
) -> None:
    body = {"gpuMinutes": gpu_minutes, "admission": admission, "onShortfall": on_shortfall}
    answer = gpusharing.timekeeper_call("PUT", f"/api/v1/budgets/{namespace}", gpusharing.budget_admin_token(), body)
    assert answer.status_code in (200, 201), answer.text


def budget(gpusharing: GpuSharing, namespace: str) -> dict[str, Any]:
    return dict(
        gpusharing.timekeeper_call("GET", f"/api/v1/budgets/{namespace}", gpusharing.budget_admin_token()).json()
    )


def created(
    gpusharing: GpuSharing, namespace: str, pod: dict[str, Any], dry_run: bool = False
) -> dict[str, Any] | None:
    """The pod as created, or None when the webhook refused it."""
    try:
        return gpusharing.create(namespace, pod, dry_run)
    except ApiError as refused:
        assert refused.status == 403, refused.message
        return None


def refusal(gpusharing: GpuSharing, namespace: str, pod: dict[str, Any], dry_run: bool = False) -> str | None:
    """The API server's message when the webhook refuses the pod; None when it admits it."""
    try:
        gpusharing.create(namespace, pod, dry_run)
    except ApiError as refused:
        assert refused.status == 403, refused.message
        return refused.message
    return None


def test_pods_are_admitted_while_their_deadlines_fit_the_uncommitted_budget(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-safe")
    set_safe_budget(gpusharing, namespace, 10, "safe", "refuse")
    # The webhook learns of the setting at its next poll of the timekeeper; a dry run creates (and reserves) nothing.
    wait_for(
        lambda: refusal(gpusharing, namespace, half_gpu_pod("probe", 3600), dry_run=True),
        "the webhook applying safe admission",
    )

    first = gpusharing.create(namespace, half_gpu_pod("first", 600))  # 0.5 GPU x 600 s = 5 GPU-minutes
    second = gpusharing.create(namespace, half_gpu_pod("second", 600))
    for pod in (first, second):
        # the uid of the review that admitted it
        assert uuid.UUID(pod["metadata"]["annotations"][ANNOTATION_ADMISSION_ID])
        assert pod["metadata"]["annotations"][ANNOTATION_SAFE_ADMISSION] == "reserved"
        assert pod["spec"]["priorityClassName"] == "gpusharing-in-budget"
    message = str(refusal(gpusharing, namespace, half_gpu_pod("third", 600)))
    assert f'denied the request: namespace \'{namespace}\' cannot cover this pod\'s deadline: the pod commits 5.00 ' \
           "GPU-minutes (0.5 GPU x weight 1 x 600 s), and its budget has 0.00 left uncommitted" in message, message

    # The timekeeper's watch has seen both pods: it counts them instead of their reservations.
    listed = wait_for(
        lambda: (b := budget(gpusharing, namespace))["committedGpuMinutes"] == 10 and b, "the pods' commitments"
    )
    assert (listed["uncommitted"]["gpuMinutes"], listed["uncommitted"]["reservedGpuMinutes"]) == (0, 0)
    probe = refusal(gpusharing, namespace, half_gpu_pod("probe", 600), dry_run=True)
    assert (
        probe is not None
        and "0.00 left uncommitted (10.00 remaining, less 10.00 committed by running pods' deadlines)" in probe
    )

    # A pod that ends (here: deleted before it ran) commits nothing any more: room for another.
    gpusharing.rest("DELETE", f"/api/v1/namespaces/{namespace}/pods/first")
    gpusharing.release(namespace, "first")  # its bill closed (the billing finalizer held it until then)
    wait_for(
        lambda: budget(gpusharing, namespace)["committedGpuMinutes"] == 5, "the deleted pod's commitment given back"
    )
    again = wait_for(
        lambda: created(gpusharing, namespace, half_gpu_pod("again", 600)), "a pod admitted in the room made"
    )
    assert again["spec"]["priorityClassName"] == "gpusharing-in-budget"


def test_a_demoting_budget_admits_what_it_cannot_cover_at_the_over_budget_class(gpusharing: GpuSharing) -> None:
    namespace = gpusharing.namespace("e2e-safe-demote")
    set_safe_budget(gpusharing, namespace, 1, "safe", "demote")
    probe = half_gpu_pod("long", 3600)  # 30 GPU-minutes
    wait_for(
        lambda: (
            gpusharing.create(namespace, probe, dry_run=True)["spec"]["priorityClassName"] == "gpusharing-over-budget"
        ),
        "the webhook applying safe admission",
    )
    pod = gpusharing.create(namespace, probe)
    assert pod["spec"]["priorityClassName"] == "gpusharing-over-budget"
    assert ANNOTATION_ADMISSION_ID not in pod["metadata"]["annotations"]  # nothing reserved for it
    assert pod["metadata"]["annotations"][ANNOTATION_SAFE_ADMISSION] == "demoted"
    # the namespace is not over budget
    assert pod["metadata"]["annotations"]["gpusharing.io/budget-state"] == "in-budget"


def test_strict_admission_refuses_a_pod_without_a_deadline_and_carries_a_jobs_onto_its_pods(
    gpusharing: GpuSharing,
) -> None:
    namespace = gpusharing.namespace("e2e-strict")
    set_safe_budget(gpusharing, namespace, 10, "strict", "refuse")
    wait_for(
        lambda: refusal(gpusharing, namespace, half_gpu_pod("open-ended", None), dry_run=True),
        "the webhook applying strict admission",
    )
    message = str(refusal(gpusharing, namespace, half_gpu_pod("open-ended", None)))
    assert "admits only GPU pods with a deadline" in message
    assert "set spec.activeDeadlineSeconds on the pod, or on its Job" in message

    gpusharing.require_controllers()
    template = half_gpu_pod("unused", None)
    template["metadata"] = {"annotations": template["metadata"]["annotations"]}
    template["spec"]["restartPolicy"] = "Never"
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
           "spec": {"activeDeadlineSeconds": 900, "backoffLimit": 0, "template": template}}
    gpusharing.create(namespace, job)
    (pod,) = wait_for(lambda: gpusharing.pods(namespace, "job-name=train"), "the Job's pod")
    assert 800 <= pod["spec"]["activeDeadlineSeconds"] <= 900  # what the Job's deadline left it when it was created
    assert ANNOTATION_ADMISSION_ID in pod["metadata"]["annotations"]
    listed = wait_for(
        lambda: (b := budget(gpusharing, namespace))["committedGpuMinutes"] and b, "the Job pod's commitment"
    )
    assert listed["committedGpuMinutes"] == 0.5 * pod["spec"]["activeDeadlineSeconds"] / 60
