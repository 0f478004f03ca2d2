"""The FOCUS 1.2 export of GPU chargeback (docs/chargeback.md, "The FOCUS export"): a CSV cost-and-usage dataset of
one row per namespace, GPU model and hour, which FinOps tools read as they read a cloud's bill.

FOCUS is the FinOps Open Cost and Usage Specification. Every column FOCUS 1.2 makes mandatory is written, with the
conditional ones that apply to a cluster's GPUs (the decisions, column by column, are in the docs); FOCUS's official
validator (`make focus-validator`) finds no failure of the dataset's own in it (the docs say which claims it is
told, and which of its failures is none). Plain data in, text out, one row at a time: the hours, prices and ledgers
the rows come from are the caller's, and so is their order.

Byte for byte the same for the same input: a fixed column order, `\\n` line ends, only ASCII (tags are JSON with
escapes), and numbers from integers alone, rounded half to even:

- quantities in GPU-hours to QUANTITY_PLACES (16): each row within 0.5e-16 GPU-hour of the exact micro-GPU-seconds,
  so that the sum of a million rows stays within 0.2 micro-GPU-seconds of theirs;
- unit prices to PRICE_PLACES (6), the price sheet's own, so exact;
- costs to COST_PLACES (12), each rounded once from the exact micro-GPU-seconds times the price: within 0.5e-12 of
  the exact cost and (at a price under 10,000 a GPU-hour) within 1e-12 of its unit price times its PricingQuantity,
  which FOCUS wants equal; a million rows add up within a millionth of their exact total, where the price sheet's 6
  places would allow half a unit of currency.
"""

from __future__ import annotations

import csv
import datetime as dt
import functools
import io
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import TextIO

from gpusharing.messages import shortened
from gpusharing.names import NAMESPACE, InvalidName
from timekeeper.chargeback.currencies import ISO_4217
from timekeeper.chargeback.prices import AMOUNT_PLACES, MAX_AMOUNT

HOUR = dt.timedelta(hours=1)
MICRO_GPU_SECONDS_PER_GPU_HOUR = 3_600_000_000
QUANTITY_PLACES = 16
PRICE_PLACES = AMOUNT_PLACES
COST_PLACES = 12
MAX_MICRO_GPU_SECONDS = 2**63 - 1  # FOCUS's Extended integer: x_ConsumedMicroGpuSeconds fits a 64-bit column
MAX_TEXT = 253  # a DNS name's length: a cluster's, a provider's name fits
UNIT = "GPU-Hours"  # FOCUS's Unit Format "<singular-unit>-<plural-time-units>", GPU a count-based unit in capitals
CATEGORIES = ("allocated", "unallocated", "shared-unallocated")
_DESCRIPTIONS = {
    "allocated": "GPU time held by the namespace's pods",
    "unallocated": "GPU capacity nobody held",
    "shared-unallocated": "The namespace's share of the GPU capacity nobody held",
}

# What the dataset claims of its provider, FOCUS 1.2's applicability criteria (the validator's
# --applicability-criteria): the conditional columns they call for are written, and checked.
APPLICABILITY = (
    "ACCOUNT_NAMING_SUPPORTED",  # BillingAccountName: the cluster's name
    "NEGOTIATED_PRICING_SUPPORTED",  # ContractedUnitPrice: the price sheet's contracted price
    "PUBLIC_PRICE_LIST_SUPPORTED",  # ListUnitPrice: the price sheet, published by GET /api/v1/prices
    "SUB_ACCOUNT_SUPPORTED",  # SubAccountId and SubAccountName: the namespace
    "TAGGING_SUPPORTED",  # Tags
    "UNIT_PRICING_SUPPORTED",  # SkuId, SkuPriceId, SkuMeter, SkuPriceDetails: a GPU-hour of each model
    "USAGE_MEASUREMENT_SUPPORTED",  # ConsumedQuantity and ConsumedUnit
)

COLUMNS = (
    "BillingAccountId", "BillingAccountName", "BillingCurrency", "BillingPeriodStart", "BillingPeriodEnd",
    "ChargePeriodStart", "ChargePeriodEnd", "ChargeCategory", "ChargeClass", "ChargeFrequency", "ChargeDescription",
    "ProviderName", "PublisherName", "InvoiceIssuerName", "InvoiceId",
    "ServiceCategory", "ServiceSubcategory", "ServiceName", "SubAccountId", "SubAccountName",
    "SkuId", "SkuPriceId", "SkuMeter", "SkuPriceDetails", "PricingCategory",
    "PricingQuantity", "PricingUnit", "ConsumedQuantity", "ConsumedUnit", "ListUnitPrice", "ContractedUnitPrice",
    "ListCost", "ContractedCost", "EffectiveCost", "BilledCost", "Tags",
    "x_ConsumedMicroGpuSeconds", "x_GpuModel", "x_Category", "x_Priced", "x_CorrectedBillingPeriodStart",
)


class FocusError(ValueError):
    """Input the export cannot write; the message names the row (counted from 1), the field and the rule."""


@dataclass(frozen=True)
class FocusDataset:
    """What every row of one export shares: who provides the GPUs, to which billing account, in which currency."""

    currency: str  # BillingCurrency: ISO 4217, the price sheet's
    billing_account_id: str  # BillingAccountId: the cluster, unique among the provider's clusters
    billing_account_name: str  # BillingAccountName: the cluster's name
    provider_name: str = "kube-gpusharing"  # ProviderName and InvoiceIssuerName: who charges for the GPUs
    publisher_name: str = "kube-gpusharing"  # PublisherName: who produces the offering


@dataclass(frozen=True)
class FocusCharge:
    """One row of the export: one namespace's GPU time on one GPU model in one hour (or the cluster's unallocated)."""

    charge_period_start: dt.datetime  # UTC, on the hour; ChargePeriodEnd is one hour later
    billing_period_start: dt.datetime  # UTC; the billing period the row is booked in (a calendar month, say)
    billing_period_end: dt.datetime
    namespace: str | None  # SubAccountName; None: the cluster's own (unallocated) line
    model: str  # the GPU model, as the catalogue names it (e.g. "NVIDIA A100-SXM4-80GB"): SkuId
    micro_gpu_seconds: int  # exact; negative for a correction that takes time back
    category: str  # "allocated", "unallocated" (the cluster's line), "shared-unallocated" (a namespace's part of it)
    correction: bool  # this row corrects a billing period already closed (late data)
    corrected_period_start: dt.datetime | None  # the billing period it corrects, when correction
    tags: Mapping[str, str]  # e.g. {"gpusharing.io/cluster": "prod", "gpusharing.io/team": "vision"}
    list_per_gpu_hour: Decimal | None  # the price in force for that hour (None: the model has no price then)
    contracted_per_gpu_hour: Decimal | None


def write_focus(dataset: FocusDataset, rows: Iterable[FocusCharge], out: TextIO) -> int:
    """Writes the header line and one line per row to `out`, in the order given, and returns the rows written.
    FocusError for a dataset or row it cannot write: the lines before a bad row are written already."""
    written = 0

    def counted() -> Iterator[FocusCharge]:
        nonlocal written
        for row in rows:
            yield row
            written += 1

    for chunk in focus_chunks(dataset, counted()):
        out.write(chunk)
    return written


def focus_chunks(dataset: FocusDataset, rows: Iterable[FocusCharge], size: int = 64 * 1024) -> Iterator[str]:
    """The CSV text of `write_focus`, in chunks of about `size` characters as the rows come: an export of millions
    of rows is sent as it is made, never held whole. FocusError as write_focus raises it, once the chunks before are
    yielded."""
    _check_dataset(dataset)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)

    def sent() -> Iterator[str]:
        if buffer.tell() >= size:  # sent before the next row is read
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()

    yield from sent()
    for number, row in enumerate(rows, 1):
        try:
            cells = _cells(dataset, row)
        except FocusError as exc:
            yield buffer.getvalue()
            raise FocusError(f"row {number}: {exc}") from None
        writer.writerow([cells[column] for column in COLUMNS])
        yield from sent()
    yield buffer.getvalue()


def _cells(dataset: FocusDataset, row: FocusCharge) -> dict[str, str]:
    _check_periods(row)
    _check_who(row)
    micro = row.micro_gpu_seconds
    if type(micro) is not int or abs(micro) > MAX_MICRO_GPU_SECONDS:
        raise FocusError(f"micro_gpu_seconds must be an integer of at most 2^63-1 either side of 0, got {micro!r}")
    list_units, contracted_units = _prices(row)
    quantity = _fixed(_divided(micro * 10**QUANTITY_PLACES, MICRO_GPU_SECONDS_PER_GPU_HOUR), QUANTITY_PLACES)
    contracted_cost = _cost(micro, contracted_units)
    return {
        "BillingAccountId": dataset.billing_account_id,
        "BillingAccountName": dataset.billing_account_name,
        "BillingCurrency": dataset.currency,
        "BillingPeriodStart": _instant(row.billing_period_start),
        "BillingPeriodEnd": _instant(row.billing_period_end),
        "ChargePeriodStart": _instant(row.charge_period_start),
        "ChargePeriodEnd": _instant(row.charge_period_start + HOUR),
        "ChargeCategory": "Usage",
        "ChargeClass": "Correction" if row.correction else "",
        "ChargeFrequency": "Usage-Based",
        "ChargeDescription": f"{_DESCRIPTIONS[row.category]}, {row.model}",
        "ProviderName": dataset.provider_name,
        "PublisherName": dataset.publisher_name,
        # The provider charges for its own GPUs (FOCUS's internal offering); BilledCost must be 0 where they differ.
        "InvoiceIssuerName": dataset.provider_name,
        "InvoiceId": "",  # no invoice is issued: FOCUS recommends the column, null where there is none
        "ServiceCategory": "Compute",
        "ServiceSubcategory": "Containers",
        "ServiceName": "Shared GPUs",
        # Qualified by the cluster, so that one namespace name in two clusters' exports is two sub accounts.
        "SubAccountId": f"{dataset.billing_account_id}/{row.namespace}" if row.namespace is not None else "",
        "SubAccountName": row.namespace or "",
        "SkuId": row.model,
        "SkuPriceId": row.model,  # one price point per model: the amount and its dates are no part of the id
        "SkuMeter": "GPU Time",
        "SkuPriceDetails": "",
        "PricingCategory": "Standard",
        "PricingQuantity": quantity,
        "PricingUnit": UNIT,
        "ConsumedQuantity": quantity,
        "ConsumedUnit": UNIT,
        "ListUnitPrice": _fixed(list_units, PRICE_PLACES),
        "ContractedUnitPrice": _fixed(contracted_units, PRICE_PLACES),
        "ListCost": _cost(micro, list_units),
        "ContractedCost": contracted_cost,
        "EffectiveCost": contracted_cost,
        "BilledCost": contracted_cost,
        "Tags": _tags(row.tags),
        "x_ConsumedMicroGpuSeconds": str(micro),
        "x_GpuModel": row.model,
        "x_Category": row.category,
        "x_Priced": "false" if row.list_per_gpu_hour is None else "true",
        "x_CorrectedBillingPeriodStart": "" if row.corrected_period_start is None else _instant(
            row.corrected_period_start),
    }


def _check_dataset(dataset: FocusDataset) -> None:
    if dataset.currency not in ISO_4217:
        raise FocusError(f"currency must be an ISO 4217 code in capitals (e.g. USD), got {dataset.currency!r}")
    for name in ("billing_account_id", "billing_account_name", "provider_name", "publisher_name"):
        _text(getattr(dataset, name), name)


def _check_periods(row: FocusCharge) -> None:
    start = _utc(row.charge_period_start, "charge_period_start")
    if start.minute or start.second or start.microsecond:
        raise FocusError(f"charge_period_start must be on the hour, got {start.isoformat()}")
    billing_start = _utc(row.billing_period_start, "billing_period_start")
    billing_end = _utc(row.billing_period_end, "billing_period_end")
    if billing_end <= billing_start:
        raise FocusError(f"billing_period_end {billing_end.isoformat()} must be after billing_period_start "
                         f"{billing_start.isoformat()}")
    if row.correction != (row.corrected_period_start is not None):
        raise FocusError("corrected_period_start must be given for a correction, and only for one")
    if row.corrected_period_start is None:
        if not (billing_start <= start and start + HOUR <= billing_end):
            raise FocusError(f"the hour from {start.isoformat()} is not within its billing period "
                             f"[{billing_start.isoformat()}, {billing_end.isoformat()})")
        return
    # FOCUS: a correction is booked in the billing period under way, and charged to the hour it corrects.
    corrected = _utc(row.corrected_period_start, "corrected_period_start")
    if not (corrected <= start and start + HOUR <= billing_start):
        raise FocusError(f"a correction's hour (from {start.isoformat()}) must lie in the billing period it corrects "
                         f"(from {corrected.isoformat()}), before the one it is booked in (from "
                         f"{billing_start.isoformat()})")


def _check_who(row: FocusCharge) -> None:
    if row.category not in CATEGORIES:
        raise FocusError(f"category must be one of {', '.join(CATEGORIES)}, got {shortened(str(row.category))!r}")
    if (row.namespace is None) is not (row.category == "unallocated"):
        raise FocusError(f"a row of category {row.category!r} must name a namespace, and only such a row: "
                         f"got {row.namespace!r}")
    if row.namespace is not None:
        try:
            NAMESPACE.check(row.namespace, "namespace")
        except InvalidName as exc:
            raise FocusError(str(exc)) from None
    _text(row.model, "model")


def _prices(row: FocusCharge) -> tuple[int, int]:
    """The unit prices in millionths; 0 for a model the sheet does not price in that hour: FOCUS wants a usage row's
    unit prices (null only on a correction), and 0, what is charged, keeps cost = unit price x quantity on every row."""
    if row.list_per_gpu_hour is None and row.contracted_per_gpu_hour is None:
        return 0, 0
    if row.list_per_gpu_hour is None or row.contracted_per_gpu_hour is None:
        raise FocusError("list_per_gpu_hour and contracted_per_gpu_hour must both be given, or neither")
    return _price(row.list_per_gpu_hour, "list_per_gpu_hour"), _price(row.contracted_per_gpu_hour,
                                                                       "contracted_per_gpu_hour")


def _price(amount: Decimal, what: str) -> int:
    units = amount.scaleb(PRICE_PLACES) if isinstance(amount, Decimal) and amount.is_finite() else None
    if units is None or not 0 <= amount <= MAX_AMOUNT or units != units.to_integral_value():
        raise FocusError(f"{what} must be a Decimal from 0 to {MAX_AMOUNT:,} of at most {PRICE_PLACES} decimal "
                         f"places, got {shortened(str(amount))!r}")
    return int(units)


def unit_price(amount: Decimal) -> str:
    """A price per GPU-hour as the export writes it (PRICE_PLACES decimals, exact)."""
    return _fixed(_price(amount, "a price per GPU-hour"), PRICE_PLACES)


def price_units(amount: Decimal) -> int:
    """A price per GPU-hour in millionths, checked as the export checks it."""
    return _price(amount, "a price per GPU-hour")


def cost_at(micro: int, units: int) -> str:
    """What `micro` micro-GPU-seconds cost at `units` (price_units) per GPU-hour, as the export writes it."""
    return _cost(micro, units)


def _cost(micro: int, price_units: int) -> str:
    numerator = micro * price_units * 10**COST_PLACES
    return _fixed(_divided(numerator, MICRO_GPU_SECONDS_PER_GPU_HOUR * 10**PRICE_PLACES), COST_PLACES)


def _divided(numerator: int, denominator: int) -> int:
    """numerator / denominator (> 0), rounded half to even."""
    quotient, remainder = divmod(numerator, denominator)
    if 2 * remainder > denominator or (2 * remainder == denominator and quotient % 2):
        quotient += 1
    return quotient


def _fixed(value: int, places: int) -> str:
    """value / 10**places with exactly `places` decimals: "-0.2500" for -2500 at 4."""
    whole, fraction = divmod(abs(value), 10**places)
    return f"{'-' if value < 0 else ''}{whole}.{fraction:0{places}d}"


def _utc(instant: dt.datetime, what: str) -> dt.datetime:
    if not isinstance(instant, dt.datetime) or instant.utcoffset() != dt.timedelta(0):
        raise FocusError(f"{what} must be a datetime in UTC, got {instant!r}")
    if instant.microsecond:
        raise FocusError(f"{what} must be a whole second, got {instant.isoformat()}")
    return instant


@functools.lru_cache(maxsize=4096)  # an export's rows share their billing periods and, by the hundred, their hour
def _instant(instant: dt.datetime) -> str:
    """FOCUS's Date/Time Format, YYYY-MM-DDTHH:mm:ssZ (a checked UTC instant, so its offset is dropped)."""
    return f"{instant.replace(tzinfo=None).isoformat()}Z"


def _text(value: str, what: str) -> str:
    """Printable ASCII beginning with a letter or digit: what the validator reads FOCUS's String Handling as, and
    never a cell a spreadsheet reads as a formula."""
    if (not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT or not value.isascii()
            or not value.isprintable() or not value[0].isalnum()):
        raise FocusError(f"{what} must be printable ASCII of at most {MAX_TEXT} characters beginning with a letter "
                         f"or digit, got {shortened(str(value))!r}")
    return value


def _tags(tags: Mapping[str, str]) -> str:
    """FOCUS's Key-Value Format: a JSON object, keys sorted, escaped to ASCII; null (empty) for no tags."""
    if not isinstance(tags, Mapping) or not all(isinstance(k, str) and k and isinstance(v, str)
                                                for k, v in tags.items()):
        raise FocusError(f"tags must map non-empty strings to strings, got {shortened(repr(tags))}")
    return json.dumps(dict(tags), sort_keys=True, separators=(",", ":")) if tags else ""
