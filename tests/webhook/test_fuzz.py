"""Fuzz: any review, or any body at all, gets an answer that parses, never a 5xx; what is admitted is billed within
the documented bounds (gpusharing.units.share), mutated once, and admitted again by /validate.

The `ci` profile draws the same few examples on every run; HYPOTHESIS_PROFILE=long draws thousands of fresh ones.
"""

from __future__ import annotations

import base64
import copy
import json
from decimal import Decimal
from typing import Any

import jsonpatch
import pytest
from flask.testing import FlaskClient
from hypothesis import event, given
from hypothesis import strategies as st

from demo.apiserver import admission_review
from gpusharing.contract import ANNOTATION_GPU_SHARE, ANNOTATION_PREFIX
from gpusharing.decoded import as_mapping
from gpusharing.gpu.dialects import ALIYUN_KEYS, GPU_MANAGER_KEYS, KAI_ANNOTATIONS, NVIDIA_GPU, HamiSettings
from gpusharing.units.share import MAX_GPU_SHARE, MIN_GPU_SHARE, SHARE_PRECISION
from tests.hostile import JSON_VALUES, NUMBER_TEXT
from webhook.api.reviews import MAX_REVIEW_BYTES

NAMES = st.text("abcdefghij-", min_size=1, max_size=8)
VALUES = st.one_of(NUMBER_TEXT, NUMBER_TEXT, st.integers(-(10**40), 10**40), JSON_VALUES)
# Every resource a dialect reads, as a default installation names them, and a MIG slice.
RESOURCE_KEYS = (*GPU_MANAGER_KEYS, NVIDIA_GPU, *HamiSettings().sharing_keys, *ALIYUN_KEYS, "nvidia.com/mig-1g.10gb")
ANNOTATION_KEYS = st.sampled_from(
    [*KAI_ANNOTATIONS, ANNOTATION_GPU_SHARE, f"{ANNOTATION_PREFIX}gpu-memory-mib", "team", "a~b/c"]
)
MAX_MESSAGE = 10 * (4 * 64 + 200)  # ten rules shown, each quoting at most two values cut short


@st.composite
def containers(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(JSON_VALUES)  # not even an object
    limits = draw(st.dictionaries(st.sampled_from(RESOURCE_KEYS), VALUES, max_size=3))
    resources: dict[str, Any] = {"limits": limits}
    if draw(st.booleans()):
        resources["requests"] = (
            limits if draw(st.booleans()) else draw(st.dictionaries(st.sampled_from(RESOURCE_KEYS), VALUES, max_size=2))
        )
    return {"name": draw(NAMES | JSON_VALUES), "image": "cuda", "resources": resources}


METER_NAMES = st.sampled_from(["gpusharing-meter", "gpusharing-meter-token", "gpusharing-meter-state", "infer"])


@st.composite
def ephemeral_containers(draw: st.DrawFn) -> Any:
    """What `kubectl debug` adds, aimed at the meter or its volumes, or anything at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JSON_VALUES)
    mounts = draw(
        st.lists(
            st.fixed_dictionaries({"name": METER_NAMES | JSON_VALUES, "mountPath": st.just("/m")}) | JSON_VALUES,
            max_size=2,
        )
    )
    return {
        "name": draw(NAMES | JSON_VALUES),
        "image": "busybox",
        "targetContainerName": draw(METER_NAMES | JSON_VALUES),
        "volumeMounts": mounts,
    }


@st.composite
def reviews(draw: st.DrawFn) -> dict[str, Any]:
    """AdmissionReviews of pods whose GPU requests, annotations and shapes are anything at all."""
    spec: dict[str, Any] = {"containers": draw(st.lists(containers(), max_size=3))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(st.lists(containers(), max_size=2))
    annotations = draw(st.dictionaries(ANNOTATION_KEYS, VALUES, max_size=4))
    metadata = {"name": "p", "namespace": "ml-team", "annotations": annotations}
    review = admission_review({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
    request = review["request"]
    if draw(st.integers(0, 9)) == 0:
        request["object"]["metadata"] = draw(JSON_VALUES)
    if draw(st.integers(0, 9)) == 0:
        request[
            draw(
                st.sampled_from(
                    ["uid", "operation", "kind", "namespace", "object", "oldObject", "userInfo", "subResource"]
                )
            )
        ] = draw(JSON_VALUES)
    if draw(st.integers(0, 4)) == 0:  # an UPDATE, of the pod or of a subresource, that may take the finalizer off
        request["operation"] = "UPDATE"
        request["oldObject"] = copy.deepcopy(request["object"])
        request["subResource"] = draw(st.sampled_from(["", "ephemeralcontainers", "resize", "status"]))
        old_metadata = as_mapping(request["oldObject"]).get("metadata")
        if isinstance(old_metadata, dict):
            old_metadata["finalizers"] = draw(
                st.lists(st.sampled_from(["gpusharing.io/billing", "x"]) | JSON_VALUES, max_size=2) | JSON_VALUES
            )
        spec = as_mapping(request["object"]).get("spec")
        if isinstance(spec, dict):
            spec["ephemeralContainers"] = draw(st.lists(ephemeral_containers(), max_size=2) | JSON_VALUES)
    return review


def answer_of(client: FlaskClient, endpoint: str, body: bytes) -> tuple[int, Any]:
    response = client.post(endpoint, data=body, content_type="application/json")
    parsed = json.loads(response.get_data())  # every answer is JSON, whatever the status
    return response.status_code, parsed


def check_admission(client: FlaskClient, review: dict[str, Any], endpoint: str) -> dict[str, Any] | None:
    """The review's answer checked; the patched pod when /mutate admitted a GPU pod."""
    status, answer = answer_of(client, endpoint, json.dumps(review).encode())
    event(f"{endpoint}: {status} {answer.get('response', {}).get('allowed', '')}")
    if status == 400:
        assert answer["error"].startswith("not an AdmissionReview: ")
        return None
    assert status == 200, answer
    response = answer["response"]
    assert response["uid"] == review["request"]["uid"] and isinstance(response["allowed"], bool)
    if not response["allowed"]:
        message = response["status"]["message"]
        assert isinstance(message, str) and 0 < len(message) <= MAX_MESSAGE, message
        return None
    if "patch" not in response:
        return None
    event("a GPU pod admitted and mutated")
    pod = jsonpatch.apply_patch(review["request"]["object"], json.loads(base64.b64decode(response["patch"])))
    share = Decimal(pod["metadata"]["annotations"][ANNOTATION_GPU_SHARE])
    assert MIN_GPU_SHARE <= share <= MAX_GPU_SHARE and share == share.quantize(SHARE_PRECISION)
    return pod


@given(review=reviews())
def test_any_review_gets_an_answer_that_parses_and_bills_within_bounds(
    client: FlaskClient, review: dict[str, Any]
) -> None:
    assert check_admission(client, review, "/validate") is None  # /validate never patches
    mutated = check_admission(client, review, "/mutate")
    if mutated is not None:  # admitted: mutated once, admitted as it is
        again = copy.deepcopy(review)
        again["request"]["object"] = mutated
        status, answer = answer_of(client, "/mutate", json.dumps(again).encode())
        assert status == 200 and answer["response"]["allowed"] and "patch" not in answer["response"]
        status, answer = answer_of(client, "/validate", json.dumps(again).encode())
        assert status == 200 and answer["response"]["allowed"], answer


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """Bytes that are almost a review: a real one cut, spliced, repeated or nested, or anything at all."""
    text = json.dumps(draw(reviews())).encode()
    kind = draw(st.sampled_from(["cut", "splice", "nest", "bytes", "json"]))
    if kind == "cut":
        return text[: draw(st.integers(0, len(text)))]
    if kind == "splice":
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.binary(max_size=20)) + text[at + draw(st.integers(0, 20)):]
    if kind == "nest":
        depth = draw(st.integers(90, 5000))
        return b"[" * depth + text + b"]" * depth
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    return json.dumps(draw(JSON_VALUES)).encode()


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
@given(body=bodies())
def test_any_body_gets_a_400_or_an_answer_never_a_5xx(client: FlaskClient, endpoint: str, body: bytes) -> None:
    assert len(body) <= MAX_REVIEW_BYTES
    status, answer = answer_of(client, endpoint, body)
    assert status in (200, 400), answer
    if status == 400:
        assert answer["error"].startswith("not an AdmissionReview: ")
    else:
        assert isinstance(answer["response"]["allowed"], bool)


DIALECT_REQUESTS = st.one_of(
    st.fixed_dictionaries({"limits": st.fixed_dictionaries({"nvidia.com/gpu": st.integers(1, 1001).map(str)})}),
    st.fixed_dictionaries(
        {
            "annotations": st.fixed_dictionaries(
                {
                    "gpu-fraction": st.decimals(
                        min_value=Decimal("0.00005"), max_value=Decimal("1.0001"), places=30
                    ).map(str)
                },
                optional={"gpu-fraction-num-devices": st.integers(1, 1001).map(str)},
            )
        }
    ),
    st.fixed_dictionaries({"annotations": st.fixed_dictionaries({"gpu-memory": st.integers(1, 90000).map(str)})}),
    st.fixed_dictionaries(
        {
            "limits": st.fixed_dictionaries(
                {"nvidia.com/gpu": st.integers(1, 1001).map(str)},
                optional={
                    "nvidia.com/gpumem": st.integers(1, 90000).map(str),
                    "nvidia.com/gpucores": st.integers(0, 100).map(str),
                },
            )
        }
    ),
    st.fixed_dictionaries({"limits": st.fixed_dictionaries({"aliyun.com/gpu-mem": st.integers(1, 100).map(str)})}),
    st.fixed_dictionaries(
        {
            "limits": st.fixed_dictionaries(
                {
                    "tencent.com/vcuda-core": st.integers(1, 99).map(str),
                    "tencent.com/vcuda-memory": st.integers(1, 400).map(str),
                }
            )
        }
    ),
    st.fixed_dictionaries(
        {"limits": st.fixed_dictionaries({"tencent.com/vcuda-core": st.integers(1, 1001).map(lambda n: str(100 * n))})}
    ),
)


@given(requests=st.lists(DIALECT_REQUESTS, min_size=1, max_size=3))
def test_every_admitted_gpu_pod_is_billed_within_bounds_and_every_refusal_says_why(
    client: FlaskClient, requests: list[dict[str, Any]]
) -> None:
    containers = [
        {"name": f"c{i}", "image": "cuda", "resources": {"limits": r.get("limits", {})}} for i, r in enumerate(requests)
    ]
    annotations = {key: value for r in requests for key, value in r.get("annotations", {}).items()}
    review = admission_review(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml-team", "annotations": annotations},
            "spec": {"containers": containers},
        }
    )
    status, answer = answer_of(client, "/mutate", json.dumps(review).encode())
    assert status == 200
    response = answer["response"]
    if response["allowed"]:
        event("admitted")
        assert check_admission(client, review, "/mutate") is not None  # billed within bounds
    else:
        event("refused")
        assert response["status"]["code"] == 422 and response["status"]["message"].startswith("invalid GPU request: ")
