"""Kubernetes quantities are read by value, so canonicalized forms like "3k" stay plain integers."""

from decimal import Decimal

import pytest

from gpusharing.quantity import QuantityError, parse_quantity, parse_whole_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [("3k", 3000), ("1Gi", 2**30), ("500m", Decimal("0.5")), ("1.5", Decimal("1.5")), ("2e3", 2000), (7, 7), ("+4", 4)],
)
def test_quantities_by_value(text: object, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["abc", "", "1.2.3", "5 Gi", "1Q", True, None, 1.5, "--1"])
def test_not_a_quantity(text: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_whole_quantities() -> None:
    assert parse_whole_quantity("1.5k") == 1500
    for fractional in ("500m", "1.5", "0.0001k"):
        with pytest.raises(QuantityError):
            parse_whole_quantity(fractional)
