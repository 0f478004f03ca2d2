"""AdmissionReviews over `POST /mutate` and `POST /validate`: read within bounds, decided by the admission policy,
answered, counted and logged.

A review is served ahead of Flask (`ReviewRoutes`, which `create_app` puts in front of the app): Flask's request and
response objects, context and URL matching were half of a review's CPU, as much as the webhook's own work
(docs/development.md, the webhook's load). Flask still serves what is rare: a review without a Content-Length, one
over the bound (413), another method (405), and every other path.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flask import Blueprint, Response, current_app, request
from werkzeug.exceptions import InternalServerError
from werkzeug.http import HTTP_STATUS_CODES

from gpusharing.decoded import as_mapping
from gpusharing.gpu.dra import ClaimLookup
from gpusharing.messages import shortened
from gpusharing.serving.jsonbody import JsonBodyError, read_json
from gpusharing.serving.server import release_memory, stated_length
from webhook import metrics
from webhook.admission.policy import admit
from webhook.admission.review import AdmissionRequest, BadReview, Decision, encoded_response, parse_review
from webhook.api.callers import Callers, Refused
from webhook.caches.budgets import BudgetStateCache
from webhook.caches.jobs import JobLookup
from webhook.caches.priorities import PriorityLookup
from webhook.caches.reservations import Reserve
from webhook.config import WebhookConfig

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

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


# The review paths, each with its endpoint's name (metrics, logs) and whether it mutates.
REVIEW_PATHS = {"/mutate": ("mutate", True), "/validate": ("validate", False)}
JSON_HEADER = ("Content-Type", "application/json")


class ReviewRoutes:
    """WSGI: `POST /mutate` and `POST /validate` with a Content-Length within the bound, answered here; any other
    request goes to `app` (the Flask app's own WSGI callable)."""

    def __init__(self, app: WSGIApplication, reviewer: Reviewer):
        self.app = app
        self.reviewer = reviewer

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        route = REVIEW_PATHS.get(environ.get("PATH_INFO", ""))
        length = None if route is None else stated_length(environ, MAX_REVIEW_BYTES)
        if route is None or length is None or environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        endpoint, mutate = route
        stream = environ["wsgi.input"]
        try:
            status, answer = review(self.reviewer, endpoint, mutate, environ, lambda: stream.read(length))
        except Exception:  # a bug: logged and answered as Flask did (webhook.api's handler of HTTP errors)
            log.exception("Exception on %s [POST]", environ.get("PATH_INFO"))
            status, answer = 500, _error(InternalServerError.description)
        start_response(_status_line(status), [JSON_HEADER, ("Content-Length", str(len(answer)))])
        return [answer]


def _status_line(status: int) -> str:
    return f"{status} {HTTP_STATUS_CODES[status].upper()}"  # as Werkzeug writes it


blueprint = Blueprint("reviews", __name__)


@blueprint.post("/mutate")
def mutate() -> Response:
    return _flask_review("mutate", mutate=True)


@blueprint.post("/validate")
def validate() -> Response:
    return _flask_review("validate", mutate=False)


def _flask_review(endpoint: str, mutate: bool) -> Response:
    """What ReviewRoutes leaves to Flask: a body of no stated length, or too long (Flask's 413 when it is read)."""
    reviewer: Reviewer = current_app.extensions[REVIEWER]
    status, answer = review(reviewer, endpoint, mutate, request.environ, lambda: request.get_data(cache=False))
    return Response(answer, status=status, mimetype="application/json")


def review(
    reviewer: Reviewer, endpoint: str, mutate: bool, environ: Mapping[str, Any], read_body: Callable[[], bytes]
) -> tuple[int, bytes]:
    """One review: the HTTP status and the answer's body. `read_body` is called once the caller is known."""
    started = time.perf_counter()
    try:  # before the body is read: a stranger's costs nothing
        caller = reviewer.callers.caller(environ, environ.get("HTTP_AUTHORIZATION"))
    except Refused as refused:
        metrics.REFUSED_CALLERS.labels(endpoint, str(refused.status)).inc()
        log.warning("refused a review on /%s from %s: %s", endpoint, environ.get("REMOTE_ADDR"), refused,
                    extra={"endpoint": endpoint, "decision": "refused-caller"})
        return refused.status, _error(str(refused))
    body = read_body()
    if len(body) <= LARGE_REVIEW_BYTES:
        return _answer(reviewer, endpoint, mutate, body, started, caller.authenticated)
    with reviewer.large_reviews:
        try:
            return _answer(reviewer, endpoint, mutate, body, started, caller.authenticated)
        finally:
            release_memory()


def _error(message: str) -> bytes:
    """An error's body, as Flask's jsonify writes it."""
    return (json.dumps({"error": message}, separators=(",", ":")) + "\n").encode()


def _answer(
    reviewer: Reviewer, endpoint: str, mutate: bool, body: bytes, started: float, disclose: bool
) -> tuple[int, bytes]:
    try:
        admission = parse_review(read_json(body))
    except (BadReview, JsonBodyError) as exc:
        metrics.BAD_REVIEWS.labels(endpoint).inc()
        log.warning("refused a body on /%s that is not an AdmissionReview: %s", endpoint, exc,
                    extra={"endpoint": endpoint, "decision": "bad-review"})
        return 400, _error(f"not an AdmissionReview: {exc}")
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
        log.exception("could not decide on %s %s", admission.operation, shortened(admission.uid),
                      extra=_fields(admission, endpoint))
        decision = Decision.deny(400, "the GPU-sharing webhook could not read this pod; see the webhook's log")
    if decision.allowed and decision.fair_share_gpus is not None and not admission.dry_run:
        budgets.admitted.add(admission.uid, admission.namespace, decision.fair_share_gpus)
    outcome = "allowed" if decision.allowed else "denied"
    metrics.series(metrics.ADMISSIONS, endpoint, admission.operation, outcome, decision.dialect).inc()
    if decision.safe_admission is not None:
        metrics.series(metrics.SAFE_ADMISSIONS, decision.safe_admission).inc()
    if decision.unresolved_priority_class is not None:
        metrics.series(metrics.UNRESOLVED_PRIORITIES, decision.unresolved_priority_class).inc()
    _log_decision(reviewer, admission, decision, endpoint, outcome)
    metrics.series(metrics.LATENCY, endpoint).observe(time.perf_counter() - started)
    return 200, encoded_response(admission, decision)


def _fields(admission: AdmissionRequest, endpoint: str, **more: str) -> dict[str, Any]:
    """A review's fields in its log line: made only for a line that is written (cutting names short costs)."""
    return {
        "request_id": shortened(admission.uid),
        "namespace": shortened(admission.namespace),
        "pod": _pod_name(admission.object),
        "operation": admission.operation,
        "endpoint": endpoint,
        **more,
    }


def _log_decision(
    reviewer: Reviewer, admission: AdmissionRequest, decision: Decision, endpoint: str, outcome: str
) -> None:
    if not decision.allowed:
        fields = _fields(admission, endpoint, decision=outcome, dialect=decision.dialect)
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
        fields = _fields(admission, endpoint, decision=outcome, dialect=decision.dialect)
        log.info("admitted pod %s/%s%s: %s", fields["namespace"], fields["pod"], " demoted" if demoted else "",
                 "; ".join(decision.warnings), extra=fields)
    elif decision.patch and log.isEnabledFor(logging.DEBUG):
        fields = _fields(admission, endpoint, decision=outcome, dialect=decision.dialect)
        log.debug("admitted pod %s/%s (%s)", fields["namespace"], fields["pod"], decision.dialect, extra=fields)


def _pod_name(pod: dict[str, Any] | None) -> str:
    """The pod's name for a log line, whatever its metadata holds (the pod is being denied: it may be anything)."""
    metadata = as_mapping(as_mapping(pod).get("metadata"))
    name = metadata.get("name") or metadata.get("generateName")
    return shortened(name) if isinstance(name, str) else "?"
