"""Fuzz, on SQLite and PostgreSQL: any report, budget or top-up body and any namespace in a path gets an answer
openapi.yaml documents (the `api` client holds every answer to it), never a 5xx; what is charged stays within the
contract's bounds and adds up, exactly, to the namespaces' use and the pods' ledgers.

The `ci` profile draws the same few examples on every run; HYPOTHESIS_PROFILE=long draws thousands of fresh ones.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from gpusharing.report import MAX_GPU_SECONDS
from gpusharing.units.share import MAX_GPU_SHARE
from tests.hostile import JSON_VALUES, NUMBER_LITERALS, json_objects, json_text
from tests.timekeeper.conftest import METER, SpecClient

HOSTILE_TEXT = st.sampled_from(
    ["ML-Team ", "..", "'; DROP TABLE budgets; --", "a" * 64, "a\x00", "\ud800", "", "Ω", "a.b", "-a"]
)


VALID_REPORT = {
    "podUid": [f"uid-{n}" for n in range(200)],
    "namespace": ["team-a", "team-b"],
    "pod": ["trainer", "web-0.shard"],
}


def number_field(low: float, high: float) -> st.SearchStrategy[str]:
    return st.one_of(st.floats(low, high).map(repr), st.integers(int(low), int(min(high, 2**63))).map(str))


VALID_FIELDS = {
    **{key: st.sampled_from(names).map(json_text) for key, names in VALID_REPORT.items()},
    "gpuShare": number_field(0.0001, MAX_GPU_SHARE),
    "seq": st.integers(0, 10**9).map(str),
    "gpuSeconds": number_field(0, 1e6),
    "final": st.sampled_from([False] * 9 + [True]).map(json_text),  # a final report freezes its pod's ledger
    "gpuMemoryUsedMiB": number_field(0, 1e5),
    "gpuUtilizationPercent": number_field(0, 100),
    "gpuMemoryRequestedMiB": number_field(0, 1e5),
}
HOSTILE_VALUES = st.one_of(
    NUMBER_LITERALS, HOSTILE_TEXT.map(json_text), st.text(max_size=12).map(json_text), JSON_VALUES.map(json_text)
)
REQUIRED = ("podUid", "namespace", "pod", "gpuShare", "seq", "gpuSeconds")


@st.composite
def reports(draw: st.DrawFn) -> str:
    """A report body: a valid report with none, one or a few of its fields hostile, dropped, repeated or added."""
    keys = [*REQUIRED, *draw(st.lists(st.sampled_from(sorted(set(VALID_FIELDS) - set(REQUIRED))), unique=True))]
    pairs = [(key, draw(VALID_FIELDS[key])) for key in keys]
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2, 3]))):
        if not pairs:
            break
        index = draw(st.integers(0, len(pairs) - 1))
        key = pairs[index][0]
        change = draw(st.sampled_from(["hostile", "drop", "twice", "unknown"]))
        if change == "hostile":
            pairs[index] = (key, draw(HOSTILE_VALUES))
        elif change == "drop":
            del pairs[index]
        elif change == "twice":
            pairs.append((key, draw(VALID_FIELDS.get(key, HOSTILE_VALUES) | HOSTILE_VALUES)))
        else:
            pairs.append((draw(st.text(max_size=8)), draw(HOSTILE_VALUES)))
    return "{" + ", ".join(f"{json_text(key)}: {value}" for key, value in draw(st.permutations(pairs))) + "}"


BUDGET_FIELDS = {
    "gpuMinutes": st.one_of(number_field(0, 1e12), number_field(0, 1e12), NUMBER_LITERALS, JSON_VALUES.map(json_text)),
    "period": st.sampled_from(["monthly", "daily", "weekly", "none", "yearly"]).map(json_text)
    | JSON_VALUES.map(json_text),
    "evictOnExhaustion": st.booleans().map(json_text) | JSON_VALUES.map(json_text),
    "admission": st.sampled_from(["open", "safe", "strict", "Safe"]).map(json_text) | JSON_VALUES.map(json_text),
    "onShortfall": st.sampled_from(["demote", "refuse", "evict"]).map(json_text) | JSON_VALUES.map(json_text),
    "reason": st.one_of(st.just("more"), st.text(max_size=20), HOSTILE_TEXT).map(json_text)
    | JSON_VALUES.map(json_text),
}
# Any text but what routing resolves before the timekeeper sees it ("", ".", "..", a "/").
NAMESPACES = st.one_of(st.sampled_from(["team-a", "team-b"]), HOSTILE_TEXT, st.text(min_size=1, max_size=12)).filter(
    lambda name: name.strip(".") != "" and "/" not in name
)


@pytest.fixture
def charged() -> list[float]:
    """GPU-seconds the answers announced, across every example of a test (they share one app and database)."""
    return []


@given(body=reports())
def test_any_report_is_answered_as_documented_and_charges_add_up(
    api: SpecClient, charged: list[float], body: str
) -> None:
    answer = api.as_(METER).post(
        "/api/v1/reports", data=body.encode("utf-8", "surrogatepass"), content_type="application/json"
    )
    event(f"{answer.status_code} {(answer.json or {}).get('outcome', '')}")
    assert answer.status_code in (200, 400), answer.json
    if answer.status_code == 200:
        assert 0 <= answer.json["chargedGpuSeconds"] <= MAX_GPU_SECONDS
        charged.append(answer.json["chargedGpuSeconds"])
    used = sum(
        item["usedGpuMinutes"] * 60 for item in api.get("/api/v1/budgets").json["items"] if item["kind"] == "namespace"
    )
    ledgers = api.get("/api/v1/pods?limit=10000").json["items"]
    assert used == pytest.approx(sum(charged), rel=1e-9, abs=1e-6)
    assert sum(pod["gpuSeconds"] for pod in ledgers) == pytest.approx(sum(charged), rel=1e-9, abs=1e-6)
    assert all(0 < pod["gpuShare"] <= MAX_GPU_SHARE for pod in ledgers if pod["gpuSeconds"])


@given(namespace=NAMESPACES, body=json_objects(BUDGET_FIELDS, st.text(max_size=8)), top_up=st.booleans())
def test_any_budget_request_is_answered_as_documented(api: SpecClient, namespace: str, body: str, top_up: bool) -> None:
    path = f"/api/v1/budgets/{quote(namespace, safe='', errors='surrogatepass')}"
    data = body.encode("utf-8", "surrogatepass")
    answer = (api.post(f"{path}/top-ups", data=data, content_type="application/json") if top_up
              else api.put(path, data=data, content_type="application/json"))
    event(str(answer.status_code))
    assert answer.status_code in (200, 201, 400, 404, 409), answer.json  # 404: a top-up of a group without a budget
    if answer.status_code in (200, 201):
        assert api.get(path).json == answer.json  # the status after the change, as a read sees it
    for read in (
        path,
        f"{path}/changes",
        f"/api/v1/pods?namespace={quote(namespace, safe='', errors='surrogatepass')}",
    ):
        assert api.get(read).status_code in (200, 400, 404)
