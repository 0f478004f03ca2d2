"""Who may do what: meters report for their own pod, anyone authenticated reads, admins change budgets.

Modes (TIMEKEEPER_AUTH):
- tokenreview: bearer tokens are verified with the Kubernetes TokenReview API (audience gpusharing-timekeeper).
  A pod-bound ServiceAccount token may report for that pod only; budget writes need a SubjectAccessReview
  allowing verb `update` on resource `budgets` in API group `gpusharing.io`. Tokens in
  TIMEKEEPER_STATIC_TOKENS_FILE, when set, are accepted too.
- static: only the tokens in TIMEKEEPER_STATIC_TOKENS_FILE: `TOKEN ROLE [NAME]` per line, role admin, reader
  or meter. A meter token may report for any pod (docker-compose has no pod identity to check).
- none: every request is an admin's; for a local demo only.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

from gpusharing.contract import ANNOTATION_GPU_MEMORY, ANNOTATION_GPU_SHARE
from gpusharing.env import ConfigError
from gpusharing.report import MeterReport
from timekeeper.accounting import ReportTerms
from timekeeper.kube import Identity, KubeApi

ADMIN_VERB = "update"
ADMIN_RESOURCE = "budgets"
ADMIN_GROUP = "gpusharing.io"

T = TypeVar("T")


class Role(StrEnum):
    ADMIN = "admin"
    READER = "reader"
    METER = "meter"


class Unauthenticated(Exception):
    """401: no credentials, or credentials nobody vouches for."""


class Forbidden(Exception):
    """403: authenticated, but not allowed this."""


@dataclass(frozen=True)
class Caller:
    name: str  # recorded in the audit log
    role: Role | None = None  # a static token's role; None for a TokenReview identity
    identity: Identity | None = None


def load_static_tokens(path: str) -> dict[str, Caller]:
    """token -> caller from a `TOKEN ROLE [NAME]` file; ConfigError naming the file and line when malformed."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"TIMEKEEPER_STATIC_TOKENS_FILE={path}: cannot read it: {exc.strerror}") from None
    tokens: dict[str, Caller] = {}
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) not in (2, 3) or words[1] not in tuple(Role):
            raise ConfigError(
                f"TIMEKEEPER_STATIC_TOKENS_FILE={path} line {number}: expected `TOKEN ROLE [NAME]` with ROLE one of "
                f"{', '.join(Role)}"
            )
        role = Role(words[1])
        tokens[words[0]] = Caller(words[2] if len(words) == 3 else f"static-{role}-line-{number}", role)
    return tokens


class _TimedCache:
    """Answers of the API server reused for a while, so that a report every 30 s per pod costs no API call."""

    def __init__(self, seconds: float, max_entries: int = 50_000):
        self._seconds = seconds
        self._max = max_entries
        self._entries: dict[object, tuple[float, object]] = {}
        self._lock = threading.Lock()

    def get(self, key: object, compute: Callable[[], T]) -> T:
        now = time.monotonic()
        hit = self._entries.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]  # type: ignore[return-value]
        value = compute()
        with self._lock:
            if len(self._entries) >= self._max:
                self._entries.clear()
            self._entries[key] = (now + self._seconds, value)
        return value


class Authenticator:
    def __init__(self, mode: str, static_tokens: dict[str, Caller], kube: KubeApi | None, cache_seconds: float = 60.0):
        if mode == "tokenreview" and kube is None:
            raise ConfigError("TIMEKEEPER_AUTH=tokenreview needs the Kubernetes API (in a cluster, or KUBECONFIG or TIMEKEEPER_KUBECONFIG)")
        self.mode = mode
        self._static = static_tokens
        self._kube = kube
        self._reviews = _TimedCache(cache_seconds)
        self._grants = _TimedCache(cache_seconds)
        # A pod's annotations under gpusharing.io/ cannot change (the webhook refuses it), so they are read once.
        self._pod_terms = _TimedCache(float("inf"))

    def caller(self, authorization: str | None) -> Caller:
        if self.mode == "none":
            return Caller("anonymous", Role.ADMIN)
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("a bearer token is required (Authorization: Bearer TOKEN)")
        static = self._static.get(token)
        if static is not None:
            return static
        if self.mode == "static" or self._kube is None:
            raise Unauthenticated("the bearer token is not known to the timekeeper")
        kube = self._kube
        identity = self._reviews.get(hashlib.sha256(token.encode()).digest(), lambda: kube.review_token(token))
        if identity is None:
            raise Unauthenticated("the bearer token was not authenticated by the Kubernetes API (TokenReview)")
        return Caller(identity.username, identity=identity)

    def check_admin(self, caller: Caller) -> None:
        if caller.role is Role.ADMIN:
            return
        identity, kube = caller.identity, self._kube
        if identity is not None and kube is not None:
            key = (identity.username, identity.groups)
            if self._grants.get(key, lambda: kube.may(identity, ADMIN_VERB, ADMIN_RESOURCE, ADMIN_GROUP)):
                return
        raise Forbidden(
            f"{caller.name} may not change budgets: an admin needs verb {ADMIN_VERB!r} on resource "
            f"{ADMIN_RESOURCE!r} in API group {ADMIN_GROUP!r}"
        )

    def report_terms(self, caller: Caller, report: MeterReport) -> ReportTerms | None:
        """Checks that `caller` may send `report`; returns what to trust about the pod (None: the report itself)."""
        if caller.role in (Role.ADMIN, Role.METER):
            return None
        identity = caller.identity
        if identity is None:
            raise Forbidden(f"{caller.name} may not send meter reports")
        if identity.pod_uid is None or identity.pod_name is None:
            raise Forbidden(f"{caller.name} is not a pod's ServiceAccount token: only a pod's meter may report for it")
        if identity.pod_uid != report.pod_uid or identity.service_account_namespace != report.namespace:
            raise Forbidden(
                f"the token belongs to pod {identity.pod_uid} in namespace {identity.service_account_namespace}, "
                f"not to pod {report.pod_uid} in namespace {report.namespace}"
            )
        namespace, name = report.namespace, identity.pod_name
        return self._pod_terms.get(identity.pod_uid, lambda: self._read_terms(namespace, name, report.pod_uid))

    def _read_terms(self, namespace: str, name: str, uid: str) -> ReportTerms:
        assert self._kube is not None
        pod = self._kube.read_pod(namespace, name)
        if pod is None or pod.metadata is None or pod.metadata.uid != uid:
            raise Forbidden(f"pod {namespace}/{name} with uid {uid} does not exist")
        annotations = pod.metadata.annotations or {}
        share = _decimal(annotations.get(ANNOTATION_GPU_SHARE))
        if share is None:
            raise Forbidden(
                f"pod {namespace}/{name} has no valid {ANNOTATION_GPU_SHARE} annotation: "
                "it was not admitted by the GPU-sharing webhook"
            )
        memory = _decimal(annotations.get(ANNOTATION_GPU_MEMORY))
        return ReportTerms(float(share), None if memory is None else float(memory))


def _decimal(raw: str | None) -> Decimal | None:
    if raw is None:
        return None
    try:
        value = Decimal(raw.strip())
    except InvalidOperation:
        return None
    return value if value.is_finite() and value >= 0 else None
