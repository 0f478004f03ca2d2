"""Who may do what: meters report for their own pod and read nothing, node agents send their node's readings, readers
read the namespaces Kubernetes lets them read, admins change budgets.

TIMEKEEPER_AUTH is `tokenreview` (tokens reviewed by the Kubernetes API, reads and writes allowed by
SubjectAccessReviews as on the GPUBudget resources), `static` (the tokens of TIMEKEEPER_STATIC_TOKENS_FILE) or `none`
(a local demo: everyone is an admin). Each mode's rules: docs/security.md, "Who may do what".
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from gpusharing.caching import TtlCache
from gpusharing.compat import StrEnum
from gpusharing.contract import ANNOTATION_GPU_MEMORY, ANNOTATION_GPU_MODEL, ANNOTATION_GPU_SHARE
from gpusharing.gpu.capacity import node_gpus
from gpusharing.gpu.catalogue import GpuCatalogue, shipped_catalogue
from gpusharing.names import NAMESPACE, NODE_NAME, InvalidName, is_group
from gpusharing.report import MAX_GPU_MEMORY_MIB, MAX_GPU_MODEL, MeterReport
from gpusharing.settings.env import ConfigError
from gpusharing.units.quantity import QuantityError, parse_decimal
from gpusharing.units.share import MAX_GPU_SHARE, MIN_GPU_SHARE
from gpusharing.usage_report import recorded_labels
from timekeeper.cluster.objects import Access, Identity, KubeUnavailable, NodePods
from timekeeper.database.accounting.charging import ReportTerms

if TYPE_CHECKING:
    from timekeeper.cluster.kube import KubeApi

GROUP = "gpusharing.io"
ADMIN = Access("update", "budgets", GROUP)
RESERVE = Access("create", "reservations", GROUP)  # the webhook's: safe admission's reservations
NAMESPACE_BUDGETS, GROUP_BUDGETS = "gpubudgets", "clustergpubudgets"

NAMESPACES_PREFIX = "namespaces="
NODE_PREFIX = "node="
NODE_PODS_SECONDS = 5.0  # a node's pods, listed at most once per this long: an agent's pod bound since waits that long


class Role(StrEnum):
    ADMIN = "admin"
    READER = "reader"
    METER = "meter"
    NODE_AGENT = "node-agent"


class Unauthenticated(Exception):
    """401: no credentials, or credentials nobody vouches for."""


class Forbidden(Exception):
    """403: authenticated, but not allowed this."""


@dataclass(frozen=True)
class Caller:
    name: str  # recorded in the audit log
    role: Role | None = None  # a static token's role; None for a TokenReview identity
    identity: Identity | None = None
    namespaces: frozenset[str] | None = None  # a static meter token bound to these; None: any
    node: str | None = None  # a static node agent's token: the node it speaks for


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class StaticTokens:
    """The tokens of TIMEKEEPER_STATIC_TOKENS_FILE, looked up by their SHA-256 digests, so that no comparison runs over
    a token's own bytes and its timing tells nothing about any token."""

    def __init__(self, callers: dict[str, Caller]):
        self._by_digest = {token_digest(token): caller for token, caller in callers.items()}

    def caller(self, token: str) -> Caller | None:
        return self._by_digest.get(token_digest(token))


def load_static_tokens(path: str) -> StaticTokens:
    """The tokens of a `TOKEN ROLE [NAME] [namespaces=NS,...]` file; ConfigError naming the file and line when
    malformed."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"TIMEKEEPER_STATIC_TOKENS_FILE={path}: cannot read it: {exc.strerror}") from None
    tokens: dict[str, Caller] = {}
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"TIMEKEEPER_STATIC_TOKENS_FILE={path} line {number}"
        namespaces = _namespaces(words.pop(), where) if words[-1].startswith(NAMESPACES_PREFIX) else None
        node = _node(words.pop(), where) if words[-1].startswith(NODE_PREFIX) else None
        if len(words) not in (2, 3) or words[1] not in tuple(Role):
            raise ConfigError(
                f"{where}: expected `TOKEN ROLE [NAME] [{NAMESPACES_PREFIX}NS,...]` with ROLE one of {', '.join(Role)}"
                f" (`TOKEN {Role.NODE_AGENT} [NAME] {NODE_PREFIX}NODE` for a node agent)"
            )
        role = Role(words[1])
        if namespaces is not None and role is not Role.METER:
            raise ConfigError(f"{where}: only a meter token is bound to namespaces ({NAMESPACES_PREFIX}…)")
        if (node is None) != (role is not Role.NODE_AGENT):
            raise ConfigError(f"{where}: a {Role.NODE_AGENT} token, and only one, is bound to the node it speaks for "
                              f"({NODE_PREFIX}NODE)")
        tokens[words[0]] = Caller(
            words[2] if len(words) == 3 else f"static-{role}-line-{number}", role, namespaces=namespaces, node=node
        )
    return StaticTokens(tokens)


def _namespaces(word: str, where: str) -> frozenset[str]:
    names = [name for name in word[len(NAMESPACES_PREFIX):].split(",") if name]
    if not names:
        raise ConfigError(f"{where}: {NAMESPACES_PREFIX} names no namespace")
    try:
        return frozenset(NAMESPACE.check(name, "namespace") for name in names)
    except InvalidName as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _node(word: str, where: str) -> str:
    try:
        return NODE_NAME.check(word[len(NODE_PREFIX):], "node")
    except InvalidName as exc:
        raise ConfigError(f"{where}: {exc}") from None


K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

REVIEW_THREADS = 8  # API calls under way at once for requests (each bounded by the API's own timeout)


class Authenticator:
    """Who calls, and what they may do. The API server's answers are cached; a request waits for one at most
    `wait_seconds`, then gets a 503 (KubeUnavailable) to try again, while the call goes on for the next try."""

    def __init__(self, mode: str, static_tokens: StaticTokens, kube: KubeApi | None, cache_seconds: float = 60.0,
                 wait_seconds: float = 2.0, node_agent_users: frozenset[str] = frozenset(),
                 catalogue: GpuCatalogue | None = None):
        if mode == "tokenreview" and kube is None:
            raise ConfigError(
                "TIMEKEEPER_AUTH=tokenreview needs the Kubernetes API "
                "(in a cluster, or KUBECONFIG or TIMEKEEPER_KUBECONFIG)"
            )
        self.mode = mode
        self.catalogue = catalogue or shipped_catalogue()
        self._static = static_tokens
        self._kube = kube
        if mode == "tokenreview" and kube is not None:
            kube.prepare_reviews()
        self.wait_seconds = wait_seconds
        calls = ThreadPoolExecutor(REVIEW_THREADS, thread_name_prefix="kube-review")
        self._reviews: TtlCache[bytes, Identity | None] = TtlCache(cache_seconds, executor=calls, wait=wait_seconds)
        self._grants: TtlCache[tuple[str, tuple[str, ...], Access], bool] = TtlCache(cache_seconds, executor=calls,
                                                                                     wait=wait_seconds)
        # A pod's annotations under gpusharing.io/ cannot change (the webhook refuses it), so they are read once.
        self._pod_terms: TtlCache[str, ReportTerms] = TtlCache(float("inf"), executor=calls, wait=wait_seconds)
        self.node_agent_users = node_agent_users
        self._agent_nodes: TtlCache[str, str] = TtlCache(cache_seconds, executor=calls, wait=wait_seconds)
        self._node_pods: TtlCache[str, NodePods] = TtlCache(NODE_PODS_SECONDS, executor=calls, wait=wait_seconds)

    def _answer(self, cache: TtlCache[K, T], key: K, compute: Callable[[], T], what: str) -> T:
        try:
            return cache.get(key, compute)
        except FutureTimeout:
            raise KubeUnavailable(f"the Kubernetes API has not answered {what} within {self.wait_seconds:g} s (asked, "
                                  "and kept for the next try)") from None

    def caller(self, authorization: str | None) -> Caller:
        if self.mode == "none":
            return Caller("anonymous", Role.ADMIN)
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("a bearer token is required (Authorization: Bearer TOKEN)")
        static = self._static.caller(token)
        if static is not None:
            return static
        if self.mode == "static" or self._kube is None:
            raise Unauthenticated("the bearer token is not known to the timekeeper")
        kube = self._kube
        identity = self._answer(self._reviews, token_digest(token), lambda: kube.review_token(token), "the TokenReview")
        if identity is None:
            raise Unauthenticated("the bearer token was not authenticated by the Kubernetes API (TokenReview)")
        return Caller(identity.username, identity=identity)

    def check_admin(self, caller: Caller) -> None:
        if caller.role is Role.ADMIN or self._allowed(caller, ADMIN):
            return
        raise Forbidden(
            f"{caller.name} may not change budgets: an admin needs verb {ADMIN.verb!r} on resource "
            f"{ADMIN.resource!r} in API group {ADMIN.group!r}"
        )

    def check_reserver(self, caller: Caller, what: str = "reserve commitments") -> None:
        """Whether `caller` may do what only the webhook does (by default, reserve commitments for the pods it admits):
        the webhook (a static reader in docker-compose, which has no Kubernetes to ask)."""
        self.check_not_meter(caller)
        if caller.role in (Role.ADMIN, Role.READER) or self._allowed(caller, RESERVE):
            return
        raise Forbidden(f"{caller.name} may not {what}: the webhook needs verb {RESERVE.verb!r} on resource "
                        f"{RESERVE.resource!r} in API group {GROUP!r}")

    def check_read(self, caller: Caller, scope: str | None) -> None:
        """Whether `caller` may read what concerns `scope`: a namespace, a group budget, or (None) every namespace."""
        self.check_not_meter(caller)
        if caller.role in (Role.ADMIN, Role.READER):
            return
        access = read_access(scope)
        if not self._allowed(caller, access):
            where = (
                f"in namespace {access.namespace}"
                if access.namespace
                else f"named {access.name}"
                if access.name
                else "in all namespaces"
            )
            what = f"the budget of {scope}" if scope else "what spans every namespace (name a namespace to read one)"
            raise Forbidden(f"{caller.name} may not read {what}: that needs verb {access.verb!r} on resource "
                            f"{access.resource!r} in API group {GROUP!r} {where}")

    def check_not_meter(self, caller: Caller) -> None:
        """A meter's token (a static meter token, a pod's own) reports for its pod and reads nothing; so does a node
        agent's for its node."""
        if caller.role is Role.NODE_AGENT:
            raise Forbidden(f"{caller.name} is a node agent's token: it sends its node's readings and reads nothing")
        if caller.role is Role.METER or (caller.identity is not None and caller.identity.pod_uid is not None):
            raise Forbidden(
                f"{caller.name} is a meter's token (bound to a pod): it reports for its pod and reads nothing"
            )

    def node_pods(self, caller: Caller, node: str) -> NodePods | None:
        """Checks that `caller` is a node agent on `node` (Forbidden otherwise); returns the pods bound to the node,
        whose readings it may send (None: any, off a cluster, where there are no pods to ask about)."""
        if caller.role is Role.NODE_AGENT:
            if caller.node != node:
                raise Forbidden(f"{caller.name} is the node agent of node {caller.node}, not of node {node}")
        elif caller.role is Role.ADMIN and self.mode == "none":
            pass  # the local demo's
        else:
            self._check_agent_node(caller, node)
        kube = self._kube
        if kube is None:
            return None
        return self._answer(self._node_pods, node, lambda: kube.node_pods(node), f"the list of node {node}'s pods")

    def _check_agent_node(self, caller: Caller, node: str) -> None:
        identity = caller.identity
        if identity is None or identity.username not in self.node_agent_users:
            raise Forbidden(
                f"{caller.name} is not a node agent's token: only {', '.join(sorted(self.node_agent_users))} "
                "(TIMEKEEPER_NODE_AGENT_USERS) send node readings"
            )
        uid, name, namespace = identity.pod_uid, identity.pod_name, identity.service_account_namespace
        if uid is None or name is None or namespace is None:
            raise Forbidden(
                f"{caller.name}: the token is not bound to a pod (a node agent presents its pod's projected "
                "ServiceAccount token)"
            )
        agent_node = self._answer(
            self._agent_nodes,
            uid,
            lambda: self._read_agent_node(namespace, name, uid, identity.node_name),
            f"the read of pod {namespace}/{name}",
        )
        if agent_node != node:
            raise Forbidden(f"the token's pod {namespace}/{name} runs on node {agent_node}, not on node {node}")

    def _read_agent_node(self, namespace: str, name: str, uid: str, reviewed_node: str | None) -> str:
        """The node the agent's pod runs on: its spec.nodeName, which must agree with TokenReview's where it says."""
        assert self._kube is not None
        pod = self._kube.read_pod(namespace, name)
        if pod is None or pod.metadata is None or pod.metadata.uid != uid:
            raise Forbidden(f"the token's pod {namespace}/{name} with uid {uid} no longer exists")
        bound = pod.spec.node_name if pod.spec is not None else None
        if bound is None:
            raise Forbidden(f"the token's pod {namespace}/{name} is not bound to a node")
        if reviewed_node is not None and reviewed_node != bound:
            raise Forbidden(f"the token was issued on node {reviewed_node}, but its pod {namespace}/{name} is bound to "
                            f"node {bound}")
        return bound

    def _allowed(self, caller: Caller, access: Access) -> bool:
        identity, kube = caller.identity, self._kube
        if identity is None or kube is None:
            return False
        return self._answer(
            self._grants,
            (identity.username, identity.groups, access),
            lambda: kube.may(identity, access),
            "the SubjectAccessReview",
        )

    def report_terms(self, caller: Caller, report: MeterReport) -> ReportTerms | None:
        """Checks that `caller` may send `report`; returns what to trust about the pod (None: the report itself)."""
        if caller.role in (Role.ADMIN, Role.METER):
            if caller.namespaces is not None and report.namespace not in caller.namespaces:
                raise Forbidden(
                    f"{caller.name} may report for namespace(s) {', '.join(sorted(caller.namespaces))} only, "
                    f"not {report.namespace}"
                )
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
        return self._answer(
            self._pod_terms,
            identity.pod_uid,
            lambda: self._read_terms(namespace, name, report.pod_uid),
            f"the read of pod {namespace}/{name}",
        )

    def _read_terms(self, namespace: str, name: str, uid: str) -> ReportTerms:
        assert self._kube is not None
        pod = self._kube.read_pod(namespace, name)
        if pod is None or pod.metadata is None or pod.metadata.uid != uid:
            raise Forbidden(f"pod {namespace}/{name} with uid {uid} does not exist")
        annotations = pod.metadata.annotations or {}
        share = _annotated_number(annotations.get(ANNOTATION_GPU_SHARE), MIN_GPU_SHARE, MAX_GPU_SHARE)
        if share is None:
            raise Forbidden(
                f"pod {namespace}/{name} has no valid {ANNOTATION_GPU_SHARE} annotation "
                f"(a share from {MIN_GPU_SHARE} to {MAX_GPU_SHARE}): it was not admitted by the GPU-sharing webhook"
            )
        memory = _annotated_number(annotations.get(ANNOTATION_GPU_MEMORY), 0, MAX_GPU_MEMORY_MIB)
        model = annotations.get(ANNOTATION_GPU_MODEL)
        model = model if isinstance(model, str) and len(model) <= MAX_GPU_MODEL else None  # else: the default model's
        node_name = pod.spec.node_name if pod.spec is not None else None
        if node_name:  # bound, as a reporting pod is: billed on its node's model, as the controller bills it
            node = self._kube.read_node(node_name)
            model = node_gpus(node, self.catalogue).model.name if node is not None else model
        started = pod.status.start_time if pod.status is not None else None
        return ReportTerms(share, memory, recorded_labels(pod.metadata.labels), model, started, node_name or None)


def read_access(scope: str | None) -> Access:
    """What Kubernetes must allow a reader of `scope`, as it would allow reading the GPUBudget resources."""
    if scope is None:
        return Access("list", NAMESPACE_BUDGETS, GROUP)
    if is_group(scope):
        return Access("get", GROUP_BUDGETS, GROUP, name=scope)
    return Access("get", NAMESPACE_BUDGETS, GROUP, namespace=scope)


def _annotated_number(raw: str | None, low: Decimal | int, high: Decimal | int) -> float | None:
    """The number an annotation holds, if it is one within [low, high] (read within gpusharing.units.quantity's
    bounds)."""
    try:
        value = parse_decimal(raw)
    except QuantityError:
        return None
    return float(value) if low <= value <= high else None
