"""`gpusharing report utilization|accounts|focus` (gpusharing/admin/reports.py) against a served timekeeper: the
capacity's use and the accounts tree as tables, CSV or JSON, the FOCUS export written as the API answers it, and
malformed windows refused before any request."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json

import pytest
from flask import Flask

from tests.timekeeper.chargeback.test_chargeback_api import (
    A100,
    GPU_HOUR,
    PRICES,
    START,
    one_gpu_node,
    services,
)
from tests.timekeeper.conftest import ADMIN, AppFactory, Clock, served
from tests.timekeeper.test_cli import run
from timekeeper.accounting.ledger import Observation
from timekeeper.config import ChargebackSettings
from timekeeper.database.accounting.charging import PodObservation
from timekeeper.database.chargeback.capacity import CapacityLedger


@pytest.fixture
def app(make_app: AppFactory, clock: Clock) -> Flask:
    """A timekeeper whose two one-GPU nodes ran an hour: team-a's pod held half of one, nobody the other."""
    clock.at = START - dt.timedelta(hours=2)
    made = make_app(price_sheet=PRICES, chargeback=ChargebackSettings(cluster="lab"))
    services(made).ledger.terms.record_once(clock())
    capacity = CapacityLedger(services(made).database)
    nodes = {name: one_gpu_node(name) for name in ("gpu-1", "gpu-2")}
    capacity.observe(nodes, START)
    clock.at = START + dt.timedelta(hours=1)
    services(made).ledger.observe([PodObservation("uid-a", "team-a", "trainer", 0.5,
                                                  Observation(0.5, START, clock.at, False), model=A100, node="gpu-1")])
    capacity.observe(nodes, clock.at)
    return made


def test_the_reports_print_tables_csv_and_json_and_the_focus_export_as_served(
        app: Flask, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSHARING_LOG_LEVEL", "warning")
    with served(app) as url:
        window = ("--from", "2026-11-30", "--to", "2026-12-01", "--timekeeper", url, "--token", ADMIN)
        code, out, err = run(capsys, "report", "utilization", *window)
        assert code == 0, err
        assert out.splitlines()[:2] == [
            "SCOPE                  CAPACITY GPU-H  ALLOCATED GPU-H  IDLE GPU-H  UNALLOCATED GPU-H  DOWN GPU-H  "
            "OVER GPU-H  ALLOCATED %  IDLE %  UNALLOCATED %  DOWN %",
            "cluster                2.000           0.500            0.000       1.500              0.000       "
            "0.000       25.00        0.00    75.00          0.00"]
        code, out, _ = run(capsys, "report", "utilization", *window, "-o", "csv")
        lines = list(csv.DictReader(io.StringIO(out)))
        assert code == 0 and [line["model"] for line in lines] == ["", A100]
        assert int(lines[0]["unallocatedMicroGpuSeconds"]) == 3 * GPU_HOUR // 2
        code, out, _ = run(capsys, "report", "accounts", *window)
        assert code == 0 and out.splitlines() == [
            "ACCOUNT          OWN GPU-H  GPU-H  CORRECTIONS GPU-H  OWN COST      COST",
            "(cluster)        0.000      2.000  0.000              0.000000 EUR  4.800000 EUR",
            "  (unallocated)  1.500      1.500  0.000              3.600000 EUR  3.600000 EUR",
            "  team-a         0.500      0.500  0.000              1.200000 EUR  1.200000 EUR"]
        code, out, _ = run(capsys, "report", "accounts", *window, "--budget", "team-a", "-o", "json")
        assert code == 0 and [item["name"] for item in json.loads(out)["items"]] == ["team-a"]
        code, out, _ = run(capsys, "report", "focus", *window)
        exported = list(csv.DictReader(io.StringIO(out)))
        assert code == 0 and [(row["x_Category"], row["SubAccountName"]) for row in exported] == [
            ("unallocated", ""), ("allocated", "team-a")]
        assert out == app.test_client().get("/api/v1/focus?from=2026-11-30&to=2026-12-01",
                                            headers={"Authorization": f"Bearer {ADMIN}"}).text
        code, out, err = run(capsys, "report", "focus", *window, "-o", "json")
        assert (code, out) == (2, "") and "-o csv or nothing" in err


def test_a_malformed_window_is_refused_before_any_request(capsys: pytest.CaptureFixture[str]) -> None:
    for kind in ("utilization", "accounts", "focus"):
        code, out, err = run(capsys, "report", kind, "--from", "2026-12-01", "--to", "2026-11-01",
                             "--timekeeper", "http://127.0.0.1:9")
        assert (code, out) == (2, "") and "to (2026-11-01) must be after from (2026-12-01)" in err, kind
