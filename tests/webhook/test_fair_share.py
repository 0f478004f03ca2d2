"""Admission in fair-share bands (docs/fair-share.md): a GPU pod in budget gets its namespace's band's class from the
listing the webhook polls, one band lower beyond its fair share of the cluster's GPUs (the burst guard, counting what
this process admitted since the timekeeper counted), and records band and reason; a tenant cannot name a band. Every
GPU pod of a namespace with fair share on waits behind the fair-share scheduling gate, and may not name its node."""

from __future__ import annotations

from typing import Any

import jsonpatch
import kubernetes_validate
from flask.testing import FlaskClient

from demo.apiserver import admission_review
from tests.webhook.conftest import FakeTimekeeper
from tests.webhook.test_admission import KUBERNETES_VERSION, admitted, gpu_pod, patch_of, review
from webhook.app import create_app
from webhook.caches.budgets import BudgetStateCache, states_from_listing
from webhook.config import WebhookConfig

CLASSES = ["gpusharing-in-budget-light", "gpusharing-in-budget", "gpusharing-in-budget-heavy"]
LIGHT, MIDDLE, HEAVY = CLASSES
REASON = (
    "ml-team used 0.2x its fair share at the level of dept.research over a 24h half-life: gpusharing-in-budget-light"
)
BAND = "gpusharing.io/fair-share-band"


def ranked(
    band: str = LIGHT, burst: str = MIDDLE, share: float = 2.0, held: float = 0.0, held_as_of: float = 0.0
) -> dict[str, Any]:
    return {
        "band": band,
        "burstClass": burst,
        "shareGpus": share,
        "heldGpus": held,
        "reason": REASON,
        "heldAsOf": held_as_of,
    }


def whole_gpu_pod(name: str = "infer", **spec: Any) -> dict[str, Any]:
    pod = gpu_pod(
        containers=[{"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": 1}}}], **spec
    )
    pod["metadata"]["name"] = name
    return pod


def listed(timekeeper: FakeTimekeeper, fair_share: dict[str, Any] | None, state: str = "in-budget",
           on: bool = True) -> BudgetStateCache:
    """The listing of namespace ml-team, ranked in `fair_share` (None: not ranked); `on`: fair share is on."""
    timekeeper.items = [{"namespace": "ml-team", "state": state, **({"fairShare": fair_share} if fair_share else {})}]
    timekeeper.extra = {"fairShare": {"classes": CLASSES}} if on else {}
    cache = BudgetStateCache(timekeeper.url)
    assert cache.refresh()
    return cache


def client_of(cache: BudgetStateCache) -> FlaskClient:
    return create_app(WebhookConfig(), cache).test_client()


def test_a_gpu_pod_in_budget_gets_its_namespace_s_band_and_says_why(timekeeper: FakeTimekeeper) -> None:
    _, mutated = admitted(client_of(listed(timekeeper, ranked())), whole_gpu_pod())
    assert mutated["spec"]["priorityClassName"] == LIGHT
    annotations = mutated["metadata"]["annotations"]
    assert annotations[BAND] == LIGHT and annotations["gpusharing.io/fair-share-reason"] == REASON


def test_the_burst_guard_admits_only_the_fair_share_in_the_band_and_the_rest_one_lower(
    timekeeper: FakeTimekeeper,
) -> None:
    cache = listed(timekeeper, ranked(share=2.0, held=0.5))
    client = client_of(cache)
    classes = [admitted(client, whole_gpu_pod(f"p-{i}"))[1]["spec"]["priorityClassName"] for i in range(4)]
    assert classes == [LIGHT, MIDDLE, MIDDLE, MIDDLE]  # 0.5 held + 1 fits in 2 GPUs; the next would not
    burst = admitted(client, whole_gpu_pod("p-5"))[1]["metadata"]["annotations"]["gpusharing.io/fair-share-reason"]
    assert (
        burst.startswith(REASON)
        and "one band lower: with this pod it would hold 5.5 GPUs, above its fair share of 2" in burst
    )
    # A dry run admits nothing: it is not counted.
    review(client, admission_review(whole_gpu_pod("dry"), dry_run=True))
    assert cache.admitted.admitted("ml-team", "") == 5
    # The timekeeper's next count is from before the later listing: they stay counted, until one after it.
    timekeeper.items[0]["fairShare"] = ranked(share=2.0, held=0.5, held_as_of=timekeeper.listed_at)
    assert cache.refresh() and cache.admitted.admitted("ml-team", "") == 5
    timekeeper.items[0]["fairShare"] = ranked(share=2.0, held=0.0, held_as_of=timekeeper.listed_at + 1)
    assert cache.refresh() and cache.admitted.admitted("ml-team", "") == 0
    assert admitted(client, whole_gpu_pod("next"))[1]["spec"]["priorityClassName"] == LIGHT


def test_among_several_webhook_processes_each_fills_its_part_of_the_room_in_the_band(
    timekeeper: FakeTimekeeper,
) -> None:
    """Four processes, 4 GPUs of room: a burst spread over them all puts at most one pod per process beyond it."""
    timekeeper.items = [{"namespace": "ml-team", "state": "in-budget", "fairShare": ranked(share=4.0, held=0.0)}]
    timekeeper.extra = {"fairShare": {"classes": CLASSES, "webhookProcesses": 4}}
    cache = BudgetStateCache(timekeeper.url)
    assert cache.refresh() and cache.fair_share().processes == 4
    client = client_of(cache)
    classes = [admitted(client, whole_gpu_pod(f"p-{i}"))[1]["spec"]["priorityClassName"] for i in range(3)]
    assert classes == [LIGHT, MIDDLE, MIDDLE]  # its part is 1 GPU
    reason = admitted(client, whole_gpu_pod("p-4"))[1]["metadata"]["annotations"]["gpusharing.io/fair-share-reason"]
    assert ("one band lower: this webhook process admitted 3 GPUs since they were counted, its part (1) of the room "
            "left in its fair share of 4 GPUs, which 4 webhook processes share") in reason
    # A listing that claims no number, or nonsense, is one process: the plain guard.
    for claimed in (None, 0, -3, "4", True, 2.5):
        assert (
            states_from_listing(
                {"items": [], "fairShare": {"classes": CLASSES, "webhookProcesses": claimed}}
            ).webhook_processes
            == 1
        )


def test_a_heavy_namespace_s_burst_stays_in_the_last_band(timekeeper: FakeTimekeeper) -> None:
    client = client_of(listed(timekeeper, ranked(band=HEAVY, burst=HEAVY, share=0.5, held=3)))
    assert admitted(client, whole_gpu_pod())[1]["spec"]["priorityClassName"] == HEAVY


def test_a_tenant_naming_a_band_is_refused_and_cannot_forge_the_webhook_s_record(timekeeper: FakeTimekeeper) -> None:
    client = client_of(listed(timekeeper, ranked(band=HEAVY, burst=HEAVY)))
    response = review(client, admission_review(whole_gpu_pod(priorityClassName=LIGHT)))
    assert not response["allowed"] and response["status"]["code"] == 403
    assert "'gpusharing-in-budget-light'" in response["status"]["message"]
    forged = whole_gpu_pod(priorityClassName=LIGHT)
    forged["metadata"]["annotations"][BAND] = LIGHT
    _, mutated = admitted(client, forged)  # taken for a reinvocation: the band is the webhook's all the same
    assert mutated["spec"]["priorityClassName"] == HEAVY and mutated["metadata"]["annotations"][BAND] == HEAVY


def test_a_reinvocation_changes_nothing_and_validation_admits_the_band(timekeeper: FakeTimekeeper) -> None:
    client = client_of(listed(timekeeper, ranked(share=1.0)))
    body = admission_review(whole_gpu_pod())
    first = review(client, body)
    mutated = jsonpatch.apply_patch(body["request"]["object"], patch_of(first))
    assert mutated["spec"]["priorityClassName"] == LIGHT
    # the same request's uid: its own GPU is not counted twice
    again = {**body, "request": {**body["request"], "object": mutated}}
    assert patch_of(review(client, again)) == []
    assert review(client, again, "/validate")["allowed"]


def test_out_of_budget_and_unranked_namespaces_are_admitted_as_without_fair_share(timekeeper: FakeTimekeeper) -> None:
    over = admitted(client_of(listed(timekeeper, ranked(), state="over-budget")), whole_gpu_pod())[1]
    assert over["spec"]["priorityClassName"] == "gpusharing-over-budget" and BAND not in over["metadata"]["annotations"]
    unranked = admitted(client_of(listed(timekeeper, None)), whole_gpu_pod())[1]
    assert (
        unranked["spec"]["priorityClassName"] == "gpusharing-in-budget"
        and BAND not in unranked["metadata"]["annotations"]
    )
    # but queued all the same: a namespace not ranked yet does not skip the queue
    assert over["spec"]["schedulingGates"] == unranked["spec"]["schedulingGates"] == [GATE]


def test_a_listing_s_band_the_webhook_cannot_read_leaves_the_namespace_unranked() -> None:
    for bad in (
        {"band": LIGHT},
        {**ranked(), "shareGpus": -1},
        {**ranked(), "heldGpus": float("nan")},
        {**ranked(), "band": ""},
        "light",
    ):
        states = states_from_listing({"items": [{"namespace": "ml-team", "state": "in-budget", "fairShare": bad}],
                                      "fairShare": {"classes": CLASSES}})
        assert states.of("ml-team").fair_share is None, bad
    assert states.band_classes == tuple(CLASSES)
    assert states_from_listing({"items": [], "fairShare": {"classes": "light"}}).band_classes == ()


# The fair-share gate (Kueue's admission gate): while fair share is on in a namespace, each of its GPU pods waits
# behind a scheduling gate, which the timekeeper's controller removes in fair-share order.
GATE = {"name": "gpusharing.io/fair-share"}


def test_with_fair_share_on_a_gpu_pod_in_budget_waits_behind_the_fair_share_gate(timekeeper: FakeTimekeeper) -> None:
    response, mutated = admitted(client_of(listed(timekeeper, ranked())), whole_gpu_pod())
    assert mutated["spec"]["schedulingGates"] == [GATE]
    assert {"op": "add", "path": "/spec/schedulingGates", "value": [GATE]} in patch_of(response)
    kubernetes_validate.validate(mutated, KUBERNETES_VERSION, strict=True)


def test_with_fair_share_on_a_gpu_pod_out_of_budget_waits_behind_the_gate_too(timekeeper: FakeTimekeeper) -> None:
    over = admitted(client_of(listed(timekeeper, ranked(), state="over-budget")), whole_gpu_pod())[1]
    assert over["spec"]["priorityClassName"] == "gpusharing-over-budget" and over["spec"]["schedulingGates"] == [GATE]


def test_with_fair_share_on_a_gpu_pod_of_an_allowed_class_waits_behind_the_gate_too(
    timekeeper: FakeTimekeeper,
) -> None:
    config = WebhookConfig(allowed_priority_classes=frozenset({"research-high"}))
    client = create_app(config, listed(timekeeper, ranked())).test_client()
    _, mutated = admitted(client, whole_gpu_pod(priorityClassName="research-high"))
    assert mutated["spec"]["priorityClassName"] == "research-high" and mutated["spec"]["schedulingGates"] == [GATE]


def test_with_fair_share_off_no_gate_is_added(timekeeper: FakeTimekeeper) -> None:
    response, unranked = admitted(client_of(listed(timekeeper, None, on=False)), whole_gpu_pod())
    assert "schedulingGates" not in unranked["spec"]
    assert not [op for op in patch_of(response) if op["path"].startswith("/spec/schedulingGates")]


def test_the_gate_is_added_after_the_pod_s_own_gates_which_stay(timekeeper: FakeTimekeeper) -> None:
    own = [{"name": "example.com/quota"}, {"name": "example.com/data-ready"}]
    response, mutated = admitted(client_of(listed(timekeeper, ranked())), whole_gpu_pod(schedulingGates=own))
    assert mutated["spec"]["schedulingGates"] == [*own, GATE]
    assert {"op": "add", "path": "/spec/schedulingGates/-", "value": GATE} in patch_of(response)


def test_a_reinvocation_with_the_gate_present_adds_no_patch(timekeeper: FakeTimekeeper) -> None:
    client = client_of(listed(timekeeper, ranked()))
    body = admission_review(whole_gpu_pod(schedulingGates=[{"name": "example.com/quota"}]))
    mutated = jsonpatch.apply_patch(body["request"]["object"], patch_of(review(client, body)))
    # the same request's uid, reinvoked after another webhook: its own gate and the pod's stand as they are
    again = {**body, "request": {**body["request"], "object": mutated}}
    assert patch_of(review(client, again)) == []
    assert mutated["spec"]["schedulingGates"] == [{"name": "example.com/quota"}, GATE]
    assert review(client, again, "/validate")["allowed"]


def test_with_fair_share_on_a_pod_that_names_its_node_is_refused_and_says_why(timekeeper: FakeTimekeeper) -> None:
    response = review(client_of(listed(timekeeper, ranked())), admission_review(whole_gpu_pod(nodeName="gpu-node-1")))
    assert not response["allowed"] and response["status"]["code"] == 403
    assert response["status"]["message"] == (
        "fair share is on in namespace 'ml-team': GPU pods wait in its queue and kube-scheduler places them; a pod "
        "cannot name its node (spec.nodeName): remove it, and choose nodes with a nodeSelector or node affinity"
    )
    # With fair share off, the pod is not gated: it may name its node.
    admitted(client_of(listed(timekeeper, None, on=False)), whole_gpu_pod(nodeName="gpu-node-1"))
