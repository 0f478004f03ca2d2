"""Kubernetes quantities are read by value, so canonicalized forms like "3k" stay plain integers."""

from decimal import Decimal

import pytest

from gpusharing.units.quantity import (
    QuantityError,
    QuantityOutOfBounds,
    parse_decimal,
    parse_quantity,
    parse_whole_quantity,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [("3k", 3000), ("1Gi", 2**30), ("500m", Decimal("0.5")), ("1.5", Decimal("1.5")), ("2e3", 2000), (7, 7), ("+4", 4),
     ("1E", 10**18), ("2Ei", 2**61), ("1E3", 1000), ("5e-1", Decimal("0.5")), ("1e+2", 100), (".5", Decimal("0.5")),
     ("1" * 32, int("1" * 32)), ("1e32", 10**32), ("1e-32", Decimal("1e-32")), ("1e0003", 1000),
     ("1e-" + "0" * 1_000_000 + "3", Decimal("0.001")), ("-0", 0)],
)
def test_quantities_by_value(text: object, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text", ["abc", "", "1.2.3", "5 Gi", "1Q", True, None, 1.5, "--1", "1e", "NaN", "Infinity", "1_000", "٣", "1e3k"]
)
def test_not_a_quantity(text: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_whole_quantities() -> None:
    assert parse_whole_quantity("1.5k") == 1500
    for fractional in ("500m", "1.5", "0.0001k"):
        with pytest.raises(QuantityError):
            parse_whole_quantity(fractional)


@pytest.mark.parametrize(
    "text",
    [
        "1e999999",
        "1e-999999999",
        "1e33",
        "1e-33",
        "1" * 33,
        "0." + "0" * 32 + "1",
        "1" * 40 + "Ki",
        10**32,
        "1" * 3_000_000,
        "1e" + "9" * 1_000_000,
    ],
)
def test_quantities_beyond_the_bounds_are_refused_before_they_are_read(text: object) -> None:
    with pytest.raises(QuantityOutOfBounds, match="at most 32 digits and an exponent from -32 to 32"):
        parse_quantity(text)


def test_the_largest_quantities_are_read_exactly() -> None:
    assert parse_quantity("9" * 32 + "Ei") == int("9" * 32) * 2**60
    with pytest.raises(QuantityError):
        parse_whole_quantity("1" * 31 + ".1")  # not rounded to a whole number on the way


def test_plain_decimals() -> None:
    assert parse_decimal(" 0.25 ") == Decimal("0.25") and parse_decimal("25e-2") == Decimal("0.25")
    for text in ("1k", "NaN", "inf", "0x10", "", 0.5, "1e40"):
        with pytest.raises(QuantityError):
            parse_decimal(text)
