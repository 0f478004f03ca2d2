"""The price sheet: what a GPU-hour of each model of the catalogue costs, in one currency, from a date on
(docs/chargeback.md, "Prices").

The sheet is a YAML file the administrator mounts beside the GPU-model catalogue (TIMEKEEPER_GPU_PRICES_FILE; the
chart's `gpuPrices`, the kustomize ConfigMap's `gpu-prices.yaml`):

    currency: USD                          # ISO 4217
    prices:
    - model: NVIDIA H100 80GB HBM3         # a model of the catalogue, as it names it
      from: 2026-01-01                     # a UTC day: the price holds from its midnight on
      listPerGpuHour: "4.50"               # the public price
      contractedPerGpuHour: "3.10"         # the negotiated one, if any: else the list price

Amounts are exact decimals (at most 6 places, as FOCUS's costs are written), never floats. The timekeeper records each
sheet it starts with (timekeeper.database.chargeback.prices), and a sheet takes effect at the first whole hour after it
was recorded: a change of price changes no hour already charged.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml

from gpusharing.gpu.catalogue import GpuCatalogue
from gpusharing.messages import shortened
from timekeeper.chargeback.currencies import ISO_4217

MAX_PRICES = 10_000  # entries in one sheet: a price a month for a century of every model of a large catalogue
MAX_AMOUNT = Decimal(10) ** 9  # per GPU-hour
AMOUNT_PLACES = 6
MAX_AMOUNT_CHARS = 32


class PriceSheetError(ValueError):
    """The price sheet is not one the timekeeper can use; the message says what is wrong and where."""


@dataclass(frozen=True)
class GpuPrice:
    """What a GPU-hour of one model costs from a day on."""

    model: str
    effective_from: dt.date  # from its midnight, UTC
    list_per_gpu_hour: Decimal
    contracted_per_gpu_hour: Decimal  # the negotiated price; the list price where none was negotiated

    def to_json(self) -> dict[str, str]:
        return {"model": self.model, "from": self.effective_from.isoformat(),
                "listPerGpuHour": f"{self.list_per_gpu_hour:f}",
                "contractedPerGpuHour": f"{self.contracted_per_gpu_hour:f}"}


@dataclass(frozen=True)
class PriceSheet:
    """Every model's prices over time, in one currency; ordered by model, then day."""

    currency: str | None  # ISO 4217; None: no sheet, nothing is priced
    prices: tuple[GpuPrice, ...] = ()

    def price_at(self, model: str, at: dt.datetime) -> GpuPrice | None:
        """The price of `model` in force at `at`; None when the sheet prices it from no earlier day."""
        day = at.astimezone(dt.timezone.utc).date()
        found = None
        for price in self.prices:
            if price.model == model and price.effective_from <= day:
                found = price
        return found

    def to_json(self) -> dict[str, Any]:
        return {"currency": self.currency, "prices": [price.to_json() for price in self.prices]}

    def canonical(self) -> str:
        """The sheet in one byte-exact form: what the timekeeper records, and compares to know it changed."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


NO_PRICES = PriceSheet(None)


def load_price_sheet(path: Path, catalogue: GpuCatalogue) -> PriceSheet:
    """The sheet in the YAML file at `path`, its models checked against `catalogue`; PriceSheetError saying what is
    wrong and where."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as exc:  # ValueError: a day YAML reads as a date, not one
        raise PriceSheetError(f"cannot read {path}: {exc}") from None
    return price_sheet_from(document, str(path), catalogue)


def price_sheet_from(document: object, where: str, catalogue: GpuCatalogue) -> PriceSheet:
    """The sheet a decoded YAML document describes."""
    if not isinstance(document, Mapping) or set(document) != {"currency", "prices"}:
        raise PriceSheetError(f"{where}: expected a mapping with `currency` and `prices`")
    currency = document["currency"]
    if not isinstance(currency, str) or currency not in ISO_4217:
        raise PriceSheetError(
            f"{where}: `currency` must be an ISO 4217 code in capitals (e.g. USD, EUR), "
            f"got {shortened(str(currency))!r}"
        )
    entries = document["prices"]
    if not isinstance(entries, list) or len(entries) > MAX_PRICES:
        raise PriceSheetError(f"{where}: `prices` must be a list of at most {MAX_PRICES} prices")
    prices = [_price(entry, f"{where}: prices[{index}]", catalogue) for index, entry in enumerate(entries)]
    seen: set[tuple[str, dt.date]] = set()
    for index, price in enumerate(prices):
        if (price.model, price.effective_from) in seen:
            raise PriceSheetError(
                f"{where}: prices[{index}] prices {price.model!r} from {price.effective_from} a second time"
            )
        seen.add((price.model, price.effective_from))
    return PriceSheet(currency, tuple(sorted(prices, key=lambda p: (p.model, p.effective_from))))


def _price(entry: object, where: str, catalogue: GpuCatalogue) -> GpuPrice:
    keys = {"model", "from", "listPerGpuHour", "contractedPerGpuHour"}
    if not isinstance(entry, Mapping) or not {"model", "from", "listPerGpuHour"} <= set(entry) <= keys:
        raise PriceSheetError(
            f"{where}: expected `model`, `from`, `listPerGpuHour` and optionally `contractedPerGpuHour`, "
            f"got {shortened(str(entry))}"
        )
    name = entry["model"]
    model = catalogue.by_name(name) if isinstance(name, str) else None
    if model is None or model.name != name:
        raise PriceSheetError(
            f"{where}: `model` must name a model of the GPU model catalogue as it names it, "
            f"got {shortened(str(name))!r}"
        )
    listed = _amount(entry["listPerGpuHour"], f"{where}: `listPerGpuHour` of {name!r}")
    contracted = listed
    if "contractedPerGpuHour" in entry:
        contracted = _amount(entry["contractedPerGpuHour"], f"{where}: `contractedPerGpuHour` of {name!r}")
    return GpuPrice(name, _day(entry["from"], f"{where}: `from` of {name!r}"), listed, contracted)


def _amount(raw: object, where: str) -> Decimal:
    """A price per GPU-hour: a decimal of at most 6 places, from 0 to 10^9; given as text ("4.50"), or as a YAML
    number read by its text (never as a float)."""
    text = str(raw).strip() if isinstance(raw, (str, int, float)) and not isinstance(raw, bool) else ""
    try:
        value = Decimal(text) if 0 < len(text) <= MAX_AMOUNT_CHARS else None
    except InvalidOperation:
        value = None
    if value is None or not value.is_finite() or not 0 <= value <= MAX_AMOUNT:
        raise PriceSheetError(f"{where} must be an amount from 0 to {MAX_AMOUNT:,}, got {shortened(str(raw))!r}")
    if -value.normalize().as_tuple().exponent > AMOUNT_PLACES:  # type: ignore[operator]
        raise PriceSheetError(f"{where} has more than {AMOUNT_PLACES} decimal places: {shortened(str(raw))!r}")
    return value.normalize()


def _day(raw: object, where: str) -> dt.date:
    if isinstance(raw, dt.date) and not isinstance(raw, dt.datetime):
        return raw
    if isinstance(raw, str) and len(raw) == 10:
        try:
            return dt.date.fromisoformat(raw)
        except ValueError:
            pass
    raise PriceSheetError(f"{where} must be a day, YYYY-MM-DD (UTC), got {shortened(str(raw))!r}")
