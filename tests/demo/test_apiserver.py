"""demo.apiserver.apply_patch, what the demo applies the webhook's patches with instead of the test extra's jsonpatch:
the same pods as jsonpatch makes, for every example pod's real patch and for removals under escaped keys."""

from __future__ import annotations

import jsonpatch
import pytest

from demo.apiserver import admission_review, apply_patch, example_manifests, example_pod
from gpusharing.contract import BudgetState
from webhook.admission.patch import pointer
from webhook.admission.policy import admit
from webhook.admission.review import parse_review
from webhook.caches.budgets import NamespaceBudget
from webhook.config import WebhookConfig

EXAMPLE_PODS = [name for name, manifest in example_manifests().items() if manifest["kind"] in ("Pod", "Job")]


@pytest.mark.parametrize("name", EXAMPLE_PODS)
def test_the_webhooks_patch_of_each_example_pod_gives_what_jsonpatch_gives(name: str) -> None:
    pod = example_pod(name)
    decision = admit(
        parse_review(admission_review(pod)),
        WebhookConfig(),
        lambda _ns: NamespaceBudget(BudgetState.OVER_BUDGET),
        mutate=True,
    )
    assert decision.patch, f"{name} is a GPU pod: the webhook mutates it"
    assert apply_patch(pod, decision.patch) == jsonpatch.apply_patch(pod, decision.patch)
    assert apply_patch(pod, decision.patch) != pod and pod == example_pod(name)  # the pod itself left as it was


def test_adds_and_removes_under_escaped_keys_and_list_positions() -> None:
    pod = {
        "metadata": {"annotations": {"a~b/c": "1", "keep": "2"}},
        "spec": {"containers": [{"name": "x"}, {"name": "y"}]},
    }
    patch = [
        {"op": "remove", "path": pointer("metadata", "annotations", "a~b/c")},
        {"op": "add", "path": pointer("metadata", "annotations", "gpusharing.io/x"), "value": "v"},
        {"op": "add", "path": "/spec/containers/-", "value": {"name": "z"}},
        {"op": "add", "path": "/spec/containers/0", "value": {"name": "w"}},
        {"op": "remove", "path": "/spec/containers/2"},
    ]
    assert apply_patch(pod, patch) == jsonpatch.apply_patch(pod, patch)
    with pytest.raises(ValueError, match="not replace"):
        apply_patch(pod, [{"op": "replace", "path": "/spec", "value": {}}])
