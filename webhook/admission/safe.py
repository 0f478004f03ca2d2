"""Safe admission: a GPU pod with a deadline is admitted in budget only when what every budget on its namespace's path
has left uncommitted covers what the pod commits (Slurm's AccountingStorageEnforce=safe with GrpTRESRunMins). Plain
functions; the reservation itself is the timekeeper's (webhook.caches.reservations)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpusharing.commitment import ADMISSION_ID, commitment, gpu_minutes, pod_deadline_seconds
from gpusharing.contract import ANNOTATION_ADMISSION_ID, AdmissionMode, Shortfall
from gpusharing.decoded import as_mapping
from gpusharing.units.weights import weight_number
from webhook.caches.budgets import NamespaceBudget
from webhook.caches.jobs import JobLookup, owning_job
from webhook.caches.reservations import Outcome, Reservation, Reserve, Uncommitted

# A Job's deadline is carried onto its pod when the pod's own is longer than what the Job has left by more than
# this: a reinvoked webhook, a moment later, leaves the deadline it carried alone.
CARRY_SLACK_SECONDS = 60

# reserved: admitted in budget, its commitment reserved; demoted or refused: a shortfall (or, refused, a claim of
# another pod's admission id); no-deadline: admitted as under open admission (safe) or refused (strict); unchecked:
# admitted without counting (safe), because nothing could be counted; uncountable: refused for that (strict).
VERDICTS = ("reserved", "demoted", "refused", "no-deadline", "unchecked", "uncountable")


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
    pod: Mapping[str, Any], namespace: str, share: float, weight: int, budget: NamespaceBudget, jobs: JobLookup,
    reserve: Reserve, now: dt.datetime, review_uid: str, dry_run: bool = False, disclose: bool = True,
) -> SafeAdmission:
    """Safe admission's verdict on a GPU pod (a namespace over budget demotes it anyway: nothing is reserved). The
    reservation is keyed by the review's uid; a dry run's is only weighed. `disclose` False: messages say no figures
    of the budget (the caller is not known to be the API server)."""
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
    strict = budget.admission is AdmissionMode.STRICT
    if deadline is None:
        if strict:
            return SafeAdmission(refuse=(
                f"namespace {namespace!r} admits only GPU pods with a deadline (its budget's admission is strict): set "
                "spec.activeDeadlineSeconds on the pod, or on its Job"), outcome="no-deadline")
        return SafeAdmission(outcome="no-deadline")
    if budget.state.demoted:
        return SafeAdmission(carried)
    earlier = as_mapping(as_mapping(pod.get("metadata")).get("annotations")).get(ANNOTATION_ADMISSION_ID)
    needed = commitment(share, weight, deadline)
    grant = reserve(
        Reservation(
            review_uid,
            namespace,
            needed,
            earlier if isinstance(earlier, str) and ADMISSION_ID.fullmatch(earlier) else None,
            dry_run,
        )
    )
    if grant.outcome is Outcome.TAKEN:
        return SafeAdmission(carried, refuse=grant.reason, outcome="refused")
    if grant.outcome is Outcome.UNKNOWN:
        why = (f"namespace {namespace!r} has safe admission, and what its budgets have left uncommitted cannot be "
               f"counted now ({grant.reason})")
        if strict:
            return SafeAdmission(
                carried,
                refuse=f"{why}: its budget's admission is strict, so no GPU pod is admitted until it can be",
                outcome="uncountable",
            )
        return SafeAdmission(
            carried, warnings=[f"{why}: the pod is admitted by the budget's state alone"], outcome="unchecked"
        )
    if grant.outcome is Outcome.GRANTED:
        return SafeAdmission(carried, review_uid if grant.uncommitted is not None else None,
                             outcome="reserved" if grant.uncommitted is not None else None)
    assert grant.uncommitted is not None
    why = shortfall_message(namespace, grant.uncommitted, share, weight, deadline, needed, disclose)
    if budget.on_shortfall is Shortfall.REFUSE:
        return SafeAdmission(carried, refuse=why, outcome="refused")
    return SafeAdmission(carried, short=why, outcome="demoted")


def shortfall_message(
    namespace: str,
    uncommitted: Uncommitted,
    share: float,
    weight: int,
    deadline: int,
    needed: int,
    disclose: bool = True,
) -> str:
    """Why the uncommitted budget does not cover a pod that commits `needed` weighted micro-GPU-seconds; with
    `disclose` False, without the budget's figures (the caller is not known to be the API server)."""
    where = "its budget" if uncommitted.budget == namespace else f"the budget of {uncommitted.budget}"
    if not disclose:
        return (f"namespace {namespace!r} cannot cover this pod's deadline: {where} has less left uncommitted than the "
                "pod commits")
    return (
        f"namespace {namespace!r} cannot cover this pod's deadline: the pod commits {gpu_minutes(needed):.2f} "
        f"GPU-minutes ({share:g} GPU x weight {weight_number(weight):g} x {deadline} s), and {where} has "
        f"{gpu_minutes(uncommitted.micro_gpu_seconds):.2f} left uncommitted "
        f"({uncommitted.remaining_gpu_minutes:.2f} remaining, less "
        f"{uncommitted.committed_gpu_minutes:.2f} committed by running pods' deadlines"
        + (
            f" and {uncommitted.reserved_gpu_minutes:.2f} by pods being admitted"
            if uncommitted.reserved_gpu_minutes > 0.005
            else ""
        )
        + ")"
    )
