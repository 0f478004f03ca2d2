"""The budget listing's contract (gpusharing.listing) held to openapi.yaml: the JSON of a fully populated listing is
what the API documents, every property the API documents is a field of the contract (and none else), and what the
timekeeper answers reads back through the contract as it was answered."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpusharing.listing import (
    BudgetListing,
    BudgetWarning,
    DefaultBudget,
    FairShareLevel,
    FairShareListing,
    FairShareStanding,
    IdleHold,
    IdleInForce,
    IdleRule,
    ListedBudget,
    Uncommitted,
)
from tests.gpusharing.test_listing import full_entry, full_listing
from tests.timekeeper.conftest import ADMIN, METER, SPEC, AppFactory, SpecClient, check_against_spec

SCHEMAS = SPEC["components"]["schemas"]
LISTING = SPEC["paths"]["/api/v1/budgets"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
STATUS = SCHEMAS["BudgetStatus"]

# Each class of the contract, and the schema openapi.yaml gives its JSON.
DOCUMENTED: list[tuple[type[Any], dict[str, Any]]] = [
    (BudgetListing, LISTING),
    (FairShareListing, LISTING["properties"]["fairShare"]),
    (DefaultBudget, SCHEMAS["DefaultBudget"]),
    (ListedBudget, STATUS),
    (BudgetWarning, SCHEMAS["BudgetWarning"]),
    (Uncommitted, SCHEMAS["Uncommitted"]),
    (IdleRule, SCHEMAS["IdlePolicy"]),
    (IdleInForce, next(choice for choice in SCHEMAS["IdleInForce"]["oneOf"] if choice.get("type") == "object")),
    (IdleHold, STATUS["properties"]["idleHolds"]["items"]),
    (FairShareStanding, STATUS["properties"]["fairShare"]),
    (FairShareLevel, STATUS["properties"]["fairShare"]["properties"]["path"]["items"]),
]


@pytest.mark.parametrize(("contract", "schema"), DOCUMENTED, ids=[contract.__name__ for contract, _ in DOCUMENTED])
def test_every_documented_property_is_a_field_of_the_contract_and_none_else(
    contract: type[Any], schema: dict[str, Any],
) -> None:
    assert list(contract.FIELDS) == list(dict.fromkeys(contract.FIELDS))
    assert set(contract.FIELDS) == set(schema["properties"]), f"{contract.__name__} and openapi.yaml have drifted apart"
    assert set(contract.FIELDS.values()) == {field.name for field in dataclasses.fields(contract)}


def test_a_fully_populated_listing_is_what_openapi_yaml_documents() -> None:
    body = full_listing().to_json()
    check_against_spec("GET", "/api/v1/budgets", 200, body, "application/json")
    assert set(body) == set(LISTING["properties"]) and set(body["items"][0]) == set(STATUS["properties"])
    band = body["items"][0]["fairShare"]
    assert set(band) == set(STATUS["properties"]["fairShare"]["properties"])
    check_against_spec("GET", "/api/v1/budgets/ml-team", 200, full_entry().to_json(), "application/json")


def test_the_audit_log_s_record_of_a_budget_is_a_status_without_what_changes_with_pods() -> None:
    change = {"namespace": "ml-team", "action": "set", "actor": "alice", "changedAt": "2026-11-27T13:00:00Z",
              "before": full_entry().to_json(current=False), "after": None}
    check_against_spec("GET", "/api/v1/budgets/ml-team/changes", 200, {"items": [change]}, "application/json")


def test_what_the_timekeeper_answers_reads_back_through_the_contract_as_answered(make_app: AppFactory) -> None:
    """What the webhook and the admin command line read is all the timekeeper says: nothing is lost on the way."""
    api = SpecClient(make_app(default_gpu_minutes=600).test_client(), ADMIN)
    idle = {"after": "4h", "action": "evict", "warnBefore": "30m", "minAge": "1h"}
    group = {"gpuMinutes": 3, "period": "daily", "idle": idle}
    assert api.put("/api/v1/budgets/team.vision", json=group).status_code == 201
    assert api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 10, "parent": "team.vision", "admission": "safe",
                                                   "warningThresholds": [50]}).status_code == 201
    assert api.post("/api/v1/budgets/team-a/top-ups", json={"gpuMinutes": 1.5, "reason": "deadline"}).status_code == 201
    body = {"podUid": "uid-a", "namespace": "team-a", "pod": "p", "gpuShare": 1.0, "seq": 1, "gpuSeconds": 150}
    assert api.as_(METER).post("/api/v1/reports", json=body).json["state"] == "warning"
    listing = api.get("/api/v1/budgets").json
    assert {w["budget"] for item in listing["items"] for w in item["warnings"]} == {"team.vision"}
    assert BudgetListing.from_json(listing).to_json() == listing
    for name in ("team-a", "team.vision"):
        status = api.get(f"/api/v1/budgets/{name}").json
        assert ListedBudget.from_json(status).to_json() == status
    for change in api.get("/api/v1/budgets/team-a/changes").json["items"]:
        if change["before"] is not None:
            assert ListedBudget.from_json(change["before"]).to_json(current=False) == change["before"]
