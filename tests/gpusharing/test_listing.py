"""The budget listing's contract: what the timekeeper writes reads back as it was; an answer that is no listing is
refused with a sentence saying why; within one, what a reader cannot read costs it that field and no more."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

from gpusharing.contract import AdmissionMode, BudgetState, Period, Shortfall
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
    ListingError,
    Uncommitted,
    listing_of,
)
from gpusharing.listing.values import MAX_BAND_CLASSES, MAX_ITEMS, MAX_REASON


def full_entry(namespace: str = "ml-team") -> ListedBudget:
    """A namespace's status with every field the contract has set, its band with its detail (a budget read alone)."""
    return ListedBudget(
        namespace=namespace, kind="namespace", gpu_minutes=6000.0, period=Period.MONTHLY,
        period_start="2026-11-01T00:00:00Z", period_end="2026-12-01T00:00:00Z", used_gpu_minutes=5200.0,
        remaining_gpu_minutes=800.0, top_up_gpu_minutes=0.0, percent_used=86.7, evict_on_exhaustion=True,
        warning_thresholds=(80, 95), admission=AdmissionMode.SAFE, on_shortfall=Shortfall.REFUSE,
        idle=IdleRule("4h", "evict", "30m", 1.0, "1h"),
        idle_in_force=IdleInForce("4h", "evict", "30m", 1.0, "1h", source=namespace),
        parent="team.vision", ancestors=("team.vision",), managed_by=f"GPUBudget {namespace}/budget",
        own_state=BudgetState.WARNING, state=BudgetState.WARNING, limited_by=namespace,
        warnings=(BudgetWarning(namespace, 86.7, 6000.0, Period.MONTHLY, "2026-11-01T00:00:00Z"),),
        committed_gpu_minutes=20.0,
        uncommitted=Uncommitted(2.0, 120_000_000, "team.vision", 30.0, 25.0, 3.0),
        idle_holds=(IdleHold("ReplicaSet", "nb-7d9", "uid-nb-7d9", "nb-7d9-x2k", "2026-11-27T13:00:00Z"),),
        fair_share=FairShareStanding(
            band="gpusharing-in-budget-light", burst_class="gpusharing-in-budget", share_gpus=2.0, held_gpus=0.5,
            ratio=0.2, rank=1, reason="ml-team used 0.2x its fair share", since="2026-11-25T10:00:00Z",
            usage_gpu_seconds=1440.0, as_of="2026-11-27T12:00:00Z", half_life_seconds=86400.0, held_as_of=1795780800.0,
            path=(FairShareLevel(1, "team.vision", 1.0, 1.0, 1.0, 1, 1),
                  FairShareLevel(2, namespace, 0.5, 0.1, 0.2, 1, 2)),
            zero_use_change="2026-11-28T10:00:00Z",
        ),
    )


def full_listing() -> BudgetListing:
    """A listing with every field the contract has set, fair share on."""
    return BudgetListing(
        (full_entry(), full_entry("cv-team")), DefaultBudget(600.0, Period.WEEKLY, BudgetState.IN_BUDGET),
        1795780800.5, FairShareListing(("gpusharing-in-budget-light", "gpusharing-in-budget"), 3),
    )


def test_what_the_timekeeper_writes_reads_back_as_it_was() -> None:
    listing = full_listing()
    body = json.loads(json.dumps(listing.to_json()))  # as it crosses the wire
    assert BudgetListing.from_json(body) == listing
    assert BudgetListing.from_json(body).to_json() == body
    entry = full_entry()
    assert ListedBudget.from_json(json.loads(json.dumps(entry.to_json()))) == entry


def test_numbers_are_written_back_as_they_came() -> None:
    """An int stays one: what a reader writes back (`-o json`, the audit log) says what the timekeeper said."""
    body = {"items": [{"namespace": "ml", "state": "in-budget", "gpuMinutes": 6000, "usedGpuMinutes": 1.5}],
            "listedAt": 7}
    entry = BudgetListing.from_json(body).items[0]
    assert json.dumps(entry.to_json()["gpuMinutes"]) == "6000" and entry.used_gpu_minutes == 1.5


def test_the_json_leaves_out_what_is_not_said() -> None:
    """fairShare only for a ranked namespace (only with fair share on, in the listing); its path and zeroUseChange only
    in a budget read alone; commitments, idle holds and the band never in the audit log's record of a budget."""
    plain = ListedBudget("ml", state=BudgetState.IN_BUDGET)
    assert "fairShare" not in plain.to_json() and plain.to_json()["idleHolds"] == []
    assert plain.to_json()["committedGpuMinutes"] is None and plain.to_json()["uncommitted"] is None
    recorded = full_entry().to_json(current=False)
    assert not {"committedGpuMinutes", "uncommitted", "idleHolds", "fairShare"} & set(recorded)
    assert recorded["warnings"][0]["budget"] == "ml-team"
    band = full_entry().fair_share
    assert band is not None
    listed = replace(band, path=None, zero_use_change=None).to_json()
    assert "path" not in listed and "zeroUseChange" not in listed
    assert band.to_json()["path"][1] == {"level": 2, "node": "ml-team", "share": 0.5, "usage": 0.1, "ratio": 0.2,
                                         "rank": 1, "siblings": 2}
    assert "fairShare" not in BudgetListing(()).to_json()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "the budget listing must be a JSON object"),
        ({}, "the budget listing must have a list of items"),
        ({"items": "x"}, "the budget listing must have a list of items"),
        ({"items": [{"namespace": "ml"}, "ml"]}, "items[1] must be a JSON object"),
        ({"items": [{"state": "in-budget"}]}, "items[0] must name its budget"),
        ({"items": [{"namespace": ""}]}, "items[0] must name its budget"),
        ({"items": [{"namespace": 7}]}, "items[0] must name its budget"),
        ({"items": [{"namespace": "x" * 254}]}, "items[0] must name its budget"),
        ({"items": [{"namespace": "ml"}] * (MAX_ITEMS + 1)}, f"more than the {MAX_ITEMS} any cluster has"),
    ],
)
def test_an_answer_that_is_no_listing_is_refused_saying_why(body: object, message: str) -> None:
    with pytest.raises(ListingError, match=message.replace("[", r"\[").replace("]", r"\]")):
        BudgetListing.from_json(body)


def test_a_budget_read_alone_must_be_an_object() -> None:
    with pytest.raises(ListingError, match="the budget's status must be a JSON object"):
        ListedBudget.from_json(None)
    assert ListedBudget.from_json({"state": "over-budget"}) == ListedBudget("", state=BudgetState.OVER_BUDGET)


def test_within_a_listing_what_cannot_be_read_is_unsaid() -> None:
    entry = ListedBudget.from_json({
        "namespace": "ml", "state": "something-new", "ownState": 3, "gpuMinutes": -1, "usedGpuMinutes": math.nan,
        "period": "yearly", "evictOnExhaustion": "yes", "warningThresholds": [80, "95", True, 99],
        "ancestors": "team.a", "idle": {"after": "4h"},
        "idleInForce": {"after": "4h", "action": "warn", "warnBefore": "0s", "utilisationPercent": 1, "minAge": "0s",
                        "from": 7},
        "warnings": [{"budget": "ml"}, {"budget": "ml", "percentUsed": 86, "gpuMinutes": 10, "period": "daily",
                                        "periodStart": "not a time"}],
        "uncommitted": {"gpuMinutes": 1}, "committedGpuMinutes": "20", "idleHolds": "everyone",
        "fairShare": {"band": "x"},
    })
    assert entry == ListedBudget("ml", warning_thresholds=(80, 99),
                                 idle_in_force=IdleInForce("4h", "warn", "0s", 1, "0s", source=None))
    assert entry.state is BudgetState.UNKNOWN


def test_safe_admission_s_settings_are_read_together() -> None:
    """One unreadable setting leaves both unsaid: a reader admits openly, as before safe admission, rather than by half
    of what the budget says."""
    def read(**settings: Any) -> tuple[AdmissionMode | None, Shortfall | None]:
        entry = ListedBudget.from_json({"namespace": "ml", **settings})
        return entry.admission, entry.on_shortfall

    assert read(admission="strict", onShortfall="refuse") == (AdmissionMode.STRICT, Shortfall.REFUSE)
    assert read(admission="strict") == (AdmissionMode.STRICT, None)
    assert read(onShortfall="refuse") == (None, Shortfall.REFUSE)
    assert read(admission="strict", onShortfall="queue") == (None, None)
    assert read(admission="reckless", onShortfall="refuse") == (None, None)
    assert read(admission=None, onShortfall="refuse") == (None, None)


def test_what_a_reader_keeps_is_bounded() -> None:
    band = {"band": "light", "burstClass": "middle", "shareGpus": 1, "heldGpus": 0, "reason": "r" * (MAX_REASON + 10)}
    classes = [f"class-{i}" for i in range(MAX_BAND_CLASSES + 2)]
    listing = BudgetListing.from_json({"items": [{"namespace": "ml", "fairShare": band}],
                                       "fairShare": {"classes": ["", 7, *classes], "webhookProcesses": "4"}})
    standing = listing.items[0].fair_share
    assert standing is not None and standing.reason == "r" * MAX_REASON and standing.rank is None
    assert listing.fair_share == FairShareListing(tuple(classes[:MAX_BAND_CLASSES - 2]), None)
    holds = [{"kind": "Job", "name": "j", "uid": "u" * 254, "pod": "p", "heldAt": "t"},
             {"kind": "Job", "name": "j", "uid": "u", "pod": "p", "heldAt": "t"}]
    read = ListedBudget.from_json({"namespace": "ml", "idleHolds": holds})
    assert read.idle_holds == (IdleHold("Job", "j", "u", "p", "t"),)


@pytest.mark.parametrize("bad", [
    None, "band", {"band": "light"}, {"band": "light", "burstClass": "", "shareGpus": 1, "heldGpus": 0},
    {"band": "light", "burstClass": "middle", "shareGpus": -1, "heldGpus": 0},
    {"band": "light", "burstClass": "middle", "shareGpus": 1, "heldGpus": math.inf},
])
def test_a_band_without_its_classes_and_figures_is_no_band(bad: object) -> None:
    assert FairShareStanding.read(bad) is None


def test_the_default_budget_and_fair_share_are_unsaid_when_not_objects() -> None:
    listing = BudgetListing.from_json({"items": [], "default": "monthly", "fairShare": ["light"], "listedAt": True})
    assert (listing.default, listing.fair_share, listing.listed_at) == (None, None, None)
    assert DefaultBudget.read({"state": "?"}) == DefaultBudget(None, None, BudgetState.UNKNOWN)


def test_one_budget_s_listing_is_the_answer_as_it_came() -> None:
    body = {"items": [{"namespace": "ml", "extra": 1}, {"namespace": "cv"}], "listedAt": 3, "default": None}
    assert listing_of(body, "ml") == {"items": [{"namespace": "ml", "extra": 1}], "listedAt": 3, "default": None}
    with pytest.raises(ListingError):
        listing_of({"items": None}, "ml")
