"""AdmissionReview in and out: plain functions over the JSON the API server sends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from gpusharing.decoded import as_mapping

SUPPORTED_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
# Subresources of a pod whose reviews carry the whole Pod and that can change its containers: the webhook guards
# the meter against them (webhook.admission.guard).
POD_SUBRESOURCES = ("ephemeralcontainers", "resize")


class BadReview(ValueError):
    """The body is not an AdmissionReview the webhook can answer."""


@dataclass(frozen=True)
class AdmissionRequest:
    """What the webhook reads of an AdmissionReview's request: the operation, the objects and who sent it."""

    api_version: str
    uid: str
    operation: str
    namespace: str
    kind: str
    resource: str
    sub_resource: str
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None
    dry_run: bool
    username: str = ""  # who sends the request (userInfo), as the API server authenticated them
    groups: frozenset[str] = frozenset()

    @property
    def is_pod(self) -> bool:
        return self.kind == "Pod" and self.resource == "pods" and not self.sub_resource

    @property
    def is_pod_subresource(self) -> bool:
        """An update through one of POD_SUBRESOURCES, whose object is the Pod as it will be."""
        return self.kind == "Pod" and self.resource == "pods" and self.sub_resource in POD_SUBRESOURCES


@dataclass
class Decision:
    """The webhook's answer to one review (allowed or denied, the patch, the warnings) and what its metrics count."""

    allowed: bool = True
    message: str | None = None
    code: int | None = None
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    dialect: str = "none"  # for metrics
    safe_admission: str | None = None  # for metrics: safe admission's outcome, when it checked the pod
    unresolved_priority_class: str | None = None  # for metrics: a class given that the webhook could not resolve
    fair_share_gpus: float | None = None  # the GPUs admitted in a fair-share band (the burst guard counts them)

    @classmethod
    def deny(cls, code: int, message: str, dialect: str = "none") -> "Decision":
        return cls(allowed=False, code=code, message=message, dialect=dialect)


def parse_review(body: object) -> AdmissionRequest:
    """The request of an AdmissionReview body (a supported apiVersion); BadReview saying what is wrong with it."""
    if not isinstance(body, dict):
        raise BadReview("expected a JSON AdmissionReview object")
    api_version = body.get("apiVersion")
    if body.get("kind") != "AdmissionReview" or api_version not in SUPPORTED_VERSIONS:
        raise BadReview(
            f"expected kind AdmissionReview with apiVersion {' or '.join(SUPPORTED_VERSIONS)}, "
            f"got kind {body.get('kind')!r} apiVersion {api_version!r}"
        )
    request = body.get("request")
    if not isinstance(request, dict):
        raise BadReview("the AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid must be a non-empty string")
    operation = request.get("operation")
    if operation not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
        raise BadReview(f"request.operation must be CREATE, UPDATE, DELETE or CONNECT, got {operation!r}")
    kind = request.get("kind") or {}
    resource = request.get("resource") or {}
    if not isinstance(kind, dict) or not isinstance(resource, dict):
        raise BadReview("request.kind and request.resource must be objects")
    obj, old = request.get("object"), request.get("oldObject")
    for name, value in (("object", obj), ("oldObject", old)):
        if value is not None and not isinstance(value, dict):
            raise BadReview(f"request.{name} must be an object")
    username, groups = _user_info(request.get("userInfo"))
    return AdmissionRequest(
        api_version=str(api_version),
        uid=uid,
        operation=operation,
        namespace=str(request.get("namespace") or as_mapping(as_mapping(obj).get("metadata")).get("namespace") or ""),
        kind=str(kind.get("kind", "")),
        resource=str(resource.get("resource", "")),
        sub_resource=str(request.get("subResource") or ""),
        object=obj,
        old_object=old,
        dry_run=bool(request.get("dryRun")),
        username=username,
        groups=groups,
    )


def _user_info(user_info: object) -> tuple[str, frozenset[str]]:
    """The username and groups of `request.userInfo` (absent: nobody, in no group)."""
    if user_info is None:
        return "", frozenset()
    if not isinstance(user_info, dict):
        raise BadReview("request.userInfo must be an object")
    username, groups = user_info.get("username") or "", user_info.get("groups") or []
    if not isinstance(username, str):
        raise BadReview("request.userInfo.username must be a string")
    if not isinstance(groups, list) or not all(isinstance(group, str) for group in groups):
        raise BadReview("request.userInfo.groups must be a list of strings")
    return username, frozenset(groups)


# msgspec writes JSON compact and in the order built, as json.dumps with separators did, in a tenth of the time
# (non-ASCII characters as UTF-8 rather than \u escapes: the same JSON).
_encode = msgspec.json.Encoder().encode


def encoded_response(request: AdmissionRequest, decision: Decision) -> bytes:
    """The AdmissionReview answer as it is sent."""
    return _encode(review_response(request, decision))


def review_response(request: AdmissionRequest, decision: Decision) -> dict[str, Any]:
    """The AdmissionReview answer, in the version the request came in, for msgspec to write (its patch is bytes)."""
    response: dict[str, Any] = {"uid": request.uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {"code": decision.code or 403, "message": decision.message or "denied"}
    if decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = _encode(decision.patch)  # bytes, which msgspec writes in base64, as JSON carries them
    if decision.warnings:
        response["warnings"] = decision.warnings
    return {"apiVersion": request.api_version, "kind": "AdmissionReview", "response": response}

