"""The webhook's app factory: it builds the caches a review is decided with and registers the API (webhook.api)."""

from __future__ import annotations

import logging
import threading
from typing import NamedTuple

from flask import Flask

from gpusharing.gpu.dra import ClaimLookup, ClaimSource, ClaimSpec, ClaimUnknown, no_claims
from gpusharing.kube.client import api_client, in_cluster_available
from gpusharing.serving.server import ON_STOP
from gpusharing.settings.env import ConfigError
from webhook import metrics
from webhook.api import register_api
from webhook.api.callers import Callers, token_review
from webhook.api.reviews import REVIEWER, Reviewer, ReviewRoutes
from webhook.caches.budgets import BudgetStateCache, read_token
from webhook.caches.claims import ClaimIndex
from webhook.caches.jobs import JobIndex, JobLookup, no_jobs
from webhook.caches.priorities import PriorityClassIndex, PriorityLookup, no_priorities
from webhook.caches.reservations import Reserve, TimekeeperReservations, no_timekeeper
from webhook.config import WebhookConfig

log = logging.getLogger(__name__)


def create_app(
    config: WebhookConfig | None = None, budgets: BudgetStateCache | None = None, claims: ClaimLookup | None = None,
    jobs: JobLookup | None = None, callers: Callers | None = None, priorities: PriorityLookup | None = None,
) -> Flask:
    """The app; `budgets` defaults to a poller of the timekeeper, `claims`, `jobs` and `priorities` to watches of the
    cluster, `callers` to the client authentication the settings ask for; safe admission reserves with the
    timekeeper."""
    config = config or WebhookConfig.from_env()
    if budgets is None:
        budgets = BudgetStateCache(
            config.timekeeper_url,
            config.timekeeper_token_file,
            config.budget_refresh_seconds,
            metrics.record_budget_refresh,
        )
        budgets.start()
    if claims is None or jobs is None or priorities is None:
        watched = watched_indexes(config.kubeconfig)
        claims, jobs, priorities = claims or watched.claims, jobs or watched.jobs, priorities or watched.priorities
    app = Flask("webhook")
    reserve: Reserve = no_timekeeper
    if config.timekeeper_url:
        token_file = config.timekeeper_token_file
        reserve = TimekeeperReservations(
            config.timekeeper_url, lambda: read_token(token_file), config.reservation_timeout_seconds
        )
    reviewer = Reviewer(config, callers or configured_callers(config), budgets, claims, jobs, reserve, threading.Lock(),
                        priorities)
    app.extensions[REVIEWER] = reviewer
    # Reviews are answered ahead of Flask's per-request machinery, half their CPU (webhook.api.reviews).
    app.wsgi_app = ReviewRoutes(app.wsgi_app, reviewer)  # type: ignore[method-assign]
    # A stopping worker ends its poller first, so no line of it is cut off by the exit (or written unformatted).
    app.extensions[ON_STOP] = [budgets.stop]
    register_api(app)
    return app


def configured_callers(config: WebhookConfig) -> Callers:
    """Who may send reviews, as GPUSHARING_CLIENT_CA_FILE and GPUSHARING_CLIENT_TOKEN_USERS say (tokens are verified
    with the Kubernetes API's TokenReview)."""
    review = token_review(api_client(config.kubeconfig, "GPUSHARING_KUBECONFIG")) if config.client_token_users else None
    return Callers(bool(config.client_ca_file), config.client_token_users, review)


class Watched(NamedTuple):
    claims: ClaimLookup
    jobs: JobLookup
    priorities: PriorityLookup


def watched_indexes(kubeconfig: str | None) -> Watched:
    """The lookups of resource claims, of Jobs' deadlines and of PriorityClasses: indexes fed by watches when the
    Kubernetes API can be reached (KUBECONFIG or in-cluster); else claims are all refused, saying why, and no Job
    and no PriorityClass is known (the API server's Priority plugin resolves the classes the webhook gives)."""
    if not kubeconfig and not in_cluster_available():
        return Watched(no_claims, no_jobs, no_priorities)
    try:
        kube = api_client(kubeconfig, "GPUSHARING_KUBECONFIG")
    except ConfigError as exc:
        if kubeconfig:
            raise
        log.error("resource claims and Jobs are not read, so pods that claim devices are refused: %s", exc)
        return Watched(_unreadable(f"the webhook cannot read resource claims: {exc}"), no_jobs, no_priorities)
    claims = ClaimIndex(kube, metrics.record_claim_sync)
    claims.start()
    jobs = JobIndex(kube, metrics.record_job_sync)
    jobs.start()
    priorities = PriorityClassIndex(kube, metrics.record_priority_class_sync)
    priorities.start()
    return Watched(claims.lookup, jobs.lookup, priorities.lookup)


def _unreadable(reason: str) -> ClaimLookup:
    def lookup(source: ClaimSource, namespace: str, name: str) -> ClaimSpec:
        raise ClaimUnknown(reason)

    return lookup

