"""Kubernetes resource quantities, as the API server serializes them.

The API server canonicalizes quantities before a webhook sees them: a HAMi ``nvidia.com/gpumem: 3000``
arrives as ``"3k"``. So a "plain integer" rule has to be checked on the quantity's value, not its text.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_QUANTITY = re.compile(r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?P<suffix>[a-zA-Z]*|[eE][+-]?[0-9]+)$")

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""


def parse_quantity(value: object) -> Decimal:
    """The exact value of a Kubernetes quantity (``"3k"``, ``"1Gi"``, ``"500m"``, ``2``)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise QuantityError("is not a quantity")
    if isinstance(value, int):
        return Decimal(value)
    match = _QUANTITY.match(value.strip())
    if not match:
        raise QuantityError("is not a quantity")
    suffix = match["suffix"]
    try:
        number = Decimal(match["number"])
        if suffix[:1] in ("e", "E"):
            return number.scaleb(int(suffix[1:]))
        return number * _SUFFIXES[suffix]
    except (KeyError, InvalidOperation, ValueError) as exc:
        raise QuantityError("is not a quantity") from exc


def parse_whole_quantity(value: object) -> int:
    """A quantity that must be a whole number (``"3k"`` is 3000; ``"500m"``, ``"1.5"`` are refused)."""
    number = parse_quantity(value)
    if number != number.to_integral_value():
        raise QuantityError("is not a whole number")
    return int(number)
