"""The API server's record of a governed pod, which its bill follows: when it held its GPUs and what share, read from
what the tenant cannot change (the spec, the kubelet's status, the claims' allocations), never from its annotations."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusharing.contract import ANNOTATION_GPU_SHARE, BILLING_FINALIZER, FAIR_SHARE_GATE
from gpusharing.gpu.dra import allocated_claim_spec, claim_spec
from gpusharing.gpu.request import GpuRequestSettings
from timekeeper.accounting.ledger import Observation
from timekeeper.accounting.record import allocation_lookup, claimed_share, recorded_pod

UTC = dt.timezone.utc
EXAMPLES = Path(__file__).parents[2] / "examples"
SETTINGS = GpuRequestSettings()
STARTED = dt.datetime(2026, 11, 25, 10, 0, tzinfo=UTC)


def governed(
    gpus: str = "1", admitted: str = "1", status: dict[str, Any] | None = None, **metadata: Any
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": "trainer", "uid": "uid-1",
                     "annotations": {ANNOTATION_GPU_SHARE: admitted}, **metadata},
        "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
        "status": {"phase": "Running", "startTime": "2026-11-25T10:00:00Z", **(status or {})},
    }


def terminated(finished: str) -> dict[str, Any]:
    return {"name": "main", "state": {"terminated": {"exitCode": 0, "finishedAt": finished}}}


def test_a_pod_the_webhook_did_not_admit_is_not_recorded() -> None:
    pod = governed()
    del pod["metadata"]["annotations"]
    assert recorded_pod(pod, SETTINGS) is None


def test_the_share_is_read_from_the_spec_not_from_the_annotation_the_tenant_wrote() -> None:
    record = recorded_pod(governed(gpus="2", admitted="0.001"), SETTINGS)
    assert record is not None and record.share == 2.0 and record.model == SETTINGS.catalogue.default.name


@pytest.mark.parametrize(("annotations", "demoted"), [
    ({}, False),
    ({"gpusharing.io/budget-state": "in-budget"}, False),
    ({"gpusharing.io/budget-state": "over-budget"}, True),
    ({"gpusharing.io/budget-state": "in-budget", "gpusharing.io/safe-admission": "demoted"}, True),
    # Its owner held for idleness: the webhook admitted it out of budget in a namespace within its budget.
    ({"gpusharing.io/budget-state": "in-budget", "gpusharing.io/idle-hold": "ReplicaSet/nb-7d9"}, True),
])
def test_the_record_says_whether_the_webhook_admitted_the_pod_out_of_budget(
    annotations: dict[str, str], demoted: bool
) -> None:
    pod = governed()
    pod["metadata"]["annotations"].update(annotations)
    record = recorded_pod(pod, SETTINGS)
    assert record is not None and record.demoted is demoted


def test_the_record_says_where_the_pod_waits_in_the_fair_share_queue_and_since_when() -> None:
    pod = governed(creationTimestamp="2026-11-25T09:59:00Z", status={"phase": "Pending", "startTime": None})
    pod["spec"]["schedulingGates"] = [{"name": "example.com/data-ready"}, {"name": FAIR_SHARE_GATE}]
    record = recorded_pod(pod, SETTINGS)
    assert record is not None and record.gate == 1
    assert record.created_at == dt.datetime(2026, 11, 25, 9, 59, tzinfo=dt.timezone.utc)
    pod["spec"]["schedulingGates"] = [{"name": "example.com/data-ready"}]  # another's gate: not in our queue
    released = recorded_pod(pod, SETTINGS)
    assert released is not None and released.gate is None


def test_a_running_pod_is_billed_from_the_kubelets_start_until_now() -> None:
    record = recorded_pod(governed(), SETTINGS)
    assert record is not None and record.finalizer is None
    now = STARTED + dt.timedelta(seconds=90)
    assert record.observation(1.0, now, 30) == Observation(1.0, STARTED, now, ended=False)


def test_a_pod_not_started_has_nothing_to_bill() -> None:
    pod = governed()
    del pod["status"]["startTime"]
    record = recorded_pod(pod, SETTINGS)
    assert record is not None and record.observation(1.0, STARTED, 30) is None


def test_a_pod_ends_when_the_last_of_its_containers_stopped() -> None:
    running = {"name": "sidecar", "state": {"running": {"startedAt": "2026-11-25T10:00:01Z"}}}
    still = recorded_pod(
        governed(status={"containerStatuses": [terminated("2026-11-25T10:05:00Z"), running]}), SETTINGS
    )
    assert still is not None and still.finished_at is None
    done = recorded_pod(governed(status={"phase": "Succeeded", "containerStatuses": [
        terminated("2026-11-25T10:05:00Z"), {**terminated("2026-11-25T10:06:00Z"), "name": "b"}]}), SETTINGS)
    assert done is not None
    end = STARTED + dt.timedelta(minutes=6)
    assert done.observation(1.0, end + dt.timedelta(hours=5), 30) == Observation(1.0, STARTED, end, ended=True)


def test_a_deleted_pod_whose_node_is_gone_ends_at_its_deletion_once_its_grace_period_passed() -> None:
    record = recorded_pod(
        governed(deletionTimestamp="2026-11-25T10:10:00Z", finalizers=["other", BILLING_FINALIZER]), SETTINGS
    )
    assert record is not None and record.finalizer == 1
    deleted = STARTED + dt.timedelta(minutes=10)
    assert not record.observation(1.0, deleted + dt.timedelta(seconds=29), 30).ended  # type: ignore[union-attr]
    assert record.observation(1.0, deleted + dt.timedelta(seconds=30), 30) == Observation(
        1.0, STARTED, deleted, ended=True
    )


def test_a_failed_pod_whose_containers_say_nothing_ends_at_its_last_condition() -> None:
    record = recorded_pod(governed(status={"phase": "Failed", "conditions": [
        {"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-25T10:02:00Z"}]}), SETTINGS)
    assert record is not None and record.finished_at == STARTED + dt.timedelta(minutes=2)


# -- resource claims: priced by what they were allocated ---------------------------------------------------------------

def claim(devices: int, allocated: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"namespace": "ml", "name": "dra-infer-gpu-x7k2"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": devices}}]
            }
        },
    }
    if allocated is not None:
        body["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": f"gpu-{i}"}
                        for i in range(allocated)
                    ]
                }
            }
        }
    return body


def dra_pod() -> dict[str, Any]:
    pod = yaml.safe_load((EXAMPLES / "dra" / "gpu-pod.yaml").read_text())
    pod["metadata"].update(namespace="ml", uid="uid-dra", annotations={ANNOTATION_GPU_SHARE: "1"})
    pod["status"] = {"phase": "Running", "startTime": "2026-11-25T10:00:00Z",
                     "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "dra-infer-gpu-x7k2"}]}
    return pod


def test_a_claim_not_allocated_has_no_allocation() -> None:
    assert allocated_claim_spec(claim(1, None)) is None


def test_an_allocation_is_read_as_what_the_claim_got() -> None:
    assert allocated_claim_spec(claim(1, 3)) == claim_spec({"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 3}}]}})


def test_first_available_is_priced_by_the_alternative_the_scheduler_chose() -> None:
    body = {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 4},
        {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 1}]}]}},
        "status": {"allocation": {"devices": {"results": [{"request": "gpu/small", "device": "gpu-0"}]}}}}
    spec = allocated_claim_spec(body)
    assert spec is not None and [(a.name, a.count) for a in spec.requests[0].alternatives] == [("small", 1)]


def test_a_dra_pod_is_billed_for_what_its_claim_was_allocated_not_what_was_admitted() -> None:
    record = recorded_pod(dra_pod(), SETTINGS)
    assert record is not None and record.share is None  # priced when billed, from the claims' watch
    # Admitted for one GPU; the claim was deleted and made again for four before the pod was scheduled.
    allocations = {("ml", "dra-infer-gpu-x7k2"): allocated_claim_spec(claim(4, 4))}
    assert claimed_share(record, SETTINGS, allocation_lookup(allocations)) == (4.0, SETTINGS.catalogue.default.name)


@pytest.mark.parametrize("allocations", [None, {}, {("ml", "dra-infer-gpu-x7k2"): None}])
def test_a_dra_pod_whose_allocation_is_not_known_is_not_priced_yet(allocations: Any) -> None:
    record = recorded_pod(dra_pod(), SETTINGS)
    assert record is not None and claimed_share(record, SETTINGS, allocation_lookup(allocations)) is None


def test_a_kai_fraction_lowered_on_the_live_pod_does_not_lower_the_bill() -> None:
    pod = yaml.safe_load((EXAMPLES / "kai-fraction.yaml").read_text())  # admitted at 0.5
    pod["metadata"].update(
        namespace="ml", uid="uid-kai", annotations={"gpu-fraction": "0.01", ANNOTATION_GPU_SHARE: "0.5"}
    )
    record = recorded_pod(pod, SETTINGS)
    assert record is not None and record.share == 0.5
