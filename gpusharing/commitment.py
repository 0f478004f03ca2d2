"""What a GPU pod commits of its namespace's budget: Slurm's GrpTRESRunMins for pods.

A pod with a deadline (`spec.activeDeadlineSeconds`) can use at most its billed share x its model's billing weight
x the time its deadline leaves it. Safe admission admits a pod in budget only when what is left of the budget,
less what the running pods have so committed, covers the pod's own commitment. The webhook and the timekeeper
compute it here, the same way, in weighted micro-GPU-seconds (integers, as the ledger counts).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpusharing.decoded import as_mapping
from gpusharing.units.weights import MICROS_PER_SECOND, weighted

# activeDeadlineSeconds is an int64 the API server checks only after the webhook: a pod may claim anything. No pod
# runs longer than this, and a bound keeps every product below small integers.
MAX_DEADLINE_SECONDS = 10 * 365 * 24 * 3600
# A reservation's id: the uid of the AdmissionReview that made it (the API server's are UUIDs), on the pod as
# gpusharing.io/admission-id.
ADMISSION_ID = re.compile(r"[0-9A-Za-z-]{1,64}")


def commitment(share: float, weight: int, seconds: float) -> int:
    """Weighted micro-GPU-seconds a pod of `share` GPUs on a model of `weight` (thousandths) can use in `seconds`."""
    return weighted(round(share * max(0.0, seconds) * MICROS_PER_SECOND), weight)


def deadline_seconds(value: object) -> int | None:
    """An `activeDeadlineSeconds` as a pod or a Job states it, if it is one (a whole number of seconds, at least 1);
    None for none, or for a value the API server will refuse anyway."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return min(value, MAX_DEADLINE_SECONDS)


def pod_deadline_seconds(pod: Mapping[str, Any]) -> int | None:
    return deadline_seconds(as_mapping(pod.get("spec")).get("activeDeadlineSeconds"))


def gpu_minutes(micro_gpu_seconds: int) -> float:
    """Micro-GPU-seconds as the API and messages state them."""
    return micro_gpu_seconds / (60 * MICROS_PER_SECOND)
