"""Safe admission: a GPU pod with a deadline is admitted in budget only when what its namespace has left uncommitted
covers what the pod commits (Slurm's AccountingStorageEnforce=safe with GrpTRESRunMins). Plain functions."""

from __future__ import annotations

import datetime as dt
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpusharing.commitment import commitment, gpu_minutes, pod_deadline_seconds
from gpusharing.contract import ANNOTATION_ADMISSION_ID, AdmissionMode, Shortfall
from gpusharing.gpu.reading import as_mapping
from gpusharing.units.weights import weight_number
from webhook.caches.budgets import NamespaceBudget
from webhook.caches.jobs import JobLookup, owning_job
from webhook.caches.reservations import Grant

# A Job's deadline is carried onto its pod when the pod's own is longer than what the Job has left by more than
# this: a reinvoked webhook, a moment later, leaves the deadline it carried alone.
CARRY_SLACK_SECONDS = 60
_ADMISSION_ID = re.compile(r"[0-9a-f]{16}")

# reserved: admitted in budget, its commitment reserved; demoted or refused: a shortfall; no-deadline: admitted as
# under open admission (safe) or refused (strict); unchecked: the timekeeper has not said what is committed.
VERDICTS = ("reserved", "demoted", "refused", "no-deadline", "unchecked")

Reserve = Callable[[str, str, int, bool], Grant]  # namespace, admission id, micro-GPU-seconds, hold (False: dry run)


@dataclass
class SafeAdmission:
    """What safe admission adds to the webhook's patch, and its verdict."""

    deadline_seconds: int | None = None  # to set on the pod: the Job's, when it is shorter
    admission_id: str | None = None  # the pod's reservation
    short: str | None = None  # why the uncommitted budget does not cover the pod
    refuse: str | None = None  # why the pod is refused
    warnings: list[str] = field(default_factory=list)
    outcome: str | None = None  # for metrics, one of VERDICTS (None: not checked)


def safe_admission(
    pod: Mapping[str, Any], namespace: str, share: float, weight: int, budget: NamespaceBudget,
    jobs: JobLookup, reserve: Reserve, now: dt.datetime, dry_run: bool = False,
) -> SafeAdmission:
    """Safe admission's verdict on a GPU pod (a namespace over budget demotes it anyway: nothing is reserved; nor
    for a dry run, which creates no pod)."""
    if not budget.admission.checks_commitments:
        return SafeAdmission()
    own = pod_deadline_seconds(pod)
    deadline, carried = own, None
    job = owning_job(pod)
    if job is not None:
        found = jobs(namespace, *job)
        left = found.remaining_seconds(now) if found is not None else None
        if left is not None and (own is None or own > left + CARRY_SLACK_SECONDS):
            deadline = carried = left
    if deadline is None:
        if budget.admission is AdmissionMode.STRICT:
            return SafeAdmission(refuse=(
                f"namespace {namespace!r} admits only GPU pods with a deadline (its budget's admission is strict): set "
                "spec.activeDeadlineSeconds on the pod, or on its Job"), outcome="no-deadline")
        return SafeAdmission(outcome="no-deadline")
    if budget.state.demoted:
        return SafeAdmission(carried)
    if not budget.commitments_known:
        return SafeAdmission(carried, warnings=[
            f"namespace {namespace!r} has safe admission, but the webhook does not know what its running pods have "
            "committed (the timekeeper has not said yet): the pod is admitted by the budget's state alone"], outcome="unchecked")
    if budget.uncommitted is None:  # no budget above the namespace has a limit
        return SafeAdmission(carried)
    existing = as_mapping(as_mapping(pod.get("metadata")).get("annotations")).get(ANNOTATION_ADMISSION_ID)
    admission_id = existing if isinstance(existing, str) and _ADMISSION_ID.fullmatch(existing) else secrets.token_hex(8)
    needed = commitment(share, weight, deadline)
    grant = reserve(namespace, admission_id, needed, not dry_run)
    if grant.granted:
        return SafeAdmission(carried, admission_id, outcome="reserved")
    why = shortfall_message(namespace, budget, share, weight, deadline, needed, grant.available)
    if budget.on_shortfall is Shortfall.REFUSE:
        return SafeAdmission(carried, refuse=why, outcome="refused")
    return SafeAdmission(carried, short=why, outcome="demoted")


def shortfall_message(
    namespace: str, budget: NamespaceBudget, share: float, weight: int, deadline: int, needed: int, available: int
) -> str:
    uncommitted = budget.uncommitted
    assert uncommitted is not None
    where = "its budget" if uncommitted.budget == namespace else f"the budget of {uncommitted.budget}"
    pending = gpu_minutes(uncommitted.micro_gpu_seconds) - gpu_minutes(available)
    return (
        f"namespace {namespace!r} cannot cover this pod's deadline: the pod commits {gpu_minutes(needed):.2f} GPU-minutes "
        f"({share:g} GPU x weight {weight_number(weight):g} x {deadline} s), and {where} has "
        f"{gpu_minutes(available):.2f} left uncommitted ({uncommitted.remaining_gpu_minutes:.2f} remaining, less "
        f"{uncommitted.committed_gpu_minutes:.2f} committed by running pods' deadlines"
        + (f" and {pending:.2f} by pods just admitted or held for other webhook processes" if pending > 0.005 else "")
        + ")"
    )
