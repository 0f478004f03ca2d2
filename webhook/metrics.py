"""The webhook's Prometheus metrics (merged across gunicorn workers by gpusharing.metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

ADMISSIONS = Counter(
    "gpusharing_webhook_admissions",
    "Admission reviews answered, by operation, decision and GPU-sharing dialect.",
    ["endpoint", "operation", "decision", "dialect"],
)
LATENCY = Histogram(
    "gpusharing_webhook_admission_duration_seconds",
    "Time to answer one admission review.",
    ["endpoint"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
BAD_REVIEWS = Counter("gpusharing_webhook_bad_reviews", "Bodies refused with HTTP 400.", ["endpoint"])
BUDGET_REFRESHES = Counter(
    "gpusharing_webhook_budget_refreshes", "Polls of the timekeeper's budget states, by outcome.", ["outcome"]
)


def record_budget_refresh(ok: bool) -> None:
    BUDGET_REFRESHES.labels("ok" if ok else "failed").inc()
