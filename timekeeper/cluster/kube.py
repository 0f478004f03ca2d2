"""The Kubernetes API, through the official client: TokenReview, SubjectAccessReview, pods, evictions, events."""

from __future__ import annotations

import datetime as dt
import json
import logging
import socket
import uuid
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpusharing.contract import BILLING_FINALIZER, FAIR_SHARE_GATE, TIMEKEEPER_TOKEN_AUDIENCE
from gpusharing.kube.client import REQUEST_TIMEOUT_SECONDS, api_client
from timekeeper.cluster.objects import (
    EVENT_NAMESPACE,
    Access,
    BoundPod,
    CustomResource,
    EvictionAnswer,
    EvictionResult,
    Identity,
    KubeUnavailable,
    NodePods,
    ObjectRef,
)

log = logging.getLogger(__name__)

REPORTING_COMPONENT = "gpusharing-timekeeper"
# The informers' four watches and the other tasks' calls (the Lease, Events, statuses, finalizers), each in a thread.
CONNECTIONS_BESIDE_EVICTIONS = 8
MAX_RETRY_AFTER_SECONDS = 60.0  # a Retry-After beyond this is read as this much


class KubeApi:
    def __init__(self, api_client: client.ApiClient, timeout: float = REQUEST_TIMEOUT_SECONDS):
        self.api_client = api_client
        self.timeout = timeout

    # Each API group's client made at its first use: importing one imports the models of its group, seconds of CPU
    # for core/v1, which a web replica on static tokens never calls.
    @cached_property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_client)

    @cached_property
    def authentication(self) -> client.AuthenticationV1Api:
        return client.AuthenticationV1Api(self.api_client)

    @cached_property
    def authorization(self) -> client.AuthorizationV1Api:
        return client.AuthorizationV1Api(self.api_client)

    @cached_property
    def coordination(self) -> client.CoordinationV1Api:
        return client.CoordinationV1Api(self.api_client)

    @cached_property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api_client)

    @cached_property
    def resource(self) -> client.ResourceV1Api:
        return client.ResourceV1Api(self.api_client)

    @cached_property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api_client)

    def prepare_reviews(self) -> None:
        """Makes the clients that reviewing a caller uses (TokenReview, SubjectAccessReview, its pod) now: made at
        the first request, their imports would take longer than a request waits for its review."""
        _ = self.authentication, self.authorization, self.core

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, evictions: int = 0) -> "KubeApi":
        """The API given by `kubeconfig`, or the in-cluster ServiceAccount when None; ConfigError when neither works.
        Its connection pool holds `evictions` requests in flight at once beside everything else."""
        return cls(api_client(kubeconfig, "TIMEKEEPER_KUBECONFIG", evictions + CONNECTIONS_BESIDE_EVICTIONS))

    def review_token(self, token: str) -> Identity | None:
        """The token's identity, or None when TokenReview does not authenticate it for the timekeeper's audience."""
        review = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[TIMEKEEPER_TOKEN_AUDIENCE]))
        answer = self._call("review a token", self.authentication.create_token_review, review)
        status = answer.status
        if status is None or not status.authenticated or status.user is None:
            return None
        if status.audiences is not None and TIMEKEEPER_TOKEN_AUDIENCE not in status.audiences:
            return None
        user = status.user
        return Identity(user.username or "", user.uid or "", tuple(user.groups or ()), dict(user.extra or {}))

    def may(self, identity: Identity, access: Access) -> bool:
        attributes = client.V1ResourceAttributes(verb=access.verb, resource=access.resource, group=access.group,
                                                 namespace=access.namespace or None, name=access.name or None)
        review = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=identity.username,
                uid=identity.uid or None,
                groups=list(identity.groups),
                extra=identity.extra or None,
                resource_attributes=attributes,
            )
        )
        answer = self._call("check an authorization", self.authorization.create_subject_access_review, review)
        return bool(answer.status and answer.status.allowed)

    def read_pod(self, namespace: str, name: str) -> client.V1Pod | None:
        return self._call(
            f"read pod {namespace}/{name}", self.core.read_namespaced_pod, name, namespace, answers={404: None}
        )

    def read_node(self, name: str) -> dict[str, Any] | None:
        """The node as the API server has it, as plain JSON; None when there is none of that name."""
        answer = self._call(f"read node {name}", self.core.read_node, name, answers={404: None}, _preload_content=False)
        return None if answer is None else dict(json.loads(answer.data))

    def node_pods(self, node: str) -> NodePods:
        """The pods bound to `node`, in every namespace: one LIST, by the API server's field selector."""
        answer = self._call(f"list the pods of node {node}", self.core.list_pod_for_all_namespaces,
                            field_selector=f"spec.nodeName={node}")
        return {pod.metadata.uid: BoundPod(pod.metadata.namespace, pod.metadata.name)
                for pod in answer.items or [] if pod.metadata is not None and pod.metadata.uid}

    def running_pods(self, namespace: str) -> list[client.V1Pod]:
        answer = self._call(
            f"list the pods of {namespace}",
            self.core.list_namespaced_pod,
            namespace,
            field_selector="status.phase=Running",
        )
        return list(answer.items or [])

    def release_pod(self, namespace: str, name: str, uid: str, finalizer_index: int) -> bool:
        """Removes the billing finalizer from a pod whose bill is closed. The patch first tests the pod's uid and the
        finalizer's place, so a pod replaced under the same name, or finalizers changed meanwhile, are left alone
        (False) for the next pass to look at again; a pod already gone is released (True)."""
        where = f"/metadata/finalizers/{finalizer_index}"
        patch = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "test", "path": where, "value": BILLING_FINALIZER},
            {"op": "remove", "path": where},
        ]
        answer = self._call(f"release pod {namespace}/{name}", self.core.patch_namespaced_pod, name, namespace, patch,
                            answers={404: True, 409: False, 422: False}, _preload_content=False)
        return answer is not False

    def ungate_pod(self, namespace: str, name: str, uid: str, gate_index: int) -> bool:
        """Removes the fair-share gate from a queued pod, which kube-scheduler then places. The patch first tests the
        pod's uid and the gate's place, as release_pod does; False when the pod changed or is gone."""
        where = f"/spec/schedulingGates/{gate_index}"
        patch = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "test", "path": f"{where}/name", "value": FAIR_SHARE_GATE},
            {"op": "remove", "path": where},
        ]
        answer = self._call(f"release pod {namespace}/{name} from the fair-share queue", self.core.patch_namespaced_pod,
                            name, namespace, patch, answers={404: False, 409: False, 422: False},
                            _preload_content=False)
        return answer is not False

    def evict(self, namespace: str, name: str, uid: str, send_within: float | None = None) -> EvictionAnswer:
        """Asks for the eviction of the pod of that uid (not a namesake made since), which the API server grants only
        within the pods' PodDisruptionBudgets (else 429, with the Retry-After it gives). `send_within`: the request
        leaves within that many seconds or not at all (a connection it must open first is given up after that long);
        once sent, its answer is waited for the API's whole timeout. KubeUnavailable when there is no answer: whether
        it was granted is then unknown."""
        eviction = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            delete_options=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
        )
        answers = {429: lambda exc: EvictionAnswer(EvictionResult.REFUSED, _retry_after(exc)),
                   404: EvictionAnswer(EvictionResult.GONE), 409: EvictionAnswer(EvictionResult.GONE)}
        answer = self._call(
            f"evict pod {namespace}/{name}",
            self.core.create_namespaced_pod_eviction,
            name,
            namespace,
            eviction,
            answers=answers,
            timeout=None if send_within is None else (max(0.001, min(send_within, self.timeout)), self.timeout),
        )
        return answer if isinstance(answer, EvictionAnswer) else EvictionAnswer(EvictionResult.EVICTED)

    def shown_owner(self, owner: ObjectRef) -> ObjectRef:
        """The object whose Events `kubectl describe` shows for a pod's owner: a ReplicaSet's Deployment, else the
        owner itself (also when the ReplicaSet is gone)."""
        if owner.kind != "ReplicaSet" or owner.namespace is None:
            return owner
        found = self._call(f"read replicaset {owner.namespace}/{owner.name}", self.apps.read_namespaced_replica_set,
                           owner.name, owner.namespace, answers={404: None})
        references = (found.metadata.owner_references or []) if found is not None and found.metadata is not None else []
        deployment = next((r for r in references if r.controller and r.kind == "Deployment"), None)
        if deployment is None:
            return owner
        return ObjectRef(deployment.api_version, deployment.kind, deployment.name, deployment.uid, owner.namespace)

    def record_event(self, namespace: str, reason: str, message: str, warning: bool) -> bool:
        """An Event about the namespace itself, where `kubectl describe namespace` finds it.

        A Namespace is cluster-scoped, so its Events live in `default` (as a Node's do) and name the namespace's uid,
        which `kubectl describe` selects on. A namespace deleted meanwhile gets none: False.
        """
        answer = self._call(f"read namespace {namespace}", self.core.read_namespace, namespace, answers={404: None})
        if answer is None or answer.metadata is None:
            return False
        self.record_object_event(ObjectRef("v1", "Namespace", namespace, answer.metadata.uid), reason, message, warning)
        return True

    def record_object_event(
        self, about: ObjectRef, reason: str, message: str, warning: bool, related: ObjectRef | None = None
    ) -> None:
        """An Event about `about`, in its namespace (a cluster-scoped object's in `default`); `related`: the other
        object it concerns (for GPUFairShare, the namespace whose pods waited), as kube-scheduler's Preempted Event
        names the preemptor."""
        where = about.namespace or EVENT_NAMESPACE
        now = dt.datetime.now(dt.timezone.utc)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{about.name}.gpusharing-{uuid.uuid4().hex[:12]}", namespace=where),
            involved_object=client.V1ObjectReference(
                api_version=about.api_version,
                kind=about.kind,
                name=about.name,
                uid=about.uid,
                namespace=about.namespace,
            ),
            related=None
            if related is None
            else client.V1ObjectReference(
                api_version=related.api_version,
                kind=related.kind,
                name=related.name,
                uid=related.uid or None,
                namespace=related.namespace,
            ),
            reason=reason,
            message=message,
            type="Warning" if warning else "Normal",
            source=client.V1EventSource(component=REPORTING_COMPONENT),
            reporting_component=REPORTING_COMPONENT,
            reporting_instance=socket.gethostname(),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        self._call(f"record an event on {about.kind} {about.name}", self.core.create_namespaced_event, where, event)

    # -- the controller's Lease --------------------------------------------------------------------------------------

    def read_lease(self, namespace: str, name: str) -> client.V1Lease | None:
        return self._call(f"read lease {namespace}/{name}", self.coordination.read_namespaced_lease, name, namespace,
                          answers={404: None})

    def create_lease(self, namespace: str, lease: client.V1Lease) -> bool:
        """False when another process created it first (409)."""
        name = lease.metadata.name if lease.metadata is not None else ""
        created = self._call(f"create lease {namespace}/{name}", self.coordination.create_namespaced_lease,
                             namespace, lease, answers={409: None})
        return created is not None

    def replace_lease(self, namespace: str, name: str, lease: client.V1Lease) -> client.V1Lease | None:
        """The Lease written; None when it changed since it was read (409: another process wrote first)."""
        return self._call(
            f"update lease {namespace}/{name}",
            self.coordination.replace_namespaced_lease,
            name,
            namespace,
            lease,
            answers={409: None},
        )

    # -- custom resources (GPUBudget, ClusterGPUBudget) ------------------------------------------------------------

    def list_custom(self, resource: CustomResource) -> dict[str, Any] | None:
        """Every object of the resource, in every namespace, with the list's resourceVersion; None when the API
        does not serve it (its CRD is not installed)."""
        return self._call(f"list {resource.plural}", self.custom.list_cluster_custom_object, resource.group,
                          resource.version, resource.plural, answers={404: None})

    def patch_custom_status(
        self, resource: CustomResource, namespace: str | None, name: str, status: dict[str, Any]
    ) -> None:
        """Merges `status` into the object's status subresource; an object deleted meanwhile is left alone."""
        body = {"status": status}
        what = f"update the status of {resource.plural} {f'{namespace}/' if namespace else ''}{name}"
        if resource.namespaced:
            self._call(what, self.custom.patch_namespaced_custom_object_status, resource.group, resource.version,
                       namespace, resource.plural, name, body, answers={404: None})
        else:
            self._call(what, self.custom.patch_cluster_custom_object_status, resource.group, resource.version,
                       resource.plural, name, body, answers={404: None})

    def _call(self, what: str, method: Any, *args: Any, answers: Mapping[int, Any] | None = None,
              timeout: tuple[float, float] | None = None, **kwargs: Any) -> Any:
        """The API's answer; `answers` maps HTTP statuses that are answers, not failures, to what to return (or to a
        function of the ApiException giving it). The call gives up after the API's timeout (connecting, and waiting
        for the answer), or `timeout`'s (connect, read) seconds."""
        try:
            return method(*args, _request_timeout=timeout or self.timeout, **kwargs)
        except ApiException as exc:
            if answers is not None and exc.status in answers:
                answer = answers[exc.status]
                return answer(exc) if callable(answer) else answer
            raise KubeUnavailable(f"could not {what}: {_reason(exc)}") from None
        except Exception as exc:
            raise KubeUnavailable(f"could not {what}: {exc}") from None


def _retry_after(exc: ApiException) -> float | None:
    """A 429's Retry-After header in seconds (the API server gives whole seconds), bounded; None when absent or not a
    number of seconds."""
    raw = (exc.headers or {}).get("Retry-After")
    try:
        seconds = float(raw) if raw is not None else None
    except ValueError:
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_SECONDS) if seconds is not None and seconds == seconds else None


def _reason(exc: ApiException) -> str:
    return f"HTTP {exc.status} {exc.reason}".strip()
