"""Who may send the webhook reviews: the API server alone, when its client authentication is configured (an
AdmissionConfiguration with a kubeconfig for the webhook: a client certificate, or a token); else anyone who reaches
it, answered without the figures of any namespace's budget.

A client certificate is verified by the TLS layer against GPUSHARING_CLIENT_CA_FILE (gpusharing.serving.server asks
for one on every connection, so that probes without one still connect); a bearer token is verified by TokenReview
for the audience gpusharing-webhook and must belong to one of GPUSHARING_CLIENT_TOKEN_USERS.
"""

from __future__ import annotations

import hashlib
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from gpusharing.caching import TtlCache
from gpusharing.contract import WEBHOOK_TOKEN_AUDIENCE

REVIEW_CACHE_SECONDS = 60.0

TokenReview = Callable[[str], str | None]  # a bearer token's username, or None when it is not authenticated


class Refused(Exception):
    """The caller may not send reviews: 401 (no credentials the webhook accepts) or 403 (not the API server)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Caller:
    authenticated: bool  # the API server, proven; False: anyone (no client authentication is configured)


ANYONE = Caller(authenticated=False)  # made once: the answer of every review
API_SERVER = Caller(authenticated=True)


class Callers:
    """Who may send reviews, as configured: client certificates, bearer tokens of `token_users` (TokenReview, its
    answers reused for a while), or anyone when neither is required."""

    def __init__(
        self, certificates: bool = False, token_users: frozenset[str] = frozenset(), review: TokenReview | None = None
    ):
        if token_users and review is None:
            raise ValueError("token users need a TokenReview")
        self.certificates = certificates
        self.token_users = token_users
        self._review = review
        self._reviews: TtlCache[bytes, str | None] = TtlCache(REVIEW_CACHE_SECONDS)

    @property
    def required(self) -> bool:
        return self.certificates or bool(self.token_users)

    def caller(self, environ: Mapping[str, Any], authorization: str | None) -> Caller:
        """The caller of a request (its WSGI environ and Authorization header); Refused when it may not send reviews."""
        if not self.required:
            return ANYONE
        if self.certificates and _verified_certificate(environ):
            return API_SERVER
        scheme, _, token = (authorization or "").partition(" ")
        if self.token_users and scheme.lower() == "bearer" and token.strip():
            review = self._review
            assert review is not None
            try:
                user = self._reviews.get(hashlib.sha256(token.strip().encode()).digest(), lambda: review(token.strip()))
            except Exception as exc:  # the API server could not answer: the caller is neither known nor refused
                raise Refused(
                    503, f"the caller's token cannot be verified now (TokenReview): {type(exc).__name__}"
                ) from None
            if user is None:
                raise Refused(
                    401,
                    "the bearer token was not authenticated by the Kubernetes API (TokenReview, audience "
                    "gpusharing-webhook)",
                )
            if user not in self.token_users:
                raise Refused(
                    403,
                    f"{user} may not send admission reviews: only the API server may (GPUSHARING_CLIENT_TOKEN_USERS)",
                )
            return API_SERVER
        ways = " or ".join(way for way, on in (("a client certificate of the API server", self.certificates),
                                              ("the API server's bearer token", bool(self.token_users))) if on)
        raise Refused(401, f"the GPU-sharing webhook answers only the API server: present {ways}")


def _verified_certificate(environ: Mapping[str, Any]) -> bool:
    """Whether the connection presented a client certificate the TLS layer verified (against the client CA)."""
    sock = environ.get("gunicorn.socket")
    return isinstance(sock, ssl.SSLSocket) and bool(sock.getpeercert())


def token_review(api_client: client.ApiClient) -> TokenReview:
    """TokenReview of the Kubernetes API for the webhook's audience: a token's username, or None."""
    api = client.AuthenticationV1Api(api_client)

    def review(token: str) -> str | None:
        spec = client.V1TokenReviewSpec(token=token, audiences=[WEBHOOK_TOKEN_AUDIENCE])
        status = api.create_token_review(client.V1TokenReview(spec=spec)).status
        if status is None or not status.authenticated or status.user is None:
            return None
        if status.audiences is not None and WEBHOOK_TOKEN_AUDIENCE not in status.audiences:
            return None
        return str(status.user.username or "") or None

    return review
