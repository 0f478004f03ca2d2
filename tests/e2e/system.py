"""The project installed on a real control plane: its manifests applied, its webhook and timekeeper on loopback.

Everything `kubectl kustomize manifests/` renders is created as it is (the cert-manager objects aside: no
cert-manager runs here), except that the webhook configurations' clientConfig points at the webhook on loopback
with its CA. The timekeeper runs in `tokenreview` mode and the webhook watches resource claims, each with the
kubeconfig of its own ServiceAccount (found through KUBECONFIG), so the RBAC of manifests/ is what lets them work.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
from kubernetes import utils

from demo.processes import Service, free_port
from gpusharing.contract import TIMEKEEPER_TOKEN_AUDIENCE
from gpusharing.serving.certs import make_serving_certificate
from tests.e2e.controlplane import ControlPlane, write_kubeconfig
from tests.kustomize import installable_manifests, kustomize

SYSTEM_NAMESPACE = "gpusharing-system"
WEBHOOK_REFRESH_SECONDS = 0.2
DEMOTION_INTERVAL_SECONDS = 0.5
WAIT_SECONDS = 60  # only stops a broken test from hanging; never a speed check

T = TypeVar("T")


class ApiError(Exception):
    """The API server refused a call; `message` is its Status message (a webhook's denial among them)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def wait_for(condition: Callable[[], T], what: str, timeout: float = WAIT_SECONDS) -> T:
    """The first truthy value of `condition()`; fails the test, saying what it waited for, when none comes in time."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class GpuSharing:
    """The project on `plane`; `timekeeper_env` and `webhook_env` add to (or change) the settings each role runs with."""

    def __init__(self, plane: ControlPlane, directory: Path, timekeeper_env: dict[str, str] | None = None,
                 webhook_env: dict[str, str] | None = None, webhook_threads: int = 4):
        self.plane = plane
        self.directory = directory
        self.timekeeper_env = timekeeper_env or {}
        self.webhook_env = webhook_env or {}
        self.webhook_threads = webhook_threads
        self.api = plane.api_client()
        self.session = plane.admin_session()
        self.manifests = kustomize(installable_manifests(directory))
        self.timekeeper_url = ""
        self.webhook_url = ""
        self._names = itertools.count(1)
        self._stack = ExitStack()

    # --- installation -------------------------------------------------------------------------------------------

    def start(self) -> None:
        for obj in self.manifests:
            if not obj["apiVersion"].startswith("cert-manager.io/") and not obj["kind"].endswith("WebhookConfiguration"):
                utils.create_from_dict(self.api, obj)
        for crd in (o for o in self.manifests if o["kind"] == "CustomResourceDefinition"):
            path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
            wait_for(lambda: any(c["type"] == "Established" and c["status"] == "True"
                                 for c in self.rest("GET", path).get("status", {}).get("conditions", [])), f"{path} established")
        self.timekeeper_url, self.timekeeper = self.start_timekeeper()
        self.webhook_url, ca_pem = self._start_webhook()
        self.ca_bundle = base64.b64encode(ca_pem).decode()
        for configuration in self.webhook_configurations():
            self.rest("POST", _collection(configuration), configuration)

    def webhook_configurations(self, url: str | None = None, objects: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The webhook configurations of `objects` (default: the manifests'), their clientConfig pointed at `url`
        (default: the loopback webhook)."""
        configurations = []
        for configuration in (o for o in (self.manifests if objects is None else objects) if o["kind"].endswith("WebhookConfiguration")):
            configuration = copy.deepcopy(configuration)
            for webhook in configuration["webhooks"]:
                path = webhook["clientConfig"]["service"]["path"]
                webhook["clientConfig"] = {"url": f"{url or self.webhook_url}{path}", "caBundle": self.ca_bundle}
            configurations.append(configuration)
        return configurations

    def start_timekeeper(self, name: str = "timekeeper") -> tuple[str, Service]:
        """A `gpusharing timekeeper serve` process on the one database (another replica, when one runs already)."""
        kubeconfig = write_kubeconfig(
            self.directory / f"{name}.kubeconfig",
            self.plane.url,
            self.plane.ca_file,
            {"token": self.token(SYSTEM_NAMESPACE, "gpusharing-timekeeper", audience=None)},
        )
        database = self.timekeeper_env.get("TIMEKEEPER_DATABASE_URL", f"sqlite:///{self.directory / 'timekeeper.sqlite'}")
        subprocess.run(
            [sys.executable, "-m", "gpusharing.cli", "db", "upgrade"],
            env={**os.environ, "TIMEKEEPER_DATABASE_URL": database}, check=True, capture_output=True,
        )
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {
            "TIMEKEEPER_DATABASE_URL": database,
            "TIMEKEEPER_AUTH": "tokenreview",
            "TIMEKEEPER_KUBECONFIG": "",  # found through KUBECONFIG, as the Kubernetes client finds it
            "KUBECONFIG": str(kubeconfig),
            "TIMEKEEPER_DEMOTION_INTERVAL_SECONDS": str(DEMOTION_INTERVAL_SECONDS),
            **self.timekeeper_env,
        }
        args = ["timekeeper", "serve", "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--threads", "8"]
        log = self.directory / f"{name}.log"
        return url, self._stack.enter_context(Service(name, args, f"{url}/readyz", env=env, log_path=log))

    def _start_webhook(self) -> tuple[str, bytes]:
        certificate = make_serving_certificate(["127.0.0.1", "localhost"])
        paths = certificate.write(self.directory / "webhook-tls")
        token_file = self.directory / "webhook-token"
        token_file.write_text(self.token(SYSTEM_NAMESPACE, "gpusharing-webhook"))
        kubeconfig = write_kubeconfig(
            self.directory / "webhook.kubeconfig",
            self.plane.url,
            self.plane.ca_file,
            {"token": self.token(SYSTEM_NAMESPACE, "gpusharing-webhook", audience=None)},
        )
        port = free_port()
        url = f"https://127.0.0.1:{port}"
        env = {
            "GPUSHARING_TIMEKEEPER_URL": self.timekeeper_url,
            "GPUSHARING_TIMEKEEPER_TOKEN_FILE": str(token_file),
            "GPUSHARING_BUDGET_REFRESH_SECONDS": str(WEBHOOK_REFRESH_SECONDS),
            "GPUSHARING_KUBECONFIG": "",  # found through KUBECONFIG, as the Kubernetes client finds it
            "KUBECONFIG": str(kubeconfig),
            **self.webhook_env,
        }
        args = ["webhook", "serve", "--host", "127.0.0.1", "--port", str(port), "--cert", str(paths["cert"]),
                "--key", str(paths["key"]), "--workers", "1", "--threads", str(self.webhook_threads)]
        log = self.directory / "webhook.log"
        self.webhook = self._stack.enter_context(
            Service("webhook", args, f"{url}/readyz", env=env, verify=str(paths["ca"]), log_path=log)
        )
        return url, certificate.ca_pem

    def stop(self) -> None:
        self._stack.close()

    def __enter__(self) -> "GpuSharing":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the Kubernetes API ---------------------------------------------------------------------------------------

    def rest(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None, patch: str = "") -> Any:
        """One call to the API server as the cluster admin; the answer's JSON, or ApiError with the server's Status."""
        content_type = {
            "": "application/json", "merge": "application/merge-patch+json", "strategic": "application/strategic-merge-patch+json",
        }[patch]
        response = self.session.request(
            method, f"{self.plane.url}{path}", params=query, data=None if body is None else json.dumps(body),
            headers={"Content-Type": content_type, "Accept": "application/json"}, timeout=60,
        )
        if response.status_code >= 300:
            raise ApiError(response.status_code, response.json().get("message", response.text))
        return response.json()

    def stored(self, obj: dict[str, Any]) -> dict[str, Any]:
        """The cluster-scoped object of `obj`'s kind and name as the API server holds it."""
        return dict(self.rest("GET", f"{_collection(obj)}/{obj['metadata']['name']}"))

    def replace(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Creates a cluster-scoped object, or replaces the one of its name; ApiError carries the API server's refusal."""
        query = {"dryRun": "All"} if dry_run else None
        path = f"{_collection(obj)}/{obj['metadata']['name']}"
        if self._exists(path):
            current = self.stored(obj)["metadata"]["resourceVersion"]
            replacement = {**obj, "metadata": {**obj["metadata"], "resourceVersion": current}}
            return dict(self.rest("PUT", path, replacement, query))
        return dict(self.rest("POST", _collection(obj), obj, query))

    def namespace(self, prefix: str) -> str:
        """A new namespace of its own for one test, with its default ServiceAccount ready."""
        name = f"{prefix}-{next(self._names)}"
        self.rest("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        if not self.plane.runs_controllers:  # what the ServiceAccount controller would do
            self.service_account(name, "default")
        wait_for(lambda: self._exists(f"/api/v1/namespaces/{name}/serviceaccounts/default"), f"the default ServiceAccount of {name}")
        return name

    def require_controllers(self) -> None:
        if not self.plane.runs_controllers:
            pytest.skip("this test needs kube-controller-manager, which KUBEBUILDER_ASSETS does not hold")

    def service_account(self, namespace: str, name: str) -> None:
        self.rest("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})

    def token(
        self, namespace: str, service_account: str, audience: str | None = TIMEKEEPER_TOKEN_AUDIENCE, pod: dict[str, Any] | None = None
    ) -> str:
        """A token from the TokenRequest API, for `audience` (None: the API server's own), bound to `pod` if given."""
        spec: dict[str, Any] = {"expirationSeconds": 3600}
        if audience:
            spec["audiences"] = [audience]
        if pod:
            spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
        answer = self.rest("POST", path, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        return str(answer["status"]["token"])

    def create(self, namespace: str, manifest: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Creates a Pod, Job, Deployment, PodDisruptionBudget or resource claim (template); ApiError carries the
        API server's refusal."""
        return self.rest("POST", _collection(manifest, namespace), manifest, {"dryRun": "All"} if dry_run else None)

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        return list(self.rest("GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector} if selector else None)["items"])

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.rest("GET", f"/api/v1/namespaces/{namespace}/pods/{name}"))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def _exists(self, path: str) -> bool:
        try:
            self.rest("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # --- the timekeeper ------------------------------------------------------------------------------------------

    def timekeeper_call(self, method: str, path: str, token: str | None, body: Any = None) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return requests.request(method, f"{self.timekeeper_url}{path}", json=body, headers=headers, timeout=30)

    def budget_admin_token(self) -> str:
        """A token of a ServiceAccount bound to the manifests' gpusharing-budget-admin ClusterRole."""
        if not hasattr(self, "_admin_token"):
            namespace = self.namespace("e2e-admins")
            self.service_account(namespace, "budget-admin")
            self.rest("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": f"e2e-budget-admin-{namespace}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpusharing-budget-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": "budget-admin", "namespace": namespace}],
            })
            self._admin_token = self.token(namespace, "budget-admin")
        return self._admin_token

    def set_budget(self, namespace: str, gpu_minutes: float, evict: bool = False) -> dict[str, Any]:
        body = {"gpuMinutes": gpu_minutes, "period": "monthly", "evictOnExhaustion": evict}
        answer = self.timekeeper_call("PUT", f"/api/v1/budgets/{namespace}", self.budget_admin_token(), body)
        assert answer.status_code in (200, 201), answer.text
        return dict(answer.json())

    def top_up(self, namespace: str, gpu_minutes: float) -> None:
        body = {"gpuMinutes": gpu_minutes, "reason": "e2e"}
        answer = self.timekeeper_call("POST", f"/api/v1/budgets/{namespace}/top-ups", self.budget_admin_token(), body)
        assert answer.status_code == 201, answer.text

    def report(self, pod: dict[str, Any], token: str, gpu_seconds: float, seq: int = 1, final: bool = False) -> requests.Response:
        """A meter's report for `pod`, as its injected meter would send it."""
        metadata = pod["metadata"]
        body = {
            "podUid": metadata["uid"], "namespace": metadata["namespace"], "pod": metadata["name"],
            "gpuShare": float(metadata["annotations"]["gpusharing.io/gpu-share"]), "seq": seq,
            "gpuSeconds": gpu_seconds, "final": final,
        }
        return self.timekeeper_call("POST", "/api/v1/reports", token, body)

    def webhook_state(self, namespace: str, probe: dict[str, Any]) -> str:
        """The budget state the webhook now gives a GPU pod of `namespace` (a dry-run create through the API server)."""
        probe = {**probe, "metadata": {**probe["metadata"], "name": "budget-state-probe"}}
        created = self.create(namespace, probe, dry_run=True)
        return str(created["metadata"]["annotations"]["gpusharing.io/budget-state"])


def _collection(manifest: dict[str, Any], namespace: str | None = None) -> str:
    group_version, kind = manifest["apiVersion"], manifest["kind"].lower()
    plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "es" if kind.endswith("s") else kind + "s"
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
