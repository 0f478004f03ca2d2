"""An HTTP-level fake of the Kubernetes API on 127.0.0.1, for the official `kubernetes` client.

It answers what the timekeeper asks: TokenReview, SubjectAccessReview, pods (get, list), the lists of the
controller's informers (a page at a time when they ask a limit) and their watches (which deliver only what a test
queues, delete_pod's DELETED; counted while open, watches_open and watches_peak), pod eviction (PodDisruptionBudgets'
429s, each eviction's latency, how many were in flight at once), events and the
controller's Lease (with resourceVersion conflicts, as the API server answers them); and what `kubectl gpusharing`
asks: TokenRequest, and the service proxy to the timekeeper, which drops the Authorization header as the real API
server does. Tests set its state (tokens, admins, pods, refused evictions, where the proxy leads) and read what was
asked of it.
"""

from __future__ import annotations

import http.client
import json
import re
import secrets
import ssl
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from kubernetes import client

from demo.jsonhttp import KeepAliveHandler, QuietServer, reply_json
from gpusharing.contract import ANNOTATION_BUDGET_STATE, ANNOTATION_GPU_SHARE

_POD = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/?]+)(?P<eviction>/eviction)?$")
_PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$")
# What the controller's informers list (tests list again, ClusterInformers.list_now; their watches deliver only what
# a test queues: delete_pod's DELETED).
_LISTED = {"/api/v1/pods": "pods", "/apis/resource.k8s.io/v1/resourceclaims": "resourceclaims",
           "/apis/gpusharing.io/v1alpha1/gpubudgets": "gpubudgets",
           "/apis/gpusharing.io/v1alpha1/clustergpubudgets": "clustergpubudgets", "/api/v1/nodes": "nodes"}
_NODE = re.compile(r"^/api/v1/nodes/(?P<name>[^/?]+)$")
_EVENTS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/events$")
_NAMESPACE = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)$")
_LEASES = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/leases(?:/(?P<name>[^/]+))?$")
_TOKEN_REQUEST = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/serviceaccounts/(?P<name>[^/]+)/token$")
_SERVICE_PROXY = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/services/(?P<service>[^/]+)/proxy(?P<rest>/.*)?$")
# The headers the service proxy passes on to the Service (the Authorization header is the API server's own).
_PROXIED_HEADERS = ("Accept", "Content-Type", "X-Timekeeper-Authorization")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


SERVICE_ACCOUNT_TOKEN = "timekeeper-service-account"  # the token of api_client() and kubeconfig()


@dataclass
class FakeDisruptionBudget:
    """A PodDisruptionBudget as the Eviction API applies it: of `pods`, at most `allowed` disrupted at a time, an
    evicted pod counting as disrupted for `recovery_seconds` (until its replacement is ready); an eviction beyond is
    answered 429, with a Retry-After header when `retry_after_seconds` is set (the API server gives none for a budget;
    its flow control does). Reads back the most disrupted at once (`peak`), the 429s answered (the first's time),
    and each of its pods' eviction requests as it came: when, and how many of them were in flight then."""

    pods: set[tuple[str, str]]
    allowed: int = 1
    recovery_seconds: float = 0.2
    retry_after_seconds: int | None = None
    evicted_at: list[float] = field(default_factory=list)
    peak: int = 0
    refusals: int = 0
    first_refused_at: float | None = None  # by time.monotonic()
    asking: int = 0  # its pods' evictions in flight now
    asked: list[tuple[float, int]] = field(default_factory=list)

    def admits(self, at: float) -> bool:
        """Whether one more eviction is allowed at `at` (and if so, it counts from then)."""
        self.evicted_at = [when for when in self.evicted_at if when + self.recovery_seconds > at]
        if len(self.evicted_at) >= self.allowed:
            self.refusals += 1
            self.first_refused_at = self.first_refused_at or at
            return False
        self.evicted_at.append(at)
        self.peak = max(self.peak, len(self.evicted_at))
        return True


class FakeKube:
    def __init__(self, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        """`tls`: serve HTTPS with this server context (handshakes in the handlers' threads)."""
        self.users: dict[str, dict[str, Any]] = {}  # token -> TokenReview user
        self.admins: set[str] = set()  # usernames a SubjectAccessReview allows everything of gpusharing.io
        self.viewers: dict[str, set[str]] = {}  # username -> namespaces whose GPUBudgets it may get (RBAC's view role)
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.refuse_evictions: set[tuple[str, str]] = set()  # answered 429, as a PodDisruptionBudget would
        self.up = True
        self.delay_seconds = 0.0  # every answer this late (a slow API server)
        self.events_up = True  # False: Events alone answer 503 (the API server's storage of them failing)
        self.evicted: list[tuple[str, str]] = []
        self.disruption_budgets: list[FakeDisruptionBudget] = []
        # every eviction takes this long, beside the others in flight (the API server's work)
        self.eviction_seconds = 0.0
        self.evictions_in_flight = 0
        self.evictions_peak = 0  # the most eviction requests in flight at once
        self.patched: list[list[dict[str, Any]]] = []  # the JSON patches of pods that applied
        self.events: list[dict[str, Any]] = []
        self.deleted_namespaces: set[str] = set()
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self.access_reviews: list[dict[str, Any]] = []
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        # plural -> GPUBudgets, ClusterGPUBudgets, ResourceClaims, nodes
        self.custom: dict[str, list[dict[str, Any]]] = {}
        self._versions = iter(range(1, 1 << 62))
        self._watched: list[tuple[str, int, dict[str, Any]]] = []  # (kind, resourceVersion, watch event) queued
        self._watch_queued = threading.Condition()
        # continue token -> the rest of a list, its version
        self._pages: dict[str, tuple[list[dict[str, Any]], str]] = {}
        self.watches_open: dict[str, int] = {}  # plural -> watch requests open now
        self.watches_peak: dict[str, int] = {}  # plural -> the most open at once since reset_watch_peaks()
        self.service_account_tokens: dict[tuple[str, str], str] = {}  # (namespace, name) -> what TokenRequest returns
        self.token_requests: list[dict[str, Any]] = []
        self.services: dict[tuple[str, str], str] = {}  # (namespace, "scheme:name:port") -> the URL the proxy leads to
        self.proxied: list[dict[str, str]] = []  # the headers of every proxied request, as the Service got them
        self.caller_token = "kubectl-user"  # the bearer token the API server accepts from a kubeconfig's user
        self.accepted_tokens: set[str] = {SERVICE_ACCOUNT_TOKEN}  # and these; any other is answered 401
        self.authorizations: list[str | None] = []  # the Authorization header of every request
        self._lock = threading.Lock()
        fake = self

        class Handler(KeepAliveHandler):
            def do_GET(self) -> None:
                fake._handle(self, "GET")

            def do_POST(self) -> None:
                fake._handle(self, "POST")

            def do_DELETE(self) -> None:
                fake._handle(self, "DELETE")

            def do_PUT(self) -> None:
                fake._handle(self, "PUT")

            def do_PATCH(self) -> None:
                fake._handle(self, "PATCH")

        self.server = QuietServer((host, port), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True, do_handshake_on_connect=False)
        self.url = f"{'https' if tls else 'http'}://{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- the client side -------------------------------------------------------------------------------------------

    def api_client(self) -> client.ApiClient:
        configuration = client.Configuration()
        configuration.host = self.url
        configuration.api_key = {"authorization": f"Bearer {SERVICE_ACCOUNT_TOKEN}"}
        return client.ApiClient(configuration)

    def kubeconfig(self) -> str:
        """A kubeconfig pointing at this fake (for processes that build their own client)."""
        return json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": SERVICE_ACCOUNT_TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        })

    # -- state -----------------------------------------------------------------------------------------------------

    def add_pod(
        self,
        namespace: str,
        name: str,
        share: str | None = "0.5",
        priority_class: str = "gpusharing-in-budget",
        phase: str = "Running",
        memory_mib: str | None = None,
    ) -> dict[str, Any]:
        annotations = {}
        if share is not None:  # the webhook's record: the over-budget class goes with the state it was admitted in
            annotations[ANNOTATION_GPU_SHARE] = share
            annotations[ANNOTATION_BUDGET_STATE] = (
                "over-budget" if priority_class == "gpusharing-over-budget" else "in-budget"
            )
        if memory_mib is not None:
            annotations["gpusharing.io/gpu-memory-mib"] = memory_mib
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "annotations": annotations},
            "spec": {"priorityClassName": priority_class, "containers": [{"name": "main", "image": "cuda"}]},
            "status": {"phase": phase},
        }
        self.pods[(namespace, name)] = pod
        return pod

    def run_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Holds the pod (as a kubelet that runs it reports it), as the pod watch's ADDED event tells."""
        metadata = pod["metadata"]
        with self._lock:
            version = next(self._versions)
            self.pods[(metadata["namespace"], metadata["name"])] = pod
            self._queue_watched("pods", version, "ADDED", pod)
        return pod

    def delete_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """Deletes the pod at once (no finalizer holds it), as the pod watch's DELETED event tells, the pod as it last
        was."""
        with self._lock:
            return self._delete_pod((namespace, name))

    def _delete_pod(self, key: tuple[str, str]) -> dict[str, Any]:
        """Under the lock: the pod gone, and a DELETED event for the pod watch."""
        pod = self.pods.pop(key)
        self._queue_watched("pods", next(self._versions), "DELETED", pod)
        return pod

    def _queue_watched(self, kind: str, version: int, event: str, obj: dict[str, Any]) -> None:
        """An event for the watches of `kind`, the object as of `version`."""
        at = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(version)}}
        with self._watch_queued:
            self._watched.append((kind, version, {"type": event, "object": at}))
            self._watch_queued.notify_all()

    @staticmethod
    def namespace_uid(namespace: str) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_DNS, namespace))

    def pod_token(self, pod: dict[str, Any], service_account: str = "default") -> str:
        """A projected ServiceAccount token bound to `pod`."""
        metadata = pod["metadata"]
        return self.user_token(
            f"system:serviceaccount:{metadata['namespace']}:{service_account}",
            ["system:serviceaccounts", f"system:serviceaccounts:{metadata['namespace']}"],
            {
                "authentication.kubernetes.io/pod-name": [metadata["name"]],
                "authentication.kubernetes.io/pod-uid": [metadata["uid"]],
            },
        )

    def user_token(
        self, username: str, groups: list[str] | None = None, extra: dict[str, list[str]] | None = None
    ) -> str:
        token = secrets.token_urlsafe(16)
        self.users[token] = {
            "username": username,
            "uid": str(uuid.uuid4()),
            "groups": groups or [],
            "extra": extra or {},
        }
        return token

    def reset_watch_peaks(self) -> None:
        """From now on, watches_peak counts the watches open at once (each client's watch ends within a second and is
        opened again at once: the peak over a few seconds is how many watches are held)."""
        with self._lock:
            self.watches_peak = dict(self.watches_open)

    def count(self, method: str, prefix: str) -> int:
        return sum(1 for m, path in self.requests if m == method and path.startswith(prefix))

    # -- the server side -------------------------------------------------------------------------------------------

    def user_kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        """A kubeconfig of a user of this fake API server (a bearer token), its context in `namespace`."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "fake-user",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "someone", "user": {"token": self.caller_token}}],
            "contexts": [
                {"name": "fake-user", "context": {"cluster": "fake", "user": "someone", "namespace": namespace}}
            ],
        }

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        path, _, query = handler.path.partition("?")
        authorization = handler.headers.get("Authorization")
        with self._lock:
            self.authorizations.append(authorization)
        if authorization not in {f"Bearer {token}" for token in {self.caller_token, *self.accepted_tokens}}:
            with self._lock:
                self.requests.append((method, path))
            reply_json(handler, 401, _status(401, "Unauthorized", "Unauthorized"))
            return
        if (proxy := _SERVICE_PROXY.match(path)) is not None:
            with self._lock:
                self.requests.append((method, path))
            reply_json(handler, *self._proxy(handler, method, proxy, query, raw))
            return
        body = json.loads(raw or b"null") if length else None
        time.sleep(self.delay_seconds)
        if method == "GET" and path in _LISTED and "watch=" in query.lower() and self.up:
            kind = _LISTED[path]
            with self._lock:
                self.requests.append((method, path))
                self.watches_open[kind] = self.watches_open.get(kind, 0) + 1
                self.watches_peak[kind] = max(self.watches_peak.get(kind, 0), self.watches_open[kind])
            try:
                self._watch(handler, kind, urllib.parse.parse_qs(query))
            finally:
                with self._lock:
                    self.watches_open[kind] -= 1
            return
        eviction = method == "POST" and path.endswith("/eviction")
        budgets = [b for b in self.disruption_budgets if tuple(path.split("/")[4:7:2]) in b.pods] if eviction else []
        if eviction:
            with self._lock:
                self.evictions_in_flight += 1
                self.evictions_peak = max(self.evictions_peak, self.evictions_in_flight)
                for budget in budgets:
                    budget.asking += 1
                    budget.asked.append((time.monotonic(), budget.asking))
            time.sleep(self.eviction_seconds)
        with self._lock:
            self.requests.append((method, path))
            code, answer = (
                self._answer(method, path, query, body)
                if self.up
                else (503, _status(503, "ServiceUnavailable", "down"))
            )
            if eviction:  # before the answer leaves: the client's next request is never counted beside this one
                self.evictions_in_flight -= 1
                for budget in budgets:
                    budget.asking -= 1
        retry_after = (answer.get("details") or {}).get("retryAfterSeconds") if code == 429 else None
        reply_json(handler, code, answer, {"Retry-After": str(retry_after)} if retry_after is not None else None)

    def _watch(self, handler: BaseHTTPRequestHandler, kind: str, query: dict[str, list[str]]) -> None:
        """A watch from the resourceVersion asked: the events queued since, after waiting a little for one when there
        is none (the client watches again at once: no request loop that spins)."""
        since = int((query.get("resourceVersion") or ["0"])[0] or 0)

        def pending() -> list[dict[str, Any]]:
            return [event for each, version, event in self._watched if each == kind and version > since]

        with self._watch_queued:
            self._watch_queued.wait_for(lambda: bool(pending()), timeout=0.5)
            events = pending()
        payload = "".join(json.dumps(event) + "\n" for event in events).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def _proxy(
        self, handler: BaseHTTPRequestHandler, method: str, match: re.Match[str], query: str, raw: bytes
    ) -> tuple[int, Any]:
        """The service proxy: the caller authenticated (then its Authorization header dropped), the request passed
        on to the Service's URL; 503 as the real one answers for a Service without endpoints."""
        target = self.services.get((match["ns"], urllib.parse.unquote(match["service"])))
        if target is None:
            return 503, _status(503, "ServiceUnavailable", f'no endpoints available for service "{match["service"]}"')
        headers = {name: handler.headers[name] for name in _PROXIED_HEADERS if handler.headers.get(name)}
        self.proxied.append(headers)
        parts = urllib.parse.urlsplit(target)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        try:
            connection.request(
                method, (match["rest"] or "/") + (f"?{query}" if query else ""), body=raw or None, headers=headers
            )
            answer = connection.getresponse()
            return answer.status, json.loads(answer.read() or b"null")
        finally:
            connection.close()

    def _answer(self, method: str, path: str, query: str, body: Any) -> tuple[int, dict[str, Any]]:
        if method == "POST" and (match := _TOKEN_REQUEST.match(path)) is not None:
            self.token_requests.append({"namespace": match["ns"], "name": match["name"], **body["spec"]})
            token = self.service_account_tokens.get((match["ns"], match["name"]))
            if token is None:
                return 403, _status(
                    403,
                    "Forbidden",
                    f'serviceaccounts "{match["name"]}" is forbidden: User "someone" cannot create resource '
                    '"serviceaccounts/token"',
                )
            return 201, {**body, "status": {"token": token, "expirationTimestamp": "2030-01-01T00:00:00Z"}}
        if method == "POST" and path == "/apis/authentication.k8s.io/v1/tokenreviews":
            user = self.users.get(body["spec"]["token"])
            audiences = body["spec"].get("audiences") or []
            status: dict[str, Any] = {"authenticated": False, "error": "invalid token"}
            if user:
                status = {"authenticated": True, "user": user, "audiences": audiences}
            return 201, {**body, "status": status}
        if method == "POST" and path == "/apis/authorization.k8s.io/v1/subjectaccessreviews":
            self.access_reviews.append(body["spec"])
            attributes = body["spec"].get("resourceAttributes") or {}
            user = body["spec"].get("user")
            viewed = (attributes.get("verb"), attributes.get("resource"), attributes.get("namespace"))
            allowed = attributes.get("group") == "gpusharing.io" and (user in self.admins or (
                viewed[:2] == ("get", "gpubudgets") and viewed[2] in self.viewers.get(user, set())))
            return 201, {**body, "status": {"allowed": allowed}}
        if (match := _POD.match(path)) is not None:
            key = (match["ns"], match["name"])
            pod = self.pods.get(key)
            if pod is None:
                return 404, _status(404, "NotFound", f'pods "{key[1]}" not found')
            if method == "GET" and not match["eviction"]:
                return 200, pod
            if method == "PATCH" and not match["eviction"]:
                return self._json_patch(pod, body)
            if method == "POST" and match["eviction"]:
                if key in self.refuse_evictions:
                    return 429, _status(
                        429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget."
                    )
                for budget in self.disruption_budgets:
                    if key in budget.pods and not budget.admits(time.monotonic()):
                        refused = _status(
                            429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget."
                        )
                        if budget.retry_after_seconds is not None:
                            refused["details"] = {"retryAfterSeconds": budget.retry_after_seconds}
                        return 429, refused
                self.evicted.append(key)
                self._delete_pod(key)  # the kubelet stops it and its controller re-creates it (through the webhook)
                return 201, _status(201, "", "") | {"status": "Success"}
        if method == "GET" and (match := _PODS.match(path)) is not None:
            items = [p for (ns, _), p in self.pods.items() if ns == match["ns"]]
            if "status.phase%3DRunning" in query or "status.phase=Running" in query:
                items = [p for p in items if p["status"]["phase"] == "Running"]
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
        if method == "GET" and path in _LISTED and "watch=true" in query:  # a watch that sees no change, then ends
            return 200, {"type": "BOOKMARK", "object": {"kind": "Bookmark", "metadata": {"resourceVersion": "1"}}}
        if method == "GET" and path in _LISTED:
            return self._list(_LISTED[path], urllib.parse.parse_qs(query))
        if method == "GET" and (match := _NODE.match(path)) is not None:
            node = next((n for n in self.custom.get("nodes", []) if n["metadata"]["name"] == match["name"]), None)
            if node is None:
                return 404, _status(404, "NotFound", f'nodes "{match["name"]}" not found')
            return 200, node
        if (match := _LEASES.match(path)) is not None:
            return self._lease(method, match["ns"], match["name"] or (body or {}).get("metadata", {}).get("name"), body)
        if method == "GET" and (match := _NAMESPACE.match(path)) is not None:
            if match["ns"] in self.deleted_namespaces:
                return 404, _status(404, "NotFound", f'namespaces "{match["ns"]}" not found')
            return 200, {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": match["ns"], "uid": self.namespace_uid(match["ns"])},
            }
        if method == "POST" and (match := _EVENTS.match(path)) is not None:
            if not self.events_up:
                return 503, _status(503, "ServiceUnavailable", "events are down")
            # The API server's own rule: an Event's namespace must be its object's, else it is refused (422).
            if (
                body["metadata"].get("namespace") != match["ns"]
                or (body["involvedObject"].get("namespace") or "default") != match["ns"]
            ):
                return 422, _status(
                    422, "Invalid", "involvedObject.namespace: Invalid value: does not match event.namespace"
                )
            self.events.append(body)
            return 201, body
        return 404, _status(404, "NotFound", f"{method} {path} is not faked")

    def _list(self, kind: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        """A list, a page of `limit` at a time when asked (as the API server pages it, the rest under a continue token;
        an unknown token is answered 410, as an expired one is)."""
        token = (query.get("continue") or [""])[0]
        if token:
            if token not in self._pages:
                return 410, _status(410, "Expired", "the provided continue parameter is too old")
            items, version = self._pages.pop(token)
        else:
            items = list(self.pods.values()) if kind == "pods" else list(self.custom.get(kind, []))
            selector = (query.get("fieldSelector") or [""])[0]
            if selector.startswith("spec.nodeName="):  # the one field selector listed across namespaces
                items = [item for item in items if item["spec"].get("nodeName") == selector[len("spec.nodeName="):]]
            version = str(next(self._versions))
        metadata: dict[str, Any] = {"resourceVersion": version}
        limit = int((query.get("limit") or ["0"])[0] or 0)
        if 0 < limit < len(items):
            metadata["continue"] = rest = secrets.token_hex(8)
            self._pages[rest] = (items[limit:], version)
            items = items[:limit]
        return 200, {"kind": "List", "metadata": metadata, "items": items}

    def _json_patch(self, pod: dict[str, Any], operations: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        """A JSON patch of `test` and `remove` operations on the pod's metadata, all or nothing (422 when a test
        fails)."""
        patched = json.loads(json.dumps(pod))
        for operation in operations:
            *parents, last = operation["path"].strip("/").split("/")
            target: Any = patched
            for part in parents:
                target = target[int(part)] if isinstance(target, list) else target[part]
            key: Any = int(last) if isinstance(target, list) else last
            if operation["op"] == "test":
                present = key < len(target) if isinstance(target, list) else key in target
                if not present or target[key] != operation["value"]:
                    return 422, _status(422, "Invalid", f"the test of {operation['path']} failed")
            if operation["op"] == "remove":
                del target[key]
        pod.clear()
        pod.update(patched)
        self.patched.append(operations)
        return 200, pod

    def _lease(self, method: str, namespace: str, name: str, body: Any) -> tuple[int, dict[str, Any]]:
        """A Lease's get, create and update, each update refused (409) unless it carries the current resourceVersion."""
        key, lease = (namespace, name), self.leases.get((namespace, name))
        if method == "GET":
            return (200, lease) if lease else (404, _status(404, "NotFound", f'leases "{name}" not found'))
        if method == "POST" and lease is None or method == "PUT" and lease is not None:
            if (
                method == "PUT"
                and lease is not None
                and body["metadata"].get("resourceVersion") != lease["metadata"]["resourceVersion"]
            ):
                return 409, _status(
                    409, "Conflict", "the object has been modified; please apply your changes to the latest version"
                )
            stored = {
                **body,
                "metadata": {**body["metadata"], "namespace": namespace, "resourceVersion": str(next(self._versions))},
            }
            self.leases[key] = stored
            return (201 if method == "POST" else 200), stored
        return (
            (409, _status(409, "AlreadyExists", f'leases "{name}" already exists'))
            if lease
            else (404, _status(404, "NotFound", name))
        )


def main() -> int:
    """`python -m demo.kubeapi`: the stand-in API alone, for docker-compose's controller (compose/kubeconfig), until
    SIGTERM."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description="A stand-in Kubernetes API for the demo's controller (not a cluster).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6443)
    args = parser.parse_args()
    fake = FakeKube(host=args.host, port=args.port)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    print(f"stand-in Kubernetes API on {fake.url}", flush=True)
    try:
        stopping.wait()
    except KeyboardInterrupt:
        pass
    fake.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
