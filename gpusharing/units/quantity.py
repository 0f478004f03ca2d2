"""Kubernetes resource quantities, as the API server serializes them, and plain decimal numbers, both bounded.

The API server canonicalizes quantities before a webhook sees them (``nvidia.com/gpumem: 3000`` arrives as ``"3k"``),
so a "whole number" rule is checked on the value, not the text. The text is bounded (digits, exponent) before any
arithmetic, which is then exact: read whole, ``"1e999999"`` would be a million-digit integer (docs/dialects.md, limits).
"""

from __future__ import annotations

import re
from decimal import Context, Decimal, Inexact, InvalidOperation
from functools import lru_cache

MAX_DIGITS = 32  # digits of the number, leading and trailing zeros included
MAX_EXPONENT = 32  # of a decimal exponent (1e32); the largest suffix, Ei, is 2**60

# <sign><digits>[.<digits>] then an exponent (e3, E-2) or a suffix (k, Mi, E); "1E" is one exa, "1e" nothing.
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:[eE](?P<exponent>[+-]?[0-9]+)|(?P<suffix>[a-zA-Z]*))"
)
_DECIMAL = re.compile(r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:[eE](?P<exponent>[+-]?[0-9]+))?")

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

# Bounded inputs fit in this precision whole: a value is never silently rounded while it is read.
_EXACT = Context(prec=MAX_DIGITS + 40, traps=[InvalidOperation, Inexact])

BOUNDS = f"at most {MAX_DIGITS} digits and an exponent from -{MAX_EXPONENT} to {MAX_EXPONENT}"


class QuantityError(ValueError):
    """The text is not a quantity (or number) the services read; the message is the rule it breaks."""


class QuantityOutOfBounds(QuantityError):
    """A well-formed quantity with more digits or a larger exponent than the services read."""


def parse_quantity(value: object) -> Decimal:
    """The exact value of a Kubernetes quantity (``"3k"``, ``"1Gi"``, ``"500m"``, ``"1E"``, ``2``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) >= 10**MAX_DIGITS:
            raise QuantityOutOfBounds(f"is too large a quantity: {BOUNDS}")
        return Decimal(value)
    if type(value) is str and len(value) <= MAX_CACHED_TEXT:
        return _quantity_of_text(value)
    return _quantity(value)


# Pods write few distinct quantities ("1", "8k", "24Gi"), read a dozen times a review: each text's value is kept (a
# Decimal, immutable; a refusal is raised anew each time). Only short texts, so that what a pod's author writes
# cannot fill memory: a quantity within the bounds is shorter.
MAX_CACHED_TEXT = 2 * MAX_DIGITS


@lru_cache(maxsize=1024)
def _quantity_of_text(text: str) -> Decimal:
    return _quantity(text)


def _quantity(value: object) -> Decimal:
    if type(value) is str and len(value) <= MAX_DIGITS and value.isascii() and value.isdigit():
        return Decimal(value)  # digits alone ("1", "50"), as most values are: what the match below makes of them
    match = _match(_QUANTITY, value, "is not a quantity")
    number = _bounded_number(match)
    suffix = match["suffix"]
    if suffix is None:
        return number
    if suffix not in _SUFFIXES:
        raise QuantityError("is not a quantity")
    return _EXACT.multiply(number, _SUFFIXES[suffix])


def parse_whole_quantity(value: object) -> int:
    """A quantity that must be a whole number (``"3k"`` is 3000; ``"500m"``, ``"1.5"`` are refused)."""
    number = parse_quantity(value)
    if number != number.to_integral_value():
        raise QuantityError("is not a whole number")
    return int(number)


def parse_decimal(value: object) -> Decimal:
    """A plain decimal number, with an optional exponent (``"0.5"``, ``"5e-1"``); no NaN, no infinity, no suffix."""
    return _bounded_number(_match(_DECIMAL, value, "is not a decimal number"))


def _match(pattern: re.Pattern[str], value: object, rule: str) -> re.Match[str]:
    match = pattern.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise QuantityError(rule)
    return match


def _bounded_number(match: re.Match[str]) -> Decimal:
    """The number and exponent of a match, checked against the bounds before they are read."""
    number, exponent = match["number"], match["exponent"] or "0"
    digits = len(number.lstrip("+-").replace(".", "", 1))
    significant = exponent.lstrip("+-").lstrip("0") or "0"  # a million leading zeros are still read at once
    if digits > MAX_DIGITS or len(significant) > 2 or int(significant) > MAX_EXPONENT:
        raise QuantityOutOfBounds(f"has too many digits or too large an exponent: {BOUNDS}")
    scale = -int(significant) if exponent.startswith("-") else int(significant)
    return _EXACT.scaleb(Decimal(number), scale)
