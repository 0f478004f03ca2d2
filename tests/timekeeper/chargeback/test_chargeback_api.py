"""Chargeback through the API (timekeeper/api/chargeback.py), on SQLite and PostgreSQL: the FOCUS export of what the
pods held, costed by the price sheet in force in each hour, the same bytes each time once its periods closed,
corrections of a closed period in the export of the window they came in; the accounts tree from the same rows; a
tenant reads its own rows alone and nobody else's; no export without prices."""

from __future__ import annotations

import csv
import datetime as dt
import io
from decimal import Decimal

import pytest
import yaml
from flask import Flask

from demo.kubeapi import FakeKube
from gpusharing.contract import Period
from gpusharing.gpu.capacity import NodeGpus, node_gpus
from gpusharing.gpu.catalogue import shipped_catalogue
from tests.timekeeper.conftest import ADMIN, AppFactory, Clock, SpecClient
from timekeeper.accounting.ledger import Observation
from timekeeper.budgets.status import Budget
from timekeeper.chargeback.prices import price_sheet_from
from timekeeper.cluster.kube import KubeApi
from timekeeper.config import ChargebackSettings
from timekeeper.database.accounting.charging import PodObservation
from timekeeper.database.chargeback.capacity import CapacityLedger
from timekeeper.services import Services

CATALOGUE = shipped_catalogue()
A100, T4 = CATALOGUE.default.name, "Tesla T4"
UTC = dt.timezone.utc
START = dt.datetime(2026, 11, 30, 22, 0, tzinfo=UTC)
GPU_HOUR = 3_600_000_000
PRICES = price_sheet_from(yaml.safe_load(f"""
currency: EUR
prices:
- {{model: {A100}, from: 2026-01-01, listPerGpuHour: "3.00", contractedPerGpuHour: "2.40"}}
- {{model: {T4}, from: 2026-01-01, listPerGpuHour: "0.36"}}
"""), "gpu-prices.yaml", CATALOGUE)


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


@pytest.fixture
def app(make_app: AppFactory, clock: Clock, fake_kube: FakeKube) -> Flask:
    clock.at = START - dt.timedelta(hours=2)  # the sheet is recorded, in force from the next whole hour
    made = make_app(kube=KubeApi(fake_kube.api_client()), auth="tokenreview", price_sheet=PRICES,
                    chargeback=ChargebackSettings(cluster="lab"))
    services(made).ledger.terms.record_once(clock())
    clock.at = START
    return made


@pytest.fixture
def finance(fake_kube: FakeKube) -> str:
    """A cluster-wide reader's token (RBAC lets it read every GPUBudget)."""
    fake_kube.admins.add("finance")
    return fake_kube.user_token("finance")


def services(app: Flask) -> Services:
    return app.extensions["timekeeper"]


def observe(app: Flask, namespace: str, uid: str, share: float, model: str, until: dt.datetime,
            ended: bool = False) -> None:
    services(app).ledger.observe([PodObservation(uid, namespace, uid, share, Observation(share, START, until, ended),
                                                 model=model, node="gpu-1")])


def rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def focus(api: SpecClient, query: str = "from=2026-11-30&to=2026-12-02") -> tuple[str, str]:
    answer = api.get(f"/api/v1/focus?{query}")
    assert answer.status_code == 200, answer.text
    assert answer.content_type.startswith("text/csv")
    return answer.text, answer.headers["X-Gpusharing-Export-Final"]


def test_the_export_costs_each_namespaces_hours_by_the_price_in_force(app: Flask, clock: Clock, finance: str) -> None:
    store = services(app).budgets
    store.set_budget(Budget("team.vision", None, Period.MONTHLY), "alice")
    store.set_budget(Budget("team-a", None, Period.MONTHLY, parent="team.vision"), "alice")
    clock.at = START + dt.timedelta(hours=1, minutes=30)
    observe(app, "team-a", "uid-a", 0.25, A100, clock.at)
    observe(app, "team-b", "uid-b", 0.5, T4, clock.at)
    text, final = focus(SpecClient(app.test_client(), finance))
    assert final == "false"  # December is open
    exported = rows(text)
    assert [(r["SubAccountName"], r["x_GpuModel"], r["ChargePeriodStart"], r["x_ConsumedMicroGpuSeconds"])
            for r in exported] == [
        ("team-a", A100, "2026-11-30T22:00:00Z", "900000000"),
        ("team-b", T4, "2026-11-30T22:00:00Z", "1800000000"),
        ("team-a", A100, "2026-11-30T23:00:00Z", "450000000"),
        ("team-b", T4, "2026-11-30T23:00:00Z", "900000000"),
    ]
    first = exported[0]
    assert Decimal(first["ListCost"]) == Decimal("0.75") and Decimal(first["BilledCost"]) == Decimal("0.6")
    assert Decimal(exported[1]["BilledCost"]) == Decimal("0.18")  # no contracted price: the list price
    assert first["BillingCurrency"] == "EUR" and first["BillingAccountName"] == "lab"
    assert first["BillingPeriodStart"] == "2026-11-01T00:00:00Z"
    assert '"gpusharing.io/team":"team.vision"' in first["Tags"].replace(" ", "")


def test_a_closed_window_exports_the_same_bytes_whatever_comes_later_and_late_time_is_a_correction_then(
        app: Flask, clock: Clock, finance: str) -> None:
    api = SpecClient(app.test_client(), finance)
    clock.at = START + dt.timedelta(minutes=50)
    observe(app, "team-a", "uid-a", 0.5, A100, clock.at)
    clock.at = dt.datetime(2026, 12, 1, 1, 0, tzinfo=UTC)  # November closed at 01:00 (an hour's grace)
    store = services(app).budgets
    store.set_budget(Budget("team.vision", None, Period.MONTHLY), "alice")
    store.set_budget(Budget("team-a", None, Period.MONTHLY, parent="team.vision"), "alice")
    november, final = focus(api, "from=2026-11-01&to=2026-12-01")
    assert final == "true" and "team.vision" in november
    observe(app, "team-a", "uid-a", 0.5, A100, dt.datetime(2026, 11, 30, 23, 30, tzinfo=UTC))  # the controller was away
    store.set_budget(Budget("team.audio", None, Period.MONTHLY), "alice")
    store.set_budget(Budget("team-a", None, Period.MONTHLY, parent="team.audio"), "alice")  # moved since
    assert focus(api, "from=2026-11-01&to=2026-12-01") == (november, "true")
    december = rows(focus(api, "from=2026-12-01&to=2026-12-02")[0])
    assert all('"gpusharing.io/team":"team.audio"' in r["Tags"] for r in december)  # December's open: as it stands
    assert [(r["ChargeClass"], r["ChargePeriodStart"], r["BillingPeriodStart"], r["x_ConsumedMicroGpuSeconds"])
            for r in december] == [
        ("Correction", "2026-11-30T22:00:00Z", "2026-12-01T00:00:00Z", "300000000"),
        ("Correction", "2026-11-30T23:00:00Z", "2026-12-01T00:00:00Z", "900000000"),
    ]
    # The accounts report of the window the late time came in says it is a correction.
    accounts = api.get("/api/v1/accounts?from=2026-12-01&to=2026-12-02").json["items"]
    assert [(a["name"], a["microGpuSeconds"], a["correctionMicroGpuSeconds"], a["ownCorrectionMicroGpuSeconds"])
            for a in accounts] == [("(cluster)", 1_200_000_000, 1_200_000_000, 0),
                                   ("team.audio", 1_200_000_000, 1_200_000_000, 0),
                                   ("team-a", 1_200_000_000, 1_200_000_000, 1_200_000_000)]


def test_the_accounts_tree_sums_the_export_up_the_hierarchy(app: Flask, clock: Clock, finance: str) -> None:
    store = services(app).budgets
    store.set_budget(Budget("team.vision", None, Period.MONTHLY), "alice")
    for namespace in ("team-a", "team-b"):
        store.set_budget(Budget(namespace, None, Period.MONTHLY, parent="team.vision"), "alice")
    clock.at = START + dt.timedelta(hours=1)
    observe(app, "team-a", "uid-a", 0.25, A100, clock.at)
    observe(app, "team-b", "uid-b", 0.5, A100, clock.at)
    observe(app, "team-c", "uid-c", 1.0, T4, clock.at)
    answer = SpecClient(app.test_client(), finance).get("/api/v1/accounts?from=2026-11-30&to=2026-12-01")
    assert answer.status_code == 200, answer.text
    tree = [(i["name"], i["depth"], i["gpuHours"], i["cost"]) for i in answer.json["items"]]
    assert tree == [
        ("(cluster)", 0, 1.75, "2.160000"),
        ("team-c", 1, 1.0, "0.360000"),
        ("team.vision", 1, 0.75, "1.800000"),
        ("team-a", 2, 0.25, "0.600000"),
        ("team-b", 2, 0.5, "1.200000"),
    ]
    assert answer.json["currency"] == "EUR"
    vision = SpecClient(app.test_client(), finance).get(
        "/api/v1/accounts?from=2026-11-30&to=2026-12-01&budget=team.vision")
    assert [i["name"] for i in vision.json["items"]] == ["team.vision", "team-a", "team-b"]


def test_a_tenant_reads_its_own_rows_only_and_never_anothers(app: Flask, clock: Clock, fake_kube: FakeKube) -> None:
    clock.at = START + dt.timedelta(minutes=30)
    observe(app, "team-a", "uid-a", 0.25, A100, clock.at)
    observe(app, "team-b", "uid-b", 0.5, A100, clock.at)
    fake_kube.viewers["tenant"] = {"team-a"}  # RBAC's view role in team-a: it may get team-a's GPUBudget
    tenant = SpecClient(app.test_client(), fake_kube.user_token("tenant"))
    own = rows(focus(tenant, "from=2026-11-30&to=2026-12-01&namespace=team-a")[0])
    assert {r["SubAccountName"] for r in own} == {"team-a"}
    for path in ("focus?from=2026-11-30&to=2026-12-01&namespace=team-b", "focus?from=2026-11-30&to=2026-12-01",
                 "utilization?from=2026-11-30&to=2026-12-01",
                 "accounts?from=2026-11-30&to=2026-12-01", "accounts?from=2026-11-30&to=2026-12-01&budget=team-b"):
        assert tenant.get(f"/api/v1/{path}").status_code == 403, path


def test_no_export_without_prices_and_bad_windows_are_refused(make_app: AppFactory) -> None:
    api = SpecClient(make_app().test_client(), ADMIN)  # static tokens
    answer = api.get("/api/v1/focus?from=2026-11-30&to=2026-12-01")
    assert answer.status_code == 409 and "no price sheet" in answer.json["error"]
    assert api.get("/api/v1/accounts?from=2026-11-30&to=2026-12-01").json["currency"] is None
    for query in ("from=2026-12-01&to=2026-11-30", "from=yesterday&to=2026-12-01", "to=2026-12-01"):
        assert api.get(f"/api/v1/focus?{query}").status_code == 400, query


def one_gpu_node(name: str, ready: bool = True) -> NodeGpus:
    """A Node of one A100, as the nodes cache reads it (Ready or not since long before the test)."""
    return node_gpus({
        "metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": "2026-11-01T00:00:00Z",
                     "labels": {"nvidia.com/gpu.product": A100.replace(" ", "-")}},
        "status": {"allocatable": {"nvidia.com/gpu": "1"}, "conditions": [
            {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": "2026-11-01T00:00:00Z"}]},
    }, CATALOGUE)


def test_four_quarter_pods_on_one_gpu_for_an_hour_are_one_allocated_gpu_hour_and_the_rest_is_accounted(
        app: Flask, clock: Clock, finance: str) -> None:
    capacity = CapacityLedger(services(app).database)
    clock.at = START
    capacity.observe({"gpu-1": one_gpu_node("gpu-1"), "gpu-2": one_gpu_node("gpu-2")}, START)
    clock.at = START + dt.timedelta(hours=1)
    for index in range(4):
        services(app).ledger.observe([PodObservation(
            f"uid-{index}", "team-a", f"pod-{index}", 0.25, Observation(0.25, START, clock.at, False),
            model=A100, node="gpu-1")])
    capacity.observe({"gpu-1": one_gpu_node("gpu-1"), "gpu-2": one_gpu_node("gpu-2", ready=False)}, clock.at)
    api = SpecClient(app.test_client(), finance)
    answer = api.get("/api/v1/utilization?from=2026-11-30&to=2026-12-01")
    assert answer.status_code == 200, answer.text
    cluster, model = answer.json["items"]
    assert cluster["model"] is None and model["model"] == A100
    assert (cluster["capacityMicroGpuSeconds"], cluster["allocatedMicroGpuSeconds"], cluster["downMicroGpuSeconds"],
            cluster["unallocatedMicroGpuSeconds"], cluster["overMicroGpuSeconds"]) == (
        2 * GPU_HOUR, GPU_HOUR, GPU_HOUR, 0, 0)  # gpu-1 held whole; gpu-2 NotReady the whole hour
    assert cluster["allocatedPercent"] == 50.0 and cluster["downPercent"] == 50.0
    exported = rows(focus(api, "from=2026-11-30&to=2026-12-01")[0])
    assert [(r["SubAccountName"], r["x_Category"], r["x_ConsumedMicroGpuSeconds"]) for r in exported] == [
        ("team-a", "allocated", str(GPU_HOUR))]
    lines = api.get("/api/v1/utilization?from=2026-11-30&to=2026-12-01&per=node-hour").json["items"]
    assert [(line["node"], line["hour"], line["allocatedMicroGpuSeconds"], line["downMicroGpuSeconds"])
            for line in lines] == [("gpu-1", "2026-11-30T22:00:00Z", GPU_HOUR, 0), ("gpu-2", "2026-11-30T22:00:00Z", 0,
                                                                                   GPU_HOUR)]
    for line in lines:  # the identity, every node-hour
        assert (line["allocatedMicroGpuSeconds"] - line["overMicroGpuSeconds"] + line["unallocatedMicroGpuSeconds"]
                + line["downMicroGpuSeconds"]) == line["capacityMicroGpuSeconds"] == GPU_HOUR
    assert api.get("/api/v1/utilization?from=2026-11-30&to=2026-12-01&per=pod").status_code == 400


def test_unallocated_capacity_is_the_clusters_line_or_shared_by_what_each_namespace_held(
        make_app: AppFactory, clock: Clock) -> None:
    clock.at = START - dt.timedelta(hours=2)
    shared = make_app(price_sheet=PRICES, chargeback=ChargebackSettings(share_unallocated=True))
    services(shared).ledger.terms.record_once(clock())
    capacity = CapacityLedger(services(shared).database)
    capacity.observe({"gpu-1": one_gpu_node("gpu-1")}, START)
    clock.at = START + dt.timedelta(hours=1)
    for namespace, share in (("team-a", 0.25), ("team-b", 0.5)):
        services(shared).ledger.observe([PodObservation(
            f"uid-{namespace}", namespace, "pod", share, Observation(share, START, clock.at, False), model=A100,
            node="gpu-1")])
    capacity.observe({"gpu-1": one_gpu_node("gpu-1")}, clock.at)
    exported = rows(focus(SpecClient(shared.test_client(), ADMIN), "from=2026-11-30&to=2026-12-01")[0])
    assert [(r["SubAccountName"], r["x_Category"], int(r["x_ConsumedMicroGpuSeconds"])) for r in exported] == [
        ("team-a", "allocated", GPU_HOUR // 4), ("team-a", "shared-unallocated", GPU_HOUR // 12),
        ("team-b", "allocated", GPU_HOUR // 2), ("team-b", "shared-unallocated", GPU_HOUR // 6)]
    assert sum(int(r["x_ConsumedMicroGpuSeconds"]) for r in exported) == GPU_HOUR  # the whole GPU, every second
    kept = make_app(price_sheet=PRICES)  # the same database, unallocated time kept as the cluster's line
    exported = rows(focus(SpecClient(kept.test_client(), ADMIN), "from=2026-11-30&to=2026-12-01")[0])
    assert [(r["SubAccountName"], r["x_Category"], int(r["x_ConsumedMicroGpuSeconds"])) for r in exported] == [
        ("", "unallocated", GPU_HOUR // 4), ("team-a", "allocated", GPU_HOUR // 4),
        ("team-b", "allocated", GPU_HOUR // 2)]
