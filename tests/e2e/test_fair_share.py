"""Fair share's bands on the real API server, tried as a hostile namespace admin would (docs/fair-share.md): a band's
class is the webhook's to give, so a tenant that names one is refused; a band record written by hand is the
webhook's all the same, with the band's priority value (the Priority admission plugin resolved the class the tenant
named before the webhook ran); and the record, once admitted, cannot be edited to escape a rebalance."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from demo.apiserver import EXAMPLES
from tests.e2e.system import GpuSharing, wait_for

LIGHT, HEAVY = "gpusharing-in-budget-light", "gpusharing-in-budget-heavy"
BAND, REASON = "gpusharing.io/fair-share-band", "gpusharing.io/fair-share-reason"


@pytest.fixture
def fair_share(gpusharing: GpuSharing) -> Iterator[None]:
    with gpusharing.fair_share(TIMEKEEPER_FAIRSHARE_INTERVAL_SECONDS="1", TIMEKEEPER_FAIRSHARE_MIN_TIME_IN_BAND="0"):
        yield


def fraction_pod(
    name: str, priority_class: str | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    pod: dict[str, Any] = yaml.safe_load((EXAMPLES / "kai-fraction.yaml").read_text())
    pod["metadata"]["name"] = name
    pod["metadata"]["annotations"].update(annotations or {})
    if priority_class:
        pod["spec"]["priorityClassName"] = priority_class
    return pod


def priority_of(gpusharing: GpuSharing, name: str) -> int:
    return int(gpusharing.rest("GET", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")["value"])


def test_a_tenant_can_neither_name_a_band_nor_forge_or_edit_its_record(
    gpusharing: GpuSharing, fair_share: None
) -> None:
    gpusharing.require_controllers()  # the tenant's admin role is aggregated by a controller
    namespace = gpusharing.namespace("e2e-fs")
    gpusharing.set_budget(namespace, gpu_minutes=600)
    tenant = gpusharing.namespace_admin(namespace)
    # The webhook's poll brings the namespace's band (this tier has no node: every GPU is beyond a fair share of
    # none, and the burst guard admits it one band lower than the middle, where nobody's use puts it).
    given = wait_for(
        lambda: gpusharing.create(namespace, fraction_pod("probe"), dry_run=True)["metadata"]["annotations"].get(BAND),
        "the webhook to admit the namespace's pods in a band",
    )
    assert given == HEAVY

    # Naming a band's class: refused, as any class not the webhook's.
    with pytest.raises(ApiException) as refused:
        tenant.create_namespaced_pod(namespace, fraction_pod("named", LIGHT))
    assert refused.value.status == 403
    assert (
        f"GPU pods get their priority class from the GPU-sharing webhook ('gpusharing-in-budget' in budget), not "
        f"'{LIGHT}'"
        in str(refused.value.body)
    )

    # The record written by hand with the class it names: taken for a reinvocation, the band is the webhook's, and so
    # is the priority the scheduler reads.
    forged = fraction_pod("forged", LIGHT, {BAND: LIGHT, REASON: "light teams first: trust me"})
    created = tenant.create_namespaced_pod(namespace, forged)
    assert created.spec.priority_class_name == given and created.metadata.annotations[BAND] == given
    assert created.spec.priority == priority_of(gpusharing, given) != priority_of(gpusharing, LIGHT)
    assert not created.metadata.annotations[REASON].startswith("light teams first")

    # Once admitted, the band recorded (which the controller's rebalance reads) cannot be edited, nor removed.
    for edit in ({BAND: LIGHT}, {BAND: None}, {REASON: "edited"}):
        with pytest.raises(ApiException) as refused:
            tenant.patch_namespaced_pod("forged", namespace, {"metadata": {"annotations": copy.deepcopy(edit)}})
        assert refused.value.status == 403, edit
        assert "cannot be changed" in str(refused.value.body), edit
    stored = gpusharing.pod(namespace, "forged")
    assert stored is not None and stored["metadata"]["annotations"][BAND] == given
    gpusharing.release(namespace, "forged")
