"""Safe admission in the webhook: a pod with a deadline is admitted in budget only when the namespace's uncommitted
budget covers it; bursts reserve against that budget locally and cannot overrun it."""

from __future__ import annotations

import datetime as dt
import json
import threading
from typing import Any

import jsonpatch

from demo.apiserver import admission_review, api_server_pod
from gpusharing.commitment import commitment
from gpusharing.contract import ANNOTATION_ADMISSION_ID, AdmissionMode, BudgetState, Shortfall
from webhook.admission.policy import admit
from webhook.admission.review import parse_review
from webhook.admission.safe import SafeAdmission, safe_admission
from webhook.caches.budgets import NamespaceBudget, Uncommitted, states_from_listing
from webhook.caches.jobs import JobDeadline, job_deadline, no_jobs, owning_job
from webhook.caches.reservations import Grant, Reservations
from webhook.config import WebhookConfig

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
MINUTE = 60_000_000  # micro-GPU-seconds
WEIGHT = 1000  # a billing weight of 1, in thousandths


def pod(deadline: int | None = None, owner: dict[str, Any] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "train", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    metadata: dict[str, Any] = {"generateName": "train-", "annotations": annotations or {}}
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return api_server_pod({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}, "ml")


def budget(mode: AdmissionMode = AdmissionMode.SAFE, uncommitted_minutes: float | None = 10.0, known: bool = True,
           shortfall: Shortfall = Shortfall.DEMOTE) -> NamespaceBudget:
    left = None if uncommitted_minutes is None else Uncommitted(round(uncommitted_minutes * MINUTE), "ml", 25.0, 15.0)
    return NamespaceBudget(BudgetState.IN_BUDGET, (), mode, shortfall, known, left)


def checked_alone(namespace: str, admission_id: str, micro: int, hold: bool) -> Grant:
    return Grant(micro <= 10 * MINUTE, 10 * MINUTE)


def decide(p: dict[str, Any], b: NamespaceBudget, share: float = 0.5, jobs: Any = no_jobs, reserve: Any = checked_alone) -> SafeAdmission:
    return safe_admission(p, "ml", share, WEIGHT, b, jobs, reserve, NOW)


def test_an_open_budget_admits_as_before() -> None:
    assert decide(pod(3600), budget(AdmissionMode.OPEN, 0.0)) == SafeAdmission()


def test_a_pod_whose_commitment_fits_gets_an_admission_id() -> None:
    verdict = decide(pod(1200), budget())  # 0.5 GPU x 1200 s = 10 GPU-minutes: exactly what is left
    assert verdict.short is None and verdict.refuse is None
    assert verdict.admission_id is not None and len(verdict.admission_id) == 16


def test_a_pod_whose_commitment_does_not_fit_is_demoted_with_the_numbers() -> None:
    verdict = decide(pod(1201), budget())
    assert verdict.refuse is None
    assert verdict.short == (
        "namespace 'ml' cannot cover this pod's deadline: the pod commits 10.01 GPU-minutes (0.5 GPU x weight 1 x 1201 s), "
        "and its budget has 10.00 left uncommitted (25.00 remaining, less 15.00 committed by running pods' deadlines)"
    )


def test_a_budget_that_refuses_on_shortfall_refuses_the_pod() -> None:
    verdict = decide(pod(7200), budget(shortfall=Shortfall.REFUSE))
    assert verdict.short is None and verdict.refuse is not None and "commits 60.00 GPU-minutes" in verdict.refuse


def test_a_pod_without_a_deadline_is_admitted_as_before_under_safe_and_refused_under_strict() -> None:
    assert decide(pod(), budget()) == SafeAdmission(outcome="no-deadline")
    refused = decide(pod(), budget(AdmissionMode.STRICT)).refuse
    assert refused == ("namespace 'ml' admits only GPU pods with a deadline (its budget's admission is strict): set "
                       "spec.activeDeadlineSeconds on the pod, or on its Job")


def test_a_deadline_the_api_server_would_refuse_counts_as_none() -> None:
    for hostile in (0, -5, True, "3600", 3.5):
        assert decide(pod(hostile), budget(AdmissionMode.STRICT)).refuse is not None  # type: ignore[arg-type]


def test_without_the_timekeepers_word_on_commitments_the_pod_is_admitted_with_a_warning() -> None:
    verdict = decide(pod(3600), budget(known=False))
    assert verdict.admission_id is None and verdict.short is None
    assert "does not know what its running pods have committed" in verdict.warnings[0]


def test_unlimited_budgets_commit_nothing() -> None:
    assert decide(pod(3600), budget(uncommitted_minutes=None)) == SafeAdmission()


JOB = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid", "controller": True}


def test_a_jobs_deadline_is_carried_onto_its_pod_less_what_has_elapsed() -> None:
    def jobs(namespace: str, name: str, uid: str) -> JobDeadline | None:
        assert (namespace, name, uid) == ("ml", "train", "job-uid")
        return JobDeadline(uid, 1800, NOW - dt.timedelta(seconds=600))

    verdict = decide(pod(owner=JOB), budget(AdmissionMode.STRICT), jobs=jobs)
    assert verdict.deadline_seconds == 1200 and verdict.admission_id is not None
    # The pod's own deadline stands when it is shorter, or hardly longer (a reinvocation a moment later).
    assert decide(pod(900, owner=JOB), budget(), jobs=jobs).deadline_seconds is None
    assert decide(pod(1230, owner=JOB), budget(), jobs=jobs).deadline_seconds is None
    assert decide(pod(7200, owner=JOB), budget(), jobs=jobs).deadline_seconds == 1200


def test_a_job_the_webhook_does_not_know_leaves_the_pod_without_a_deadline() -> None:
    assert decide(pod(owner=JOB), budget(AdmissionMode.STRICT)).refuse is not None
    # Only a controlling Job counts.
    assert owning_job(pod(owner={**JOB, "controller": False})) is None
    assert owning_job(pod(owner={**JOB, "kind": "JobSet"})) is None


def test_a_job_is_read_as_the_api_server_serves_it() -> None:
    job = job_deadline({"metadata": {"uid": "u"}, "spec": {"activeDeadlineSeconds": 600}, "status": {"startTime": "2026-11-23T11:55:00Z"}})
    assert job == JobDeadline("u", 600, dt.datetime(2026, 11, 23, 11, 55, tzinfo=UTC))
    assert job.remaining_seconds(NOW) == 300
    assert job.remaining_seconds(NOW + dt.timedelta(hours=1)) == 1  # past its deadline: the Job controller ends it
    assert job_deadline({"metadata": {"uid": "u"}, "spec": {}, "status": {"startTime": "yesterday"}}) == JobDeadline("u", None, None)


def test_a_reinvoked_webhook_keeps_the_pods_admission_id() -> None:
    reservations = Reservations()
    reserved: list[str] = []

    def reserve(namespace: str, admission_id: str, micro: int, hold: bool) -> Grant:
        reserved.append(admission_id)
        return reservations.reserve(namespace, admission_id, micro, 10 * MINUTE, hold)

    first = decide(pod(1200), budget(), reserve=reserve)
    again = decide(pod(1200, annotations={ANNOTATION_ADMISSION_ID: str(first.admission_id)}), budget(), reserve=reserve)
    assert again.admission_id == first.admission_id and again.short is None
    assert reservations.held("ml") == 10 * MINUTE  # reserved once


def test_a_burst_of_concurrent_reservations_never_overruns_the_uncommitted_budget() -> None:
    reservations = Reservations()
    need = commitment(0.25, WEIGHT, 600)  # 2.5 GPU-minutes each
    granted: list[bool] = []
    start = threading.Barrier(64)

    def one(index: int) -> None:
        start.wait()
        with reservations.lock:
            granted.append(reservations.reserve("ml", f"{index:016x}", need, 100 * MINUTE).granted)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert granted.count(True) == 40 and reservations.held("ml") == 100 * MINUTE


def test_a_reinvocation_that_changed_the_pods_request_replaces_its_reservation() -> None:
    reservations = Reservations()
    with reservations.lock:
        assert reservations.reserve("ml", "a" * 16, 4 * MINUTE, 10 * MINUTE).granted
        assert reservations.reserve("ml", "a" * 16, 10 * MINUTE, 10 * MINUTE) == Grant(True, 10 * MINUTE)
    assert reservations.held("ml") == 10 * MINUTE


def test_a_dry_run_is_answered_without_holding_anything() -> None:
    reservations = Reservations()
    with reservations.lock:
        assert reservations.reserve("ml", "a" * 16, 10 * MINUTE, 10 * MINUTE, hold=False).granted
        assert reservations.reserve("ml", "b" * 16, 10 * MINUTE, 10 * MINUTE).granted
        assert not reservations.reserve("ml", "c" * 16, 1, 10 * MINUTE, hold=False).granted


def test_each_webhook_process_reserves_against_its_own_slice() -> None:
    reservations = Reservations(slices=4)
    with reservations.lock:
        assert reservations.reserve("ml", "a" * 16, 25 * MINUTE, 100 * MINUTE).granted
        assert reservations.reserve("ml", "b" * 16, 1, 100 * MINUTE) == Grant(False, 0)


def test_a_reservation_ends_when_the_timekeeper_counts_its_pod_or_after_it_waited_too_long() -> None:
    now = [0.0]
    reservations = Reservations(keep_seconds=300, clock=lambda: now[0])
    with reservations.lock:
        reservations.reserve("ml", "a" * 16, MINUTE, 10 * MINUTE)
        reservations.reserve("ml", "b" * 16, MINUTE, 10 * MINUTE)
        reservations.settle({"ml": frozenset({"a" * 16})})
    assert reservations.held("ml") == MINUTE
    now[0] = 301.0
    with reservations.lock:
        reservations.settle({})
    assert reservations.held("ml") == 0


def test_the_listing_carries_the_namespaces_admission_and_what_is_uncommitted() -> None:
    states = states_from_listing({"items": [
        {"namespace": "ml", "state": "in-budget", "admission": "strict", "onShortfall": "refuse", "committedGpuMinutes": 15.0,
         "uncommitted": {"microGpuSeconds": 600_000_000, "gpuMinutes": 10.0, "budget": "team.a", "remainingGpuMinutes": 25.0,
                         "committedGpuMinutes": 15.0},
         "admissionIds": ["a" * 16, 7]},
        {"namespace": "old", "state": "in-budget"},  # a timekeeper from before safe admission
        {"namespace": "odd", "state": "in-budget", "admission": "reckless"},
    ]})
    ml = states.of("ml")
    assert (ml.admission, ml.on_shortfall, ml.commitments_known) == (AdmissionMode.STRICT, Shortfall.REFUSE, True)
    assert ml.uncommitted == Uncommitted(600_000_000, "team.a", 25.0, 15.0) and ml.admission_ids == {"a" * 16}
    assert states.of("old").admission is AdmissionMode.OPEN and states.of("odd").admission is AdmissionMode.OPEN


def test_a_namespace_over_budget_demotes_a_pod_with_a_deadline_and_strict_still_refuses_one_without() -> None:
    over = NamespaceBudget(BudgetState.OVER_BUDGET, (), AdmissionMode.STRICT, Shortfall.REFUSE, True, Uncommitted(0, "ml", 0, 0))
    decision = admit(parse_review(admission_review(pod(600))), WebhookConfig(), lambda _: over, mutate=True)
    assert decision.allowed and any("over its GPU budget" in w for w in decision.warnings)
    assert ANNOTATION_ADMISSION_ID not in json.dumps(decision.patch)  # nothing reserved: the pod is demoted anyway
    refused = admit(parse_review(admission_review(pod())), WebhookConfig(), lambda _: over, mutate=True)
    assert not refused.allowed and refused.code == 403 and "admits only GPU pods with a deadline" in str(refused.message)


def test_a_reinvoked_webhook_patches_nothing_more_and_reserves_nothing_more() -> None:
    """The pod the webhook patched, sent back (reinvocationPolicy: IfNeeded), is answered with no patch."""
    reservations = Reservations()

    def reserve(namespace: str, admission_id: str, micro: int, hold: bool) -> Grant:
        with reservations.lock:
            return reservations.reserve(namespace, admission_id, micro, 100 * MINUTE, hold)

    def jobs(namespace: str, name: str, uid: str) -> JobDeadline:
        return JobDeadline(uid, 1800, dt.datetime.now(UTC) - dt.timedelta(seconds=600))

    safe = budget(AdmissionMode.STRICT, 100.0)
    first = admit(parse_review(admission_review(pod(owner=JOB))), WebhookConfig(), lambda _: safe, True, jobs=jobs, reserve=reserve)
    patched = jsonpatch.apply_patch(pod(owner=JOB), first.patch)
    assert 1190 <= patched["spec"]["activeDeadlineSeconds"] <= 1200
    assert patched["metadata"]["annotations"]["gpusharing.io/safe-admission"] == "reserved"
    again = admit(parse_review(admission_review(patched)), WebhookConfig(), lambda _: safe, True, jobs=jobs, reserve=reserve)
    assert again.allowed and again.patch == []
    assert reservations.held("ml") == commitment(1.0, WEIGHT, patched["spec"]["activeDeadlineSeconds"])
