"""The price sheet (timekeeper/chargeback/prices.py): what a GPU-hour of each model costs, in one ISO 4217 currency,
from a day on; every mistake a sheet can hold refused naming where; each sheet recorded once, on SQLite and
PostgreSQL, and in force only from the first whole hour after it was recorded, so that no hour charged is priced
again."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusharing.gpu.catalogue import shipped_catalogue
from gpusharing.settings.env import ConfigError
from tests.timekeeper.conftest import ADMIN, METER, AppFactory, Clock, SpecClient
from timekeeper.chargeback.prices import NO_PRICES, PriceSheet, PriceSheetError, price_sheet_from
from timekeeper.config import TimekeeperConfig
from timekeeper.database.chargeback.prices import PriceLog, in_force
from timekeeper.database.connection import Database

CATALOGUE = shipped_catalogue()
H100, T4 = "NVIDIA H100 80GB HBM3", "Tesla T4"
UTC = dt.timezone.utc
SHEET = f"""
currency: EUR
prices:
- {{model: {H100}, from: 2026-01-01, listPerGpuHour: "4.50", contractedPerGpuHour: "3.10"}}
- {{model: {H100}, from: 2026-07-01, listPerGpuHour: 4, contractedPerGpuHour: "2.875"}}
- {{model: {T4}, from: "2026-01-01", listPerGpuHour: "0.35"}}
"""


def sheet(text: str = SHEET) -> PriceSheet:
    return price_sheet_from(yaml.safe_load(text), "gpu-prices.yaml", CATALOGUE)


def test_a_price_holds_from_its_day_until_the_next_and_the_list_price_is_the_contracted_one_by_default() -> None:
    prices = sheet()
    assert prices.currency == "EUR"
    at = {day: prices.price_at(H100, dt.datetime.fromisoformat(day).replace(tzinfo=UTC))
          for day in ("2025-12-31T23:59:59", "2026-01-01T00:00:00", "2026-06-30T23:59:59", "2026-07-01T00:00:00")}
    assert at["2025-12-31T23:59:59"] is None  # not priced before its first day
    first, later = at["2026-01-01T00:00:00"], at["2026-07-01T00:00:00"]
    assert first is not None and later is not None
    assert (first.list_per_gpu_hour, first.contracted_per_gpu_hour) == (Decimal("4.5"), Decimal("3.1"))
    assert at["2026-06-30T23:59:59"] == first
    assert (later.list_per_gpu_hour, later.contracted_per_gpu_hour) == (Decimal(4), Decimal("2.875"))
    t4 = prices.price_at(T4, dt.datetime(2027, 1, 1, tzinfo=UTC))
    assert t4 is not None and t4.contracted_per_gpu_hour == t4.list_per_gpu_hour == Decimal("0.35")
    assert prices.price_at("NVIDIA L4", dt.datetime(2027, 1, 1, tzinfo=UTC)) is None  # a model it does not price


def test_the_same_prices_written_otherwise_are_the_same_sheet_byte_for_byte() -> None:
    other = SHEET.replace('"4.50"', "4.5").replace('"0.35"', '"0.350000"')
    assert sheet(other).canonical() == sheet().canonical()
    assert '"listPerGpuHour":"4.5"' in sheet().canonical()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("currency: usd\nprices: []", "`currency` must be an ISO 4217 code in capitals (e.g. USD, EUR), got 'usd'"),
        ("currency: XAU\nprices: []", "got 'XAU'"),  # gold is no currency a GPU-hour is paid in
        ("currency: USD", "expected a mapping with `currency` and `prices`"),
        ("currency: USD\nprices:\n- {model: NVIDIA B999, from: 2026-01-01, listPerGpuHour: 1}",
         "prices[0]: `model` must name a model of the GPU model catalogue as it names it, got 'NVIDIA B999'"),
        (f"currency: USD\nprices:\n- {{model: {H100}, from: 2026-01-01, listPerGpuHour: -1}}",
         f"prices[0]: `listPerGpuHour` of '{H100}' must be an amount from 0 to 1,000,000,000, got '-1'"),
        (f"currency: USD\nprices:\n- {{model: {H100}, from: 2026-01-01, listPerGpuHour: 0.1234567}}",
         "has more than 6 decimal places: '0.1234567'"),
        (f"currency: USD\nprices:\n- {{model: {H100}, from: 2026-01-01, listPerGpuHour: .nan}}", "got 'nan'"),
        (f"currency: USD\nprices:\n- {{model: {H100}, from: 2026-01-01, listPerGpuHour: true}}", "got 'True'"),
        (f"currency: USD\nprices:\n- {{model: {H100}, from: 2026-01-01, listPerGpuHour: '1e99999999'}}", "got '1e99"),
        (f"currency: USD\nprices:\n- {{model: {H100}, from: '2026-13-01', listPerGpuHour: 1}}",
         "`from` of 'NVIDIA H100 80GB HBM3' must be a day, YYYY-MM-DD (UTC), got '2026-13-01'"),
        (f"currency: USD\nprices:\n- {{model: {H100}, from: 2026-01-01 10:00:00, listPerGpuHour: 1}}", "must be a day"),
        (f"currency: USD\nprices:\n- {{model: {H100}, from: 2026-01-01, listPerGpuHour: 1, discount: 5}}",
         "expected `model`, `from`, `listPerGpuHour` and optionally `contractedPerGpuHour`"),
        (f"currency: USD\nprices:\n- {{model: {H100}, from: 2026-01-01, listPerGpuHour: 1}}\n"
         f"- {{model: {H100}, from: 2026-01-01, listPerGpuHour: 2}}",
         f"prices[1] prices '{H100}' from 2026-01-01 a second time"),
    ],
)
def test_every_mistake_is_refused_naming_where(text: str, message: str) -> None:
    with pytest.raises(PriceSheetError) as refused:
        sheet(text)
    assert str(refused.value).startswith("gpu-prices.yaml") and message in str(refused.value)


def test_a_sheet_of_too_many_prices_is_refused_before_any_is_read() -> None:
    document: dict[str, Any] = {"currency": "USD", "prices": [{}] * 10_001}
    with pytest.raises(PriceSheetError, match="at most 10000 prices"):
        price_sheet_from(document, "gpu-prices.yaml", CATALOGUE)


def test_the_setting_names_the_file_and_what_is_wrong_with_it(tmp_path: Path) -> None:
    path = tmp_path / "gpu-prices.yaml"
    path.write_text(SHEET)
    config = TimekeeperConfig.from_env({"TIMEKEEPER_GPU_PRICES_FILE": str(path)})
    assert config.price_sheet == sheet() and config.price_sheet_source == str(path)
    assert TimekeeperConfig.from_env({}).price_sheet == NO_PRICES
    path.write_text("currency: USD\nprices: 5\n")
    with pytest.raises(ConfigError, match=f"TIMEKEEPER_GPU_PRICES_FILE: {path}: `prices` must be a list"):
        TimekeeperConfig.from_env({"TIMEKEEPER_GPU_PRICES_FILE": str(path)})
    path.write_text(f"currency: USD\nprices:\n- {{model: {H100}, from: 2026-13-01, listPerGpuHour: 1}}\n")
    with pytest.raises(ConfigError, match="cannot read .*: month must be in 1..12"):  # YAML's own reading of a day
        TimekeeperConfig.from_env({"TIMEKEEPER_GPU_PRICES_FILE": str(path)})


@pytest.fixture
def log(database_url: str) -> Any:
    db = Database(database_url)
    yield PriceLog(db)
    db.dispose()


def test_a_sheet_is_recorded_once_and_in_force_from_the_next_whole_hour(log: PriceLog) -> None:
    at = dt.datetime(2026, 11, 29, 10, 30, tzinfo=UTC)
    assert log.record(NO_PRICES, at, "none") is None  # nothing priced, nothing to record
    first = log.record(sheet(), at, "/etc/gpusharing/gpu-prices.yaml")
    assert first is not None and first.effective_at == dt.datetime(2026, 11, 29, 11, tzinfo=UTC)
    assert log.record(sheet(SHEET.replace('"4.50"', "4.5")), at + dt.timedelta(hours=1), "again") is None
    changed = log.record(sheet(SHEET.replace('"0.35"', '"0.40"')), at + dt.timedelta(hours=2), "changed")
    assert changed is not None and changed.effective_at == dt.datetime(2026, 11, 29, 13, tzinfo=UTC)
    removed = log.record(NO_PRICES, at + dt.timedelta(hours=3), "no file")  # prices taken away: recorded too
    assert removed is not None and removed.sheet.currency is None
    history = log.history()
    assert [recorded.source for recorded in history] == ["no file", "changed", "/etc/gpusharing/gpu-prices.yaml"]
    in_hours = [in_force(history, dt.datetime(2026, 11, 29, hour, 59, tzinfo=UTC)) for hour in (10, 11, 12, 13, 14)]
    assert in_hours[0] is None  # the hour it was recorded in may be charged already: not priced again
    assert [r.source for r in in_hours[1:] if r is not None] == [
        "/etc/gpusharing/gpu-prices.yaml", "/etc/gpusharing/gpu-prices.yaml", "changed", "no file"]
    assert history[1].sheet == sheet(SHEET.replace('"0.35"', '"0.40"'))  # read back as recorded


def test_the_api_shows_the_sheet_in_force_and_every_one_recorded(make_app: AppFactory, clock: Clock) -> None:
    api = SpecClient(make_app(price_sheet=sheet(), price_sheet_source="gpu-prices.yaml").test_client(), ADMIN)
    body = api.get("/api/v1/prices").json
    assert body["inForce"] is None  # recorded now, at 23:00: in force from midnight
    assert [v["effectiveAt"] for v in body["versions"]] == ["2028-02-29T00:00:00Z"]
    clock.advance(hours=1)
    shown = api.get("/api/v1/prices").json["inForce"]
    assert (shown["currency"], shown["prices"][0]) == ("EUR", {
        "model": H100, "from": "2026-01-01", "listPerGpuHour": "4.5", "contractedPerGpuHour": "3.1"})
    assert api.as_(METER).get("/api/v1/prices").status_code == 403
