"""The webhook's Prometheus metrics (merged across gunicorn workers by gpusharing.serving.metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from gpusharing.serving.metrics import LATENCY_BUCKETS, series  # noqa: F401  (webhook.metrics.series)

ADMISSIONS = Counter(
    "gpusharing_webhook_admissions",
    "Admission reviews answered, by operation, decision and GPU-sharing dialect.",
    ["endpoint", "operation", "decision", "dialect"],
)
LATENCY = Histogram(
    "gpusharing_webhook_admission_duration_seconds",
    "Time to answer one admission review.",
    ["endpoint"],
    buckets=LATENCY_BUCKETS,
    unit="seconds",
)
BAD_REVIEWS = Counter("gpusharing_webhook_bad_reviews", "Bodies refused with HTTP 400.", ["endpoint"])
REFUSED_CALLERS = Counter(
    "gpusharing_webhook_refused_callers",
    "Reviews refused before they were read because the caller is not the API server (client authentication), "
    "by status.",
    ["endpoint", "status"],
)
BUDGET_REFRESHES = Counter(
    "gpusharing_webhook_budget_refreshes", "Polls of the timekeeper's budget states, by outcome.", ["outcome"]
)

CLAIM_SYNCS = Counter(
    "gpusharing_webhook_claim_syncs",
    "Lists and watches of ResourceClaimTemplates and ResourceClaims, by kind and outcome.",
    ["kind", "outcome"],
)


def record_budget_refresh(ok: bool) -> None:
    BUDGET_REFRESHES.labels("ok" if ok else "failed").inc()


SAFE_ADMISSIONS = Counter(
    "gpusharing_webhook_safe_admissions",
    "GPU pods of namespaces under safe or strict admission, by verdict (reserved, demoted, refused, no-deadline, "
    "unchecked, uncountable).",
    ["verdict"],
)
JOB_SYNCS = Counter(
    "gpusharing_webhook_job_syncs",
    "Lists and watches of Jobs (whose deadlines safe admission carries onto their pods), by outcome.",
    ["outcome"],
)


PRIORITY_CLASS_SYNCS = Counter(
    "gpusharing_webhook_priority_class_syncs",
    "Lists and watches of PriorityClasses (whose value and preemption policy the webhook writes into GPU pods), "
    "by outcome.",
    ["outcome"],
)
UNRESOLVED_PRIORITIES = Counter(
    "gpusharing_webhook_unresolved_priorities",
    "GPU pods given a priority class the webhook's watch did not know: the API server's Priority plugin resolved it, "
    "and called the webhook a second time.",
    ["priority_class"],
)


def record_claim_sync(kind: str, ok: bool) -> None:
    CLAIM_SYNCS.labels(kind, "ok" if ok else "failed").inc()


def record_job_sync(ok: bool) -> None:
    JOB_SYNCS.labels("ok" if ok else "failed").inc()


def record_priority_class_sync(ok: bool) -> None:
    PRIORITY_CLASS_SYNCS.labels("ok" if ok else "failed").inc()
