"""Safe admission in the webhook: a pod with a deadline is admitted in budget only when the timekeeper reserves its
commitment against every budget on its namespace's path; what cannot be counted is refused under strict admission
and admitted, saying so, under safe."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import jsonpatch
import pytest

from demo.apiserver import admission_review, api_server_pod
from gpusharing.contract import ANNOTATION_ADMISSION_ID, AdmissionMode, BudgetState, Shortfall
from tests.webhook.conftest import FakeTimekeeper
from webhook.admission.policy import admit
from webhook.admission.review import parse_review
from webhook.admission.safe import SafeAdmission, safe_admission
from webhook.caches.budgets import NamespaceBudget, states_from_listing
from webhook.caches.jobs import JobDeadline, job_deadline, no_jobs, owning_job
from webhook.caches.reservations import Grant, Outcome, Reservation, TimekeeperReservations, Uncommitted
from webhook.config import WebhookConfig

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
MINUTE = 60_000_000  # micro-GPU-seconds
WEIGHT = 1000  # a billing weight of 1, in thousandths
REVIEW = "6f1c0a52-3c1e-4a7e-9a55-0d4f7c1e2b90"


def pod(
    deadline: int | None = None, owner: dict[str, Any] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "train", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": 1}}}]
    }
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    metadata: dict[str, Any] = {"generateName": "train-", "annotations": annotations or {}}
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return api_server_pod({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}, "ml")


def budget(mode: AdmissionMode = AdmissionMode.SAFE, shortfall: Shortfall = Shortfall.DEMOTE) -> NamespaceBudget:
    return NamespaceBudget(BudgetState.IN_BUDGET, (), mode, shortfall)


class Timekeeper:
    """The timekeeper's reservations as the webhook sees them: `left` micro-GPU-seconds, or another answer."""

    def __init__(self, left: int | None = 10 * MINUTE, answer: Grant | None = None):
        self.left, self.answer = left, answer
        self.asked: list[Reservation] = []

    def __call__(self, asked: Reservation) -> Grant:
        self.asked.append(asked)
        if self.answer is not None:
            return self.answer
        if self.left is None:
            return Grant(Outcome.GRANTED)
        uncommitted = Uncommitted(self.left, "ml", 25.0, 15.0, 0.0)
        return Grant(Outcome.GRANTED if asked.micro_gpu_seconds <= self.left else Outcome.SHORT, uncommitted)


def decide(p: dict[str, Any], b: NamespaceBudget, share: float = 0.5, jobs: Any = no_jobs, reserve: Any = None,
           disclose: bool = True) -> SafeAdmission:
    return safe_admission(p, "ml", share, WEIGHT, b, jobs, reserve or Timekeeper(), NOW, REVIEW, disclose=disclose)


def test_an_open_budget_admits_as_before() -> None:
    assert decide(pod(3600), budget(AdmissionMode.OPEN, 0.0)) == SafeAdmission()


def test_a_pod_whose_commitment_fits_is_reserved_under_the_reviews_uid() -> None:
    timekeeper = Timekeeper()
    verdict = decide(pod(1200), budget(), reserve=timekeeper)  # 0.5 GPU x 1200 s = 10 GPU-minutes: exactly what is left
    assert verdict.short is None and verdict.refuse is None
    assert (verdict.admission_id, verdict.outcome) == (REVIEW, "reserved")
    assert timekeeper.asked == [Reservation(REVIEW, "ml", 10 * MINUTE)]


def test_a_pod_whose_commitment_does_not_fit_is_demoted_with_the_numbers() -> None:
    verdict = decide(pod(1201), budget())
    assert verdict.refuse is None and verdict.admission_id is None
    assert verdict.short == (
        "namespace 'ml' cannot cover this pod's deadline: the pod commits 10.01 GPU-minutes (0.5 GPU x weight 1 x 1201 "
        "s), "
        "and its budget has 10.00 left uncommitted (25.00 remaining, less 15.00 committed by running pods' deadlines)"
    )
    reserved = Timekeeper(answer=Grant(Outcome.SHORT, Uncommitted(MINUTE, "team.a", 25.0, 15.0, 9.0)))
    assert decide(pod(1201), budget(), reserve=reserved).short == (
        "namespace 'ml' cannot cover this pod's deadline: the pod commits 10.01 GPU-minutes (0.5 GPU x weight 1 x 1201 "
        "s), "
        "and the budget of team.a has 1.00 left uncommitted (25.00 remaining, less 15.00 committed by running pods' "
        "deadlines and 9.00 by pods being admitted)"
    )


def test_the_budgets_figures_go_only_to_a_caller_known_to_be_the_api_server() -> None:
    assert decide(pod(1201), budget(), disclose=False).short == (
        "namespace 'ml' cannot cover this pod's deadline: its budget has less left uncommitted than the pod commits")


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


@pytest.mark.parametrize("reason", ["the timekeeper's controller has not published the cluster's pods yet",
                                    "the timekeeper did not answer: no answer from 127.0.0.1:8080 within 2 s"])
def test_what_cannot_be_counted_is_refused_under_strict_and_admitted_saying_so_under_safe(reason: str) -> None:
    unknown = Timekeeper(answer=Grant(Outcome.UNKNOWN, reason=reason))
    safe = decide(pod(600), budget(), reserve=unknown)
    assert (safe.admission_id, safe.refuse, safe.outcome) == (None, None, "unchecked")
    assert safe.warnings == [f"namespace 'ml' has safe admission, and what its budgets have left uncommitted cannot be "
                             f"counted now ({reason}): the pod is admitted by the budget's state alone"]
    strict = decide(pod(600), budget(AdmissionMode.STRICT), reserve=unknown)
    assert strict.outcome == "uncountable" and strict.refuse == (
        f"namespace 'ml' has safe admission, and what its budgets have left uncommitted cannot be counted now "
        f"({reason}): "
        "its budget's admission is strict, so no GPU pod is admitted until it can be"
    )


def test_a_pod_claiming_another_pods_admission_id_is_refused() -> None:
    taken = Timekeeper(
        answer=Grant(Outcome.TAKEN, reason="the pod carries gpusharing.io/admission-id 'x', the admission of pod ml/a")
    )
    verdict = decide(pod(600, annotations={ANNOTATION_ADMISSION_ID: "x"}), budget(), reserve=taken)
    assert (verdict.refuse, verdict.outcome) == (
        "the pod carries gpusharing.io/admission-id 'x', the admission of pod ml/a",
        "refused",
    )
    assert taken.asked[0].replaces == "x"


def test_unlimited_budgets_commit_nothing() -> None:
    assert decide(pod(3600), budget(), reserve=Timekeeper(left=None)) == SafeAdmission()


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
    job = job_deadline(
        {
            "metadata": {"uid": "u"},
            "spec": {"activeDeadlineSeconds": 600},
            "status": {"startTime": "2026-11-23T11:55:00Z"},
        }
    )
    assert job == JobDeadline("u", 600, dt.datetime(2026, 11, 23, 11, 55, tzinfo=UTC))
    assert job.remaining_seconds(NOW) == 300
    assert job.remaining_seconds(NOW + dt.timedelta(hours=1)) == 1  # past its deadline: the Job controller ends it
    assert job_deadline({"metadata": {"uid": "u"}, "spec": {}, "status": {"startTime": "yesterday"}}) == JobDeadline(
        "u", None, None
    )


def test_a_reinvoked_webhook_replaces_the_reservation_its_earlier_review_made() -> None:
    timekeeper = Timekeeper()
    verdict = decide(pod(1200, annotations={ANNOTATION_ADMISSION_ID: "0b7d2f64-earlier"}), budget(), reserve=timekeeper)
    assert verdict.admission_id == REVIEW
    assert timekeeper.asked == [Reservation(REVIEW, "ml", 10 * MINUTE, replaces="0b7d2f64-earlier")]
    # An annotation that is no admission id replaces nothing.
    decide(pod(1200, annotations={ANNOTATION_ADMISSION_ID: "not/one"}), budget(), reserve=timekeeper)
    assert timekeeper.asked[-1].replaces is None


def test_the_listing_carries_the_namespaces_admission() -> None:
    states = states_from_listing({"items": [
        {"namespace": "ml", "state": "in-budget", "admission": "strict", "onShortfall": "refuse"},
        {"namespace": "old", "state": "in-budget"},  # a timekeeper from before safe admission
        {"namespace": "odd", "state": "in-budget", "admission": "reckless"},
    ]})
    assert (states.of("ml").admission, states.of("ml").on_shortfall) == (AdmissionMode.STRICT, Shortfall.REFUSE)
    assert states.of("old").admission is AdmissionMode.OPEN and states.of("odd").admission is AdmissionMode.OPEN


def test_a_namespace_over_budget_demotes_a_pod_with_a_deadline_and_strict_still_refuses_one_without() -> None:
    over = NamespaceBudget(BudgetState.OVER_BUDGET, (), AdmissionMode.STRICT, Shortfall.REFUSE)
    timekeeper = Timekeeper()
    decision = admit(
        parse_review(admission_review(pod(600))), WebhookConfig(), lambda _: over, mutate=True, reserve=timekeeper
    )
    assert decision.allowed and any("over its GPU budget" in w for w in decision.warnings)
    assert ANNOTATION_ADMISSION_ID not in json.dumps(decision.patch) and timekeeper.asked == []  # demoted anyway
    refused = admit(parse_review(admission_review(pod())), WebhookConfig(), lambda _: over, mutate=True)
    assert (
        not refused.allowed and refused.code == 403 and "admits only GPU pods with a deadline" in str(refused.message)
    )


def test_a_reinvoked_webhook_replaces_its_reservation_and_changes_nothing_else() -> None:
    """The pod the webhook patched, sent back (reinvocationPolicy: IfNeeded) in a review of its own uid."""
    timekeeper = Timekeeper(left=100 * MINUTE)

    def jobs(namespace: str, name: str, uid: str) -> JobDeadline:
        return JobDeadline(uid, 1800, dt.datetime.now(UTC) - dt.timedelta(seconds=600))

    strict = budget(AdmissionMode.STRICT)
    first_review = admission_review(pod(owner=JOB))
    first = admit(parse_review(first_review), WebhookConfig(), lambda _: strict, True, jobs=jobs, reserve=timekeeper)
    patched = jsonpatch.apply_patch(pod(owner=JOB), first.patch)
    assert 1190 <= patched["spec"]["activeDeadlineSeconds"] <= 1200
    assert patched["metadata"]["annotations"]["gpusharing.io/safe-admission"] == "reserved"
    assert patched["metadata"]["annotations"][ANNOTATION_ADMISSION_ID] == first_review["request"]["uid"]
    again_review = admission_review(patched)
    again = admit(parse_review(again_review), WebhookConfig(), lambda _: strict, True, jobs=jobs, reserve=timekeeper)
    assert again.allowed and again.patch == [{"op": "add", "path": "/metadata/annotations/gpusharing.io~1admission-id",
                                              "value": again_review["request"]["uid"]}]
    assert timekeeper.asked[1].replaces == first_review["request"]["uid"]


def test_the_reservation_is_asked_of_the_timekeeper_with_the_webhooks_token(timekeeper: FakeTimekeeper) -> None:
    reserve = TimekeeperReservations(timekeeper.url, lambda: "webhook-token", 2.0)
    timekeeper.reservation = (
        200,
        {
            "granted": False,
            "uncommitted": {
                "microGpuSeconds": MINUTE,
                "gpuMinutes": 1.0,
                "budget": "team.a",
                "remainingGpuMinutes": 5.0,
                "committedGpuMinutes": 3.0,
                "reservedGpuMinutes": 1.0,
            },
        },
    )
    grant = reserve(Reservation(REVIEW, "ml", 2 * MINUTE, "earlier", dry_run=True))
    assert grant == Grant(Outcome.SHORT, Uncommitted(MINUTE, "team.a", 5.0, 3.0, 1.0))
    assert timekeeper.bodies == [
        {"id": REVIEW, "namespace": "ml", "microGpuSeconds": 2 * MINUTE, "replaces": "earlier", "dryRun": True}
    ]
    assert timekeeper.authorizations == ["Bearer webhook-token"]
    timekeeper.reservation = (409, {"error": "the pod carries gpusharing.io/admission-id 'earlier', ..."})
    assert reserve(Reservation(REVIEW, "ml", MINUTE)) == Grant(
        Outcome.TAKEN, reason="the pod carries gpusharing.io/admission-id 'earlier', ..."
    )


@pytest.mark.parametrize(
    ("status", "answer", "reason"),
    [
        (
            503,
            {"error": "the timekeeper's controller has not published the cluster's pods yet"},
            "the timekeeper could not reserve (HTTP 503): the timekeeper's controller has not published the cluster's "
            "pods yet",
        ),
        (
            200,
            {"granted": "yes"},
            "the timekeeper's answer was not understood: expected an object with granted true or false",
        ),
    ],
)
def test_an_answer_that_is_not_a_grant_is_unknown(
    timekeeper: FakeTimekeeper, status: int, answer: Any, reason: str
) -> None:
    timekeeper.reservation = (status, answer)
    grant = TimekeeperReservations(timekeeper.url, lambda: None, 2.0)(Reservation(REVIEW, "ml", MINUTE))
    assert grant == Grant(Outcome.UNKNOWN, reason=reason)


def test_a_slow_or_absent_timekeeper_is_waited_for_briefly(timekeeper: FakeTimekeeper) -> None:
    timekeeper.delay = 1.0
    grant = TimekeeperReservations(timekeeper.url, lambda: None, 0.2)(Reservation(REVIEW, "ml", MINUTE))
    assert grant.outcome is Outcome.UNKNOWN and grant.reason.endswith("within 0.2 s")
    absent = TimekeeperReservations("http://127.0.0.1:9", lambda: None, 0.2)(Reservation(REVIEW, "ml", MINUTE))
    assert absent.outcome is Outcome.UNKNOWN and "connection refused by 127.0.0.1:9" in absent.reason
