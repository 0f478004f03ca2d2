"""The Kubernetes API's questions and answers as plain data (who a token is, an access asked, an eviction's answer,
an object an Event is about), apart from the client that asks them, so that a process that never calls the API does
not import the official client."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from gpusharing.compat import StrEnum

POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"  # where the API server gives it (a token bound to a pod)
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
EVENT_NAMESPACE = "default"  # where Events about cluster-scoped objects live


class KubeUnavailable(RuntimeError):
    """The API server could not answer; the message says what was asked."""


@dataclass(frozen=True)
class Identity:
    """Who a bearer token belongs to, as TokenReview says."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict)

    @property
    def pod_uid(self) -> str | None:
        """Set for a pod-bound (projected) ServiceAccount token."""
        return next(iter(self.extra.get(POD_UID_EXTRA) or []), None)

    @property
    def pod_name(self) -> str | None:
        return next(iter(self.extra.get(POD_NAME_EXTRA) or []), None)

    @property
    def node_name(self) -> str | None:
        """The node the token's pod was bound to when the token was issued, where the API server says it."""
        return next(iter(self.extra.get(NODE_NAME_EXTRA) or []), None)

    @property
    def service_account_namespace(self) -> str | None:
        if not self.username.startswith(SERVICE_ACCOUNT_PREFIX):
            return None
        return self.username[len(SERVICE_ACCOUNT_PREFIX):].split(":", 1)[0]


class BoundPod(NamedTuple):
    namespace: str
    name: str


NodePods = dict[str, BoundPod]  # the pods bound to a node, by uid


@dataclass(frozen=True)
class Access:
    """What a SubjectAccessReview asks: a verb on a resource, in a namespace ("": all of them, or cluster-scoped)."""

    verb: str
    resource: str
    group: str
    namespace: str = ""
    name: str = ""


class EvictionResult(StrEnum):
    EVICTED = "evicted"
    # 429: a PodDisruptionBudget does not allow it now, or flow control throttles; retried, never forced
    REFUSED = "refused"
    GONE = "gone"  # the pod no longer exists


@dataclass(frozen=True)
class EvictionAnswer:
    result: EvictionResult
    retry_after: float | None = None  # a 429's Retry-After, in seconds, when the API server gave one


@dataclass(frozen=True)
class ObjectRef:
    """What an Event is about: an object and where its Events live."""

    api_version: str
    kind: str
    name: str
    uid: str
    namespace: str | None = None  # None: cluster-scoped (its Events live in EVENT_NAMESPACE)


@dataclass(frozen=True)
class CustomResource:
    """A custom resource's plural, as the API serves it."""

    group: str
    version: str
    plural: str
    namespaced: bool
