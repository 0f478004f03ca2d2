"""The sentence that warns a namespace before its GPU budget runs out: the timekeeper writes it into Events and the
webhook into the warnings `kubectl apply` prints, so both say it alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpusharing.compat import from_iso
from gpusharing.listing import BudgetWarning

DEFAULT_WARNING_THRESHOLDS = (80, 95)  # percent of a budget (with this period's top-ups)
MAX_WARNING_THRESHOLDS = 5


def check_warning_thresholds(raw: object, what: str = "warningThresholds") -> tuple[int, ...]:
    """Whole percents strictly increasing within 1..99, at most MAX_WARNING_THRESHOLDS; ValueError saying why."""
    rule = (f"{what} must be a list of at most {MAX_WARNING_THRESHOLDS} whole percents from 1 to 99, strictly "
            "increasing (e.g. [80, 95]; [] for none)")
    if not isinstance(raw, (list, tuple)) or len(raw) > MAX_WARNING_THRESHOLDS:
        raise ValueError(rule)
    if any(isinstance(t, bool) or not isinstance(t, int) or not 0 < t < 100 for t in raw):
        raise ValueError(rule)
    if any(a >= b for a, b in zip(raw, raw[1:])):
        raise ValueError(rule)
    return tuple(raw)


def period_phrase(period: str, period_start: str) -> str:
    """'for November', 'for the week of 16 November', 'for 23 November'; '' for a budget that never renews."""
    start = from_iso(period_start)  # not strptime: the webhook words warnings in a thread
    if period == "monthly":
        return f" for {start:%B}"
    if period == "weekly":
        return f" for the week of {start.day} {start:%B}"
    if period == "daily":
        return f" for {start.day} {start:%B}"
    return ""


def usage_warning(namespace: str, warning: BudgetWarning | Mapping[str, Any]) -> str:
    """The warning for `namespace` from one entry of a status' `warnings` (its own budget's, or an ancestor's), or
    from its JSON (read through the listing's contract: ValueError when it is no warning).

    e.g. `namespace ml-team has used 86 % of its 6000 GPU-minutes for November`.
    """
    if not isinstance(warning, BudgetWarning):
        read = BudgetWarning.read(warning)
        if read is None:
            raise ValueError("not a budget warning: budget, percentUsed, gpuMinutes, period and periodStart are needed")
        warning = read
    used = f"{int(warning.percent_used)} % of its {warning.gpu_minutes:g} GPU-minutes"
    when = period_phrase(str(warning.period), warning.period_start)
    if warning.budget == namespace:
        return f"{'group' if '.' in namespace else 'namespace'} {namespace} has used {used}{when}"
    return f"namespace {namespace} is part of {warning.budget}, which has used {used}{when}"
