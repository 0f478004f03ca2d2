"""AdmissionReviews over `POST /mutate` and `POST /validate`: read within bounds, decided by the admission policy,
answered, counted and logged."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request

from gpusharing.decoded import as_mapping
from gpusharing.gpu.dra import ClaimLookup
from gpusharing.messages import shortened
from gpusharing.serving.jsonbody import JsonBodyError, read_json
from gpusharing.serving.server import release_memory
from webhook import metrics
from webhook.admission.policy import admit
from webhook.admission.review import AdmissionRequest, BadReview, Decision, parse_review, review_response
from webhook.api.callers import Callers, Refused
from webhook.caches.budgets import BudgetStateCache
from webhook.caches.jobs import JobLookup
from webhook.caches.priorities import PriorityLookup
from webhook.caches.reservations import Reserve
from webhook.config import WebhookConfig

log = logging.getLogger(__name__)

# A pod is at most 1.5 MiB once stored (etcd's request limit): an UPDATE's review, which holds the pod twice, fits
# in 3 MiB with room to spare, and a larger CREATE could not be stored anyway. Reading a body costs about a second
# of CPU per 8 MiB of hostile JSON (millions of tiny objects), so the bound is also a bound on time and memory.
MAX_REVIEW_BYTES = 3 * 1024 * 1024
# JSON makes up to thirty times its size in Python objects; bodies above this are read one at a time per worker,
# so that a worker holds the objects of one large body at most, whatever number of them arrive together.
LARGE_REVIEW_BYTES = 256 * 1024
REVIEWER = "gpusharing.reviewer"  # the app.extensions key of the process's Reviewer


@dataclass
class Reviewer:
    """What a review is decided with: the settings and the caches, and safe admission's reservations (the one call
    a review may make, for a GPU pod with a deadline under safe or strict admission)."""

    config: WebhookConfig
    callers: Callers
    budgets: BudgetStateCache
    claims: ClaimLookup
    jobs: JobLookup
    reserve: Reserve
    large_reviews: threading.Lock
    priorities: PriorityLookup


blueprint = Blueprint("reviews", __name__)


@blueprint.post("/mutate")
def mutate() -> tuple[Response, int]:
    return _review("mutate", mutate=True)


@blueprint.post("/validate")
def validate() -> tuple[Response, int]:
    return _review("validate", mutate=False)


def _review(endpoint: str, mutate: bool) -> tuple[Response, int]:
    started = time.perf_counter()
    reviewer: Reviewer = current_app.extensions[REVIEWER]
    try:  # before the body is read: a stranger's costs nothing
        caller = reviewer.callers.caller(request.environ, request.headers.get("Authorization"))
    except Refused as refused:
        metrics.REFUSED_CALLERS.labels(endpoint, str(refused.status)).inc()
        log.warning("refused a review on /%s from %s: %s", endpoint, request.remote_addr, refused,
                    extra={"endpoint": endpoint, "decision": "refused-caller"})
        return jsonify(error=str(refused)), refused.status
    body = request.get_data(cache=False)
    if len(body) <= LARGE_REVIEW_BYTES:
        return _answer(reviewer, endpoint, mutate, body, started, caller.authenticated)
    with reviewer.large_reviews:
        try:
            return _answer(reviewer, endpoint, mutate, body, started, caller.authenticated)
        finally:
            release_memory()


def _answer(
    reviewer: Reviewer, endpoint: str, mutate: bool, body: bytes, started: float, disclose: bool
) -> tuple[Response, int]:
    try:
        admission = parse_review(read_json(body))
    except (BadReview, JsonBodyError) as exc:
        metrics.BAD_REVIEWS.labels(endpoint).inc()
        log.warning("refused a body on /%s that is not an AdmissionReview: %s", endpoint, exc,
                    extra={"endpoint": endpoint, "decision": "bad-review"})
        return jsonify(error=f"not an AdmissionReview: {exc}"), 400
    fields = {
        "request_id": shortened(admission.uid),
        "namespace": shortened(admission.namespace),
        "pod": _pod_name(admission.object),
        "operation": admission.operation,
        "endpoint": endpoint,
    }
    budgets = reviewer.budgets
    try:
        decision = admit(
            admission,
            reviewer.config,
            budgets.budget_of,
            mutate,
            reviewer.claims,
            reviewer.jobs,
            reviewer.reserve,
            disclose,
            reviewer.priorities,
            budgets.fair_share(),
        )
    except Exception:  # a bug must not become a 500 the API server shows as a cryptic failure
        log.exception("could not decide on %s %s", admission.operation, shortened(admission.uid), extra=fields)
        decision = Decision.deny(400, "the GPU-sharing webhook could not read this pod; see the webhook's log")
    if decision.allowed and decision.fair_share_gpus is not None and not admission.dry_run:
        budgets.admitted.add(admission.uid, admission.namespace, decision.fair_share_gpus)
    outcome = "allowed" if decision.allowed else "denied"
    metrics.ADMISSIONS.labels(endpoint, admission.operation, outcome, decision.dialect).inc()
    if decision.safe_admission is not None:
        metrics.SAFE_ADMISSIONS.labels(decision.safe_admission).inc()
    if decision.unresolved_priority_class is not None:
        metrics.UNRESOLVED_PRIORITIES.labels(decision.unresolved_priority_class).inc()
    fields.update(decision=outcome, dialect=decision.dialect)
    _log_decision(reviewer, admission, decision, fields)
    metrics.LATENCY.labels(endpoint).observe(time.perf_counter() - started)
    # Compact and in the order built: Flask's jsonify sorts every object's keys, a tenth of writing the answer.
    answer = json.dumps(review_response(admission, decision), separators=(",", ":"))
    return Response(answer, mimetype="application/json"), 200


def _log_decision(reviewer: Reviewer, admission: AdmissionRequest, decision: Decision, fields: dict[str, Any]) -> None:
    if not decision.allowed:
        log.info(
            "denied %s of pod %s/%s: %s",
            admission.operation,
            fields["namespace"],
            fields["pod"],
            decision.message,
            extra=fields,
        )
    elif decision.warnings:  # demoted (its namespace is over budget), or near its budget
        demoted = reviewer.budgets.state_of(admission.namespace).demoted or decision.safe_admission == "demoted"
        log.info("admitted pod %s/%s%s: %s", fields["namespace"], fields["pod"], " demoted" if demoted else "",
                 "; ".join(decision.warnings), extra=fields)
    elif decision.patch:
        log.debug("admitted pod %s/%s (%s)", fields["namespace"], fields["pod"], decision.dialect, extra=fields)


def _pod_name(pod: dict[str, Any] | None) -> str:
    """The pod's name for a log line, whatever its metadata holds (the pod is being denied: it may be anything)."""
    metadata = as_mapping(as_mapping(pod).get("metadata"))
    name = metadata.get("name") or metadata.get("generateName")
    return shortened(name) if isinstance(name, str) else "?"
