"""Property: /mutate on its own output returns no patch, and the result is a valid pod the validator admits."""

from __future__ import annotations

from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from demo.apiserver import admission_review, api_server_pod
from gpusharing.contract import BudgetState
from tests.webhook.test_priorities import CLASSES
from webhook.admission.policy import admit
from webhook.admission.review import parse_review
from webhook.caches.budgets import NamespaceBudget
from webhook.caches.priorities import PriorityLookup, no_priorities
from webhook.config import MeterSpec, WebhookConfig

KUBERNETES_VERSION = "1.37.0"

RESOURCE_DIALECTS = st.sampled_from(
    [
        {"nvidia.com/gpu": 1},
        {"nvidia.com/gpu": 2},
        {"tencent.com/vcuda-core": 30, "tencent.com/vcuda-memory": 8},
        {"tencent.com/vcuda-core": 100},
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000, "nvidia.com/gpucores": 25},
        {"nvidia.com/gpumem-percentage": 50},
        {"aliyun.com/gpu-mem": 3},
    ]
)
KAI_ANNOTATIONS = st.sampled_from(
    [{"gpu-fraction": "0.5"}, {"gpu-memory": "4096"}, {"gpu-fraction": "0.25", "gpu-fraction-num-devices": "2"}]
)
NAMES = st.text("abcdefghij", min_size=1, max_size=6)


@st.composite
def gpu_pods(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    containers: list[dict[str, Any]] = [{"name": n, "image": "busybox:1.36"} for n in names]
    annotations = draw(st.dictionaries(st.sampled_from(["team", "example.com/owner", "a~b/c"]), NAMES, max_size=2))
    if draw(st.booleans()):
        containers[draw(st.integers(0, len(containers) - 1))]["resources"] = {"limits": draw(RESOURCE_DIALECTS)}
    else:
        annotations.update(draw(KAI_ANNOTATIONS))
    spec: dict[str, Any] = {"containers": containers}
    if draw(st.booleans()):
        spec["initContainers"] = [
            {"name": "init-" + n, "image": "busybox:1.36"} for n in draw(st.lists(NAMES, max_size=2, unique=True))
        ]
    if draw(st.booleans()):
        spec["volumes"] = [{"name": "data", "emptyDir": {}}]
    if draw(st.booleans()):
        spec["priorityClassName"] = draw(
            st.sampled_from(["research-high", "gpusharing-in-budget", "gpusharing-over-budget"])
        )
    return api_server_pod(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": annotations}, "spec": spec}
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=gpu_pods(), state=st.sampled_from(list(BudgetState)), mode=st.sampled_from(["native", "container"]),
       priorities=st.sampled_from([no_priorities, CLASSES.get]))
def test_mutation_is_idempotent(pod: dict[str, Any], state: BudgetState, mode: str, priorities: PriorityLookup) -> None:
    config = WebhookConfig(meter=MeterSpec(mode=mode), allowed_priority_classes=frozenset({"research-high"}))
    first = admit(
        parse_review(admission_review(pod)),
        config,
        lambda _ns: NamespaceBudget(state),
        mutate=True,
        priorities=priorities,
    )
    assert first.allowed, first.message
    assert first.patch
    mutated = jsonpatch.apply_patch(pod, first.patch)

    second = admit(parse_review(admission_review(mutated)), config, lambda _ns: NamespaceBudget(state), mutate=True,
                   priorities=priorities)
    assert second.allowed and second.patch == []
    assert admit(
        parse_review(admission_review(mutated)), config, lambda _ns: NamespaceBudget(state), mutate=False
    ).allowed


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=gpu_pods(), state=st.sampled_from(list(BudgetState)))
def test_mutated_pod_is_valid_against_the_kubernetes_schema(pod: dict[str, Any], state: BudgetState) -> None:
    import kubernetes_validate

    config = WebhookConfig(allowed_priority_classes=frozenset({"research-high"}))
    decision = admit(parse_review(admission_review(pod)), config, lambda _ns: NamespaceBudget(state), mutate=True)
    kubernetes_validate.validate(jsonpatch.apply_patch(pod, decision.patch), KUBERNETES_VERSION, strict=True)
