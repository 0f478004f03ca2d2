"""The FOCUS 1.2 export (timekeeper/chargeback/focus.py): what it writes passes focus-validator, FOCUS's official
validator, with no failure of the dataset's own; every quantity and cost is exact to the stated places, rounded half
to even from the integer micro-GPU-seconds and the price sheet's decimals; the same charges give the same bytes; rows
are written as they come; and what it cannot write truthfully is refused, naming the row and the rule."""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import random
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from tests.timekeeper.chargeback.focusvalidator import ValidatorError, validate
from timekeeper.chargeback.focus import (
    COLUMNS,
    FocusCharge,
    FocusDataset,
    FocusError,
    focus_chunks,
    write_focus,
)

UTC = dt.timezone.utc
A100, T4, L4 = "NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA L4"
OCTOBER, NOVEMBER, DECEMBER = (dt.datetime(2026, month, 1, tzinfo=UTC) for month in (10, 11, 12))
PRICES = {A100: (Decimal("4.50"), Decimal("3.1")), T4: (Decimal("0.35"), Decimal("0.35")), L4: (None, None)}
DATASET = FocusDataset(currency="EUR", billing_account_id="prod-eu-1", billing_account_name="Production EU 1")
HOUR = 3_600_000_000  # micro-GPU-seconds in a GPU-hour


def charge(hour: int, namespace: str | None, model: str, micro: int, category: str = "allocated",
           **changes: Any) -> FocusCharge:
    """A row of November 2026's billing period, for its `hour`-th hour, at the model's price."""
    tags = {"gpusharing.io/cluster": "prod-eu-1"} | ({"gpusharing.io/namespace": namespace} if namespace else {})
    listed, contracted = PRICES[model]
    row = FocusCharge(NOVEMBER + dt.timedelta(hours=hour), NOVEMBER, DECEMBER, namespace, model, micro, category,
                      False, None, tags, listed, contracted)
    return dataclasses.replace(row, **changes)


def correction(namespace: str, model: str, micro: int) -> FocusCharge:
    """Late data for October's last hour, booked in November: October was invoiced already."""
    return charge(0, namespace, model, micro, correction=True, corrected_period_start=OCTOBER,
                  charge_period_start=NOVEMBER - dt.timedelta(hours=1))


def day() -> Iterator[FocusCharge]:
    """A day of a cluster: three namespaces on two priced models and one the sheet does not price, the capacity
    nobody held and each namespace's share of it, and two corrections of October, one taking time back."""
    for hour in range(24):
        yield charge(hour, "vision", A100, 3 * HOUR // 4 + hour * 1_234_567, tags={
            "gpusharing.io/cluster": "prod-eu-1", "gpusharing.io/team": "vision", "cost-centre": "Zürich 7"})
        yield charge(hour, "speech", T4, 2 * HOUR + 987_654_321 * (hour % 3))
        yield charge(hour, "nlp", L4, HOUR // 3 + hour)
        yield charge(hour, None, A100, HOUR // 4 - hour * 1_234_567, "unallocated")
        for namespace in ("vision", "speech"):
            yield charge(hour, namespace, A100, HOUR // 8 - hour * 617_283, "shared-unallocated")
    yield correction("vision", A100, -500_000_000)
    yield correction("speech", T4, 1_800_000_000)


def written(rows: Any, dataset: FocusDataset = DATASET) -> str:
    out = io.StringIO()
    write_focus(dataset, rows, out)
    return out.getvalue()


def read(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_the_export_passes_focus_validator_with_no_failure_of_its_own(tmp_path: Path) -> None:
    data = tmp_path / "focus.csv"
    with data.open("w", encoding="ascii", newline="") as out:
        assert write_focus(DATASET, day(), out) == 24 * 6 + 2
    verdict = validate(data)
    print(f"focus-validator 2.2.1: {verdict.summary}")
    assert verdict.failures == {}, "\n".join([verdict.summary, *(f"{r}: {m}" for r, m in verdict.failures.items())])
    # Its one failure: InvoiceId (null: no invoice is issued) meets "null without an invoice", which the validator
    # runs again on its own, beside "not null with one", which it counts as failed.
    assert verdict.alternatives == {"InvoiceId-C-005-C": "InvoiceId MUST NOT be NULL."}
    assert (verdict.failed, verdict.total) == (1, verdict.passed + verdict.failed + verdict.skipped)
    assert sum(status == "PASS" for status in verdict.statuses.values()) == verdict.passed
    # Every column whose rules it runs as a whole passes them; it runs only some of the others' (ListCost's product
    # of price and quantity never, the claims it is not told of not at all), which the tests below check instead.
    whole = {rule.split("-")[0] for rule, status in verdict.statuses.items() if "-C-000-" in rule and status == "PASS"}
    assert whole == {column for column in COLUMNS if not column.startswith("x_")} - {
        "ConsumedQuantity", "ConsumedUnit", "EffectiveCost", "ListCost", "ListUnitPrice", "PricingCategory",
        "SkuPriceId"}


def test_the_validator_finds_what_is_wrong_in_a_file_changed_by_hand(tmp_path: Path) -> None:
    """Its verdict is read, not assumed: a currency FOCUS does not know and tags that are no JSON are its failures."""
    text = written(day()).replace(",EUR,", ",Euro,", 1).replace('}",', '",', 1)
    data = tmp_path / "changed.csv"
    data.write_text(text, encoding="ascii")
    verdict = validate(data)
    assert {"BillingCurrency-C-006-M", "Tags-C-001-M"} <= set(verdict.failures), verdict.summary


def test_a_validator_that_prints_no_verdict_is_an_error_showing_what_it_printed(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "bin" / "focus-validator").write_text("#!/bin/sh\necho 'Traceback: polars.exceptions.ComputeError' >&2\n"
                                                  "exit 1\n")
    (venv / "bin" / "focus-validator").chmod(0o755)
    with pytest.raises(ValidatorError, match=r"(?s)printed no `Total: .* line \(exit 1\).*ComputeError"):
        validate(tmp_path / "focus.csv", venv)


def test_a_row_is_written_exactly_to_the_stated_places_rounded_half_to_even() -> None:
    micro = 1_234_567_891
    (row,) = read(written([charge(5, "vision", A100, micro, tags={"b": "2", "a": "1"})]))
    # 1,234,567,891 / 3.6e9 = 0.34293552527(7...) GPU-hours; x 4.50 = 1.54320986375 exactly; x 3.1 = 1.0631001283(6...)
    assert row == {
        "BillingAccountId": "prod-eu-1", "BillingAccountName": "Production EU 1", "BillingCurrency": "EUR",
        "BillingPeriodStart": "2026-11-01T00:00:00Z", "BillingPeriodEnd": "2026-12-01T00:00:00Z",
        "ChargePeriodStart": "2026-11-01T05:00:00Z", "ChargePeriodEnd": "2026-11-01T06:00:00Z",
        "ChargeCategory": "Usage", "ChargeClass": "", "ChargeFrequency": "Usage-Based",
        "ChargeDescription": f"GPU time held by the namespace's pods, {A100}",
        "ProviderName": "kube-gpusharing", "PublisherName": "kube-gpusharing", "InvoiceIssuerName": "kube-gpusharing",
        "InvoiceId": "", "ServiceCategory": "Compute", "ServiceSubcategory": "Containers", "ServiceName": "Shared GPUs",
        "SubAccountId": "prod-eu-1/vision", "SubAccountName": "vision",
        "SkuId": A100, "SkuPriceId": A100, "SkuMeter": "GPU Time", "SkuPriceDetails": "", "PricingCategory": "Standard",
        "PricingQuantity": "0.3429355252777778", "PricingUnit": "GPU-Hours",
        "ConsumedQuantity": "0.3429355252777778", "ConsumedUnit": "GPU-Hours",
        "ListUnitPrice": "4.500000", "ContractedUnitPrice": "3.100000",
        "ListCost": "1.543209863750", "ContractedCost": "1.063100128361", "EffectiveCost": "1.063100128361",
        "BilledCost": "1.063100128361", "Tags": '{"a":"1","b":"2"}',
        "x_ConsumedMicroGpuSeconds": "1234567891", "x_GpuModel": A100, "x_Category": "allocated", "x_Priced": "true",
        "x_CorrectedBillingPeriodStart": "",
    }
    assert list(row) == list(COLUMNS)
    ties = [charge(0, "vision", T4, micro, list_per_gpu_hour=Decimal("0.000001"),
                   contracted_per_gpu_hour=Decimal("0.000001")) for micro in (1_800, 5_400, -1_800, -5_400)]
    # 1,800 micro-GPU-seconds at a millionth per GPU-hour cost 0.5e-12: to the even 0; 5,400 cost 1.5e-12: to 2e-12.
    assert [r["ListCost"] for r in read(written(ties))] == [
        "0.000000000000", "0.000000000002", "0.000000000000", "-0.000000000002"]


def test_a_model_without_a_price_costs_nothing_at_unit_prices_of_zero_and_says_so() -> None:
    (row,) = read(written([charge(0, "nlp", L4, HOUR // 3)]))
    assert {name: row[name] for name in ("ListUnitPrice", "ContractedUnitPrice", "ListCost", "ContractedCost",
                                         "EffectiveCost", "BilledCost", "PricingQuantity", "x_Priced")} == {
        "ListUnitPrice": "0.000000", "ContractedUnitPrice": "0.000000", "ListCost": "0.000000000000",
        "ContractedCost": "0.000000000000", "EffectiveCost": "0.000000000000", "BilledCost": "0.000000000000",
        "PricingQuantity": "0.3333333333333333", "x_Priced": "false"}


def test_a_correction_is_booked_in_the_open_billing_period_and_charged_to_the_hour_it_corrects() -> None:
    rows = read(written([correction("vision", A100, -500_000_000), charge(0, None, A100, 7, "unallocated")]))
    assert {name: rows[0][name] for name in (
        "ChargeClass", "BillingPeriodStart", "ChargePeriodStart", "ChargePeriodEnd", "x_CorrectedBillingPeriodStart",
        "ConsumedQuantity", "ListCost", "BilledCost", "x_ConsumedMicroGpuSeconds")} == {
        "ChargeClass": "Correction", "BillingPeriodStart": "2026-11-01T00:00:00Z",
        "ChargePeriodStart": "2026-10-31T23:00:00Z", "ChargePeriodEnd": "2026-11-01T00:00:00Z",
        "x_CorrectedBillingPeriodStart": "2026-10-01T00:00:00Z", "ConsumedQuantity": "-0.1388888888888889",
        "ListCost": "-0.625000000000", "BilledCost": "-0.430555555556", "x_ConsumedMicroGpuSeconds": "-500000000"}
    # The cluster's own line: no sub account, only the provider's tags.
    assert {name: rows[1][name] for name in ("SubAccountId", "SubAccountName", "x_Category", "ChargeDescription")} == {
        "SubAccountId": "", "SubAccountName": "", "x_Category": "unallocated",
        "ChargeDescription": f"GPU capacity nobody held, {A100}"}


def test_the_same_charges_give_the_same_bytes_in_ascii_with_newline_ends() -> None:
    text = written(day())
    assert text == written(list(day()))
    assert text.isascii() and "\r" not in text and text.endswith("\n") and text.count("\n") == 24 * 6 + 3
    assert '"{""cost-centre"":""Z\\u00fcrich 7"",""gpusharing.io/cluster"":""prod-eu-1""' in text  # sorted, escaped


def test_sums_agree_with_the_micro_gpu_seconds_and_every_cost_with_its_unit_price_times_its_quantity() -> None:
    generator = random.Random(7)
    models = [A100, T4]
    charges = [charge(generator.randrange(720), f"team-{generator.randrange(50)}", generator.choice(models),
                      generator.randrange(-HOUR, 64 * HOUR)) for _ in range(5_000)]
    rows = read(written(charges))
    quantities = [Fraction(Decimal(row["ConsumedQuantity"])) for row in rows]
    micros = [int(row["x_ConsumedMicroGpuSeconds"]) for row in rows]
    assert micros == [c.micro_gpu_seconds for c in charges]
    # Each row within 0.5e-16 GPU-hour: a million rows add up within 0.18 micro-GPU-seconds of their integers.
    assert all(abs(q - Fraction(m, HOUR)) <= Fraction(1, 2 * 10**16) for q, m in zip(quantities, micros))
    assert abs(sum(quantities) - Fraction(sum(micros), HOUR)) * HOUR * 1_000_000 / len(rows) < 1
    for row, micro in zip(rows, micros):
        quantity = Fraction(Decimal(row["PricingQuantity"]))
        for price, cost in (("ListUnitPrice", "ListCost"), ("ContractedUnitPrice", "ContractedCost")):
            unit, amount = Fraction(Decimal(row[price])), Fraction(Decimal(row[cost]))
            assert abs(amount - micro * unit / HOUR) <= Fraction(1, 2 * 10**12)  # the exact cost, rounded once
            assert abs(amount - quantity * unit) <= Fraction(1, 2 * 10**12) + unit / (2 * 10**16)


def test_the_text_comes_in_chunks_as_the_rows_are_read_never_held_whole() -> None:
    sent: list[str] = []

    def rows() -> Iterator[FocusCharge]:
        for hour in range(3):
            assert "".join(sent).count("\n") == hour + 1  # the header, and every row given before this one
            yield charge(hour, "vision", A100, HOUR)

    sent.extend(focus_chunks(DATASET, rows(), size=1))  # a chunk a line at this size
    out = io.StringIO()
    assert write_focus(DATASET, (charge(hour, "vision", A100, HOUR) for hour in range(3)), out) == 3
    assert "".join(sent) == out.getvalue()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"charge_period_start": NOVEMBER + dt.timedelta(minutes=30)},
         "charge_period_start must be on the hour, got 2026-11-01T00:30:00+00:00"),
        ({"charge_period_start": NOVEMBER.replace(tzinfo=None)}, "charge_period_start must be a datetime in UTC"),
        ({"charge_period_start": NOVEMBER.astimezone(dt.timezone(dt.timedelta(hours=1)))},
         "charge_period_start must be a datetime in UTC"),
        ({"billing_period_start": NOVEMBER.replace(microsecond=1)}, "billing_period_start must be a whole second"),
        ({"billing_period_end": NOVEMBER}, "billing_period_end 2026-11-01T00:00:00+00:00 must be after"),
        ({"charge_period_start": DECEMBER}, "the hour from 2026-12-01T00:00:00+00:00 is not within its billing period"),
        ({"correction": True}, "corrected_period_start must be given for a correction, and only for one"),
        ({"corrected_period_start": OCTOBER}, "corrected_period_start must be given for a correction, and only"),
        ({"correction": True, "corrected_period_start": OCTOBER},
         "a correction's hour (from 2026-11-01T00:00:00+00:00) must lie in the billing period it corrects"),
        ({"category": "idle"}, "category must be one of allocated, unallocated, shared-unallocated, got 'idle'"),
        ({"category": "unallocated"}, "a row of category 'unallocated' must name a namespace, and only such a row"),
        ({"namespace": None}, "a row of category 'allocated' must name a namespace, and only such a row"),
        ({"namespace": "Vision"}, "namespace 'Vision' is not a namespace name"),
        ({"model": "=HYPERLINK(1)"}, "model must be printable ASCII of at most 253 characters beginning with a letter"),
        ({"model": "NVIDIA H100\n"}, "model must be printable ASCII"),
        ({"micro_gpu_seconds": True}, "micro_gpu_seconds must be an integer of at most 2^63-1 either side of 0"),
        ({"micro_gpu_seconds": 2**63}, "micro_gpu_seconds must be an integer"),
        ({"micro_gpu_seconds": 1.5}, "micro_gpu_seconds must be an integer"),
        ({"list_per_gpu_hour": Decimal("-1")}, "list_per_gpu_hour must be a Decimal from 0 to 1,000,000,000"),
        ({"list_per_gpu_hour": Decimal("0.1234567")}, "of at most 6 decimal places, got '0.1234567'"),
        ({"contracted_per_gpu_hour": Decimal("NaN")}, "contracted_per_gpu_hour must be a Decimal"),
        ({"list_per_gpu_hour": 4.5}, "list_per_gpu_hour must be a Decimal"),
        ({"contracted_per_gpu_hour": None}, "list_per_gpu_hour and contracted_per_gpu_hour must both be given"),
        ({"tags": {"team": 7}}, "tags must map non-empty strings to strings"),
        ({"tags": {"": "x"}}, "tags must map non-empty strings to strings"),
    ],
)
def test_a_row_it_cannot_write_truthfully_is_refused_naming_the_row_and_the_rule(
    changes: dict[str, Any], message: str
) -> None:
    out = io.StringIO()
    rows = [charge(0, "vision", A100, HOUR), dataclasses.replace(charge(0, "speech", A100, HOUR), **changes)]
    with pytest.raises(FocusError) as refused:
        write_focus(DATASET, rows, out)
    assert str(refused.value).startswith("row 2: ") and message in str(refused.value)
    assert out.getvalue().count("\n") == 2  # the header and the first row: what came before is written


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"currency": "usd"}, "currency must be an ISO 4217 code in capitals (e.g. USD), got 'usd'"),
        ({"billing_account_name": "@SUM(A1)"}, "billing_account_name must be printable ASCII"),
        ({"provider_name": ""}, "provider_name must be printable ASCII"),
    ],
)
def test_a_dataset_it_cannot_write_is_refused_before_anything_is_written(changes: dict[str, Any], message: str) -> None:
    out = io.StringIO()
    with pytest.raises(FocusError, match=message.replace("(", r"\(").replace(")", r"\)")):
        write_focus(dataclasses.replace(DATASET, **changes), [charge(0, "vision", A100, HOUR)], out)
    assert out.getvalue() == ""
