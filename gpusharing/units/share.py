"""The billed GPU share: its precision and its bounds, the same for the webhook that records it and the timekeeper
that bills it (a share the webhook admits is one the timekeeper accepts)."""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal

SHARE_PRECISION = Decimal("0.0001")
MIN_GPU_SHARE = SHARE_PRECISION  # a pod that gets a GPU is billed at least this
MAX_GPU_SHARE = 1000  # GPUs one pod may be billed for


def format_share(share: Decimal) -> str:
    """A share as a short decimal string, rounded up so that nobody is billed less than they hold."""
    rounded = share.quantize(SHARE_PRECISION, rounding=ROUND_CEILING).normalize()
    return f"{rounded:f}"
