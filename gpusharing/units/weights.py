"""Billing weights: what a GPU-second of each model is worth, in whole thousandths, so that charges stay integers.

A model's `billingWeight` in the catalogue (default 1) multiplies every GPU-second charged on it: an H100 minute can
cost four T4 minutes. A weight has at most three decimals and is kept as thousandths (2.5 is 2500), so a weighted
charge is integer arithmetic on micro-GPU-seconds.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

MILLI = 1000
MICROS_PER_SECOND = 1_000_000  # GPU time is counted in whole micro-GPU-seconds, so that sums of any length are exact
MICROS_PER_GPU_MINUTE = 60 * MICROS_PER_SECOND
UNIT_WEIGHT = MILLI  # a weight of 1: a GPU-minute is billed as one GPU-minute
MAX_WEIGHT = 1000


class WeightError(ValueError):
    """Not a billing weight; the message says what one is."""


def parse_weight(value: object) -> int:
    """A catalogue's `billingWeight` (a number from 0.001 to 1000, at most three decimals), in thousandths."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WeightError(
            f"must be a number from 0.001 to {MAX_WEIGHT} with at most three decimals, got {str(value)[:40]!r}"
        )
    try:
        thousandths = Decimal(str(value)) * MILLI
    except InvalidOperation:
        thousandths = Decimal("NaN")
    if (
        not thousandths.is_finite()
        or thousandths != thousandths.to_integral_value()
        or not 1 <= thousandths <= MAX_WEIGHT * MILLI
    ):
        raise WeightError(f"must be a number from 0.001 to {MAX_WEIGHT} with at most three decimals, got {value!r}")
    return int(thousandths)


def weighted(micro_gpu_seconds: int, thousandths: int) -> int:
    """A charge at a weight, in whole micro-GPU-seconds (rounded down: exact for weights that are whole numbers)."""
    return micro_gpu_seconds * thousandths // MILLI


def weight_number(thousandths: int) -> float:
    return thousandths / MILLI
