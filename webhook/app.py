"""The webhook's HTTP layer: AdmissionReview over POST /mutate and /validate, health and metrics."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from gpusharing.dra import ClaimLookup, ClaimSource, ClaimSpec, ClaimUnknown, no_claims
from gpusharing.env import ConfigError
from gpusharing.jsonbody import JsonBodyError, read_json
from gpusharing.kube import api_client, in_cluster_available
from gpusharing.messages import shortened
from gpusharing.metrics import render_metrics
from gpusharing.request import as_mapping
from gpusharing.serving import ON_STOP, release_memory
from webhook import metrics
from webhook.admission import BadReview, Decision, parse_review, review_response
from webhook.budget import BudgetStateCache
from webhook.claims import ClaimIndex
from webhook.config import WebhookConfig
from webhook.jobs import JobIndex, JobLookup, no_jobs
from webhook.reservations import Reservations
from webhook.policy import admit

log = logging.getLogger(__name__)

# A pod is at most 1.5 MiB once stored (etcd's request limit): an UPDATE's review, which holds the pod twice, fits
# in 3 MiB with room to spare, and a larger CREATE could not be stored anyway. Reading a body costs about a second
# of CPU per 8 MiB of hostile JSON (millions of tiny objects), so the bound is also a bound on time and memory.
MAX_REVIEW_BYTES = 3 * 1024 * 1024
# JSON makes up to thirty times its size in Python objects; bodies above this are read one at a time per worker,
# so that a worker holds the objects of one large body at most, whatever number of them arrive together.
LARGE_REVIEW_BYTES = 256 * 1024


def create_app(
    config: WebhookConfig | None = None, budgets: BudgetStateCache | None = None, claims: ClaimLookup | None = None,
    jobs: JobLookup | None = None,
) -> Flask:
    config = config or WebhookConfig.from_env()
    if budgets is None:
        budgets = BudgetStateCache(
            config.timekeeper_url, config.timekeeper_token_file, config.budget_refresh_seconds, metrics.record_budget_refresh,
            Reservations(config.admission_slices, config.reservation_seconds),
        )
        budgets.start()
    if claims is None or jobs is None:
        watched = watched_indexes(config.kubeconfig)
        claims, jobs = claims or watched[0], jobs or watched[1]
    app = Flask("webhook")
    app.config["GPUSHARING"] = config
    app.config["MAX_CONTENT_LENGTH"] = MAX_REVIEW_BYTES
    app.extensions["budgets"] = budgets
    app.extensions["claims"] = claims
    # A stopping worker ends its poller first, so no line of it is cut off by the exit (or written unformatted).
    app.extensions[ON_STOP] = [budgets.stop]
    large_reviews = threading.Lock()

    def review(endpoint: str, mutate: bool) -> tuple[Response, int]:
        started = time.perf_counter()
        body = request.get_data(cache=False)
        if len(body) <= LARGE_REVIEW_BYTES:
            return answer(endpoint, mutate, body, started)
        with large_reviews:
            try:
                return answer(endpoint, mutate, body, started)
            finally:
                release_memory()

    def answer(endpoint: str, mutate: bool, body: bytes, started: float) -> tuple[Response, int]:
        try:
            admission = parse_review(read_json(body))
        except (BadReview, JsonBodyError) as exc:
            metrics.BAD_REVIEWS.labels(endpoint).inc()
            log.warning("refused a body on /%s that is not an AdmissionReview: %s", endpoint, exc,
                        extra={"endpoint": endpoint, "decision": "bad-review"})
            return jsonify(error=f"not an AdmissionReview: {exc}"), 400
        fields = {"request_id": shortened(admission.uid), "namespace": shortened(admission.namespace), "pod": _pod_name(admission.object),
                  "operation": admission.operation, "endpoint": endpoint}
        try:
            decision = admit(admission, config, budgets.budget_of, mutate, claims, jobs, budgets.reserve)
        except Exception:  # a bug must not become a 500 the API server shows as a cryptic failure
            log.exception("could not decide on %s %s", admission.operation, shortened(admission.uid), extra=fields)
            decision = Decision.deny(400, "the GPU-sharing webhook could not read this pod; see the webhook's log")
        outcome = "allowed" if decision.allowed else "denied"
        metrics.ADMISSIONS.labels(endpoint, admission.operation, outcome, decision.dialect).inc()
        if decision.safe_admission is not None:
            metrics.SAFE_ADMISSIONS.labels(decision.safe_admission).inc()
        fields.update(decision=outcome, dialect=decision.dialect)
        if not decision.allowed:
            log.info("denied %s of pod %s/%s: %s", admission.operation, fields["namespace"], fields["pod"], decision.message,
                     extra=fields)
        elif decision.warnings:  # demoted (its namespace is over budget), or near its budget
            log.info("admitted pod %s/%s%s: %s", fields["namespace"], fields["pod"],
                     " demoted" if budgets.state_of(admission.namespace).demoted or decision.safe_admission == "demoted" else "", "; ".join(decision.warnings), extra=fields)
        elif decision.patch:
            log.debug("admitted pod %s/%s (%s)", fields["namespace"], fields["pod"], decision.dialect, extra=fields)
        metrics.LATENCY.labels(endpoint).observe(time.perf_counter() - started)
        return jsonify(review_response(admission, decision)), 200

    @app.post("/mutate")
    def mutate() -> tuple[Response, int]:
        return review("mutate", mutate=True)

    @app.post("/validate")
    def validate() -> tuple[Response, int]:
        return review("validate", mutate=False)

    @app.get("/livez")
    def livez() -> tuple[Response, int]:
        return jsonify(status="ok"), 200

    @app.get("/readyz")
    def readyz() -> tuple[Response, int]:
        # Ready without the timekeeper: budget states are a cache, and unknown namespaces are admitted in budget.
        return jsonify(status="ok"), 200

    @app.get("/metrics")
    def prometheus() -> Response:
        body, content_type = render_metrics()
        return Response(body, content_type=content_type)

    @app.errorhandler(RequestEntityTooLarge)
    def too_large(exc: RequestEntityTooLarge) -> tuple[Response, int]:
        return jsonify(error=f"not an AdmissionReview: the body is larger than the {MAX_REVIEW_BYTES} bytes the webhook reads"), 413

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> tuple[Response, int]:
        return jsonify(error=exc.description), exc.code or 500

    return app


def watched_indexes(kubeconfig: str | None) -> tuple[ClaimLookup, JobLookup]:
    """The lookups of resource claims and of Jobs' deadlines: indexes fed by watches when the Kubernetes API can be
    reached (KUBECONFIG or in-cluster); else claims are all refused, saying why, and no Job is known."""
    if not kubeconfig and not in_cluster_available():
        return no_claims, no_jobs
    try:
        kube = api_client(kubeconfig, "GPUSHARING_KUBECONFIG")
    except ConfigError as exc:
        if kubeconfig:
            raise
        log.error("resource claims and Jobs are not read, so pods that claim devices are refused: %s", exc)
        return _unreadable(f"the webhook cannot read resource claims: {exc}"), no_jobs
    claims = ClaimIndex(kube, metrics.record_claim_sync)
    claims.start()
    jobs = JobIndex(kube, metrics.record_job_sync)
    jobs.start()
    return claims.lookup, jobs.lookup


def _unreadable(reason: str) -> ClaimLookup:
    def lookup(source: ClaimSource, namespace: str, name: str) -> ClaimSpec:
        raise ClaimUnknown(reason)

    return lookup


def _pod_name(pod: dict[str, Any] | None) -> str:
    """The pod's name for a log line, whatever its metadata holds (the pod is being denied: it may be anything)."""
    metadata = as_mapping(as_mapping(pod).get("metadata"))
    name = metadata.get("name") or metadata.get("generateName")
    return shortened(name) if isinstance(name, str) else "?"
