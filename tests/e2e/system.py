"""The project installed on a real control plane: its manifests applied, its webhook and timekeeper on loopback.

Everything `kubectl kustomize manifests/crds` and `manifests/` render is created as it is, except that the webhook
configurations' clientConfig points at the webhook on loopback with its CA (no kubelet runs the certgen's Job here:
tests/e2e/test_certgen.py runs the certgen itself). The timekeeper runs in `tokenreview` mode and the webhook
watches resource claims, each with the kubeconfig of a ServiceAccount of manifests/ (found through KUBECONFIG), so
the RBAC of manifests/ is what lets them work.

The web timekeeper (`timekeeper serve`) runs with its own ServiceAccount's kubeconfig (gpusharing-timekeeper), the
controller (`timekeeper controller`) with the controller's (gpusharing-controller, which the webhook lets remove the
billing finalizer), so each is held to its own RBAC.
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
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
from kubernetes import client, utils
from kubernetes.client.exceptions import ApiException

from demo.processes import Service, free_port
from gpusharing.contract import BILLING_FINALIZER, TIMEKEEPER_TOKEN_AUDIENCE
from gpusharing.serving.certs import make_serving_certificate
from tests.e2e.controlplane import ControlPlane, write_kubeconfig
from tests.e2e.link import Link
from tests.helm import render
from tests.kustomize import crds, installable_manifests, kustomize

SYSTEM_NAMESPACE = "gpusharing-system"
WEBHOOK_REFRESH_SECONDS = 0.2
# The controller's tasks other than billing run every half second here (billing's tests set their own interval).
TASK_INTERVALS = {name: "0.5" for name in ("TIMEKEEPER_DEMOTION_INTERVAL_SECONDS", "TIMEKEEPER_STATUS_INTERVAL_SECONDS",
                                           "TIMEKEEPER_ENDED_INTERVAL_SECONDS", "TIMEKEEPER_IDLE_INTERVAL_SECONDS",
                                           "TIMEKEEPER_SILENT_METERS_INTERVAL_SECONDS")}
WAIT_SECONDS = 60  # only stops a broken test from hanging; never a speed check
REPORT_ATTEMPTS = 5  # a meter's report sent again after a 503, as the meter sends it
ALLOWED_PRIORITY_CLASS = "e2e-allowed-high"  # GPUSHARING_ALLOWED_PRIORITY_CLASSES of the webhook
TIMEKEEPER_ACCOUNT = "gpusharing-timekeeper"  # the web timekeeper's ServiceAccount (manifests/base/rbac.yaml)
CONTROLLER_ACCOUNT = "gpusharing-controller"  # the controller's: the cluster work, the Lease, the billing finalizer

T = TypeVar("T")


class ApiError(Exception):
    """The API server refused a call; `message` is its Status message (a webhook's denial among them)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def migrate(database: str) -> None:
    subprocess.run([sys.executable, "-m", "gpusharing.cli", "db", "upgrade"],
                   env={**os.environ, "TIMEKEEPER_DATABASE_URL": database}, check=True, capture_output=True)


def wait_for(
    condition: Callable[[], T], what: str, timeout: float = WAIT_SECONDS, found: Callable[[], str] | None = None
) -> T:
    """The first truthy value of `condition()`; fails the test, saying what it waited for (and what `found` says there
    was instead), when none comes in time."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}" + (f": {found()}" if found is not None else ""))
        time.sleep(0.1)


class GpuSharing:
    """The project on `plane`; `timekeeper_env` and `webhook_env` add to (or change) the settings each role runs with.
    32 webhook threads by default: a burst of pods makes the API server dial connections it then leaves idle, and
    gunicorn's gthread worker holds a thread on each until its first request (4 threads timed out bursts of 40 pods)."""

    def __init__(self, plane: ControlPlane, directory: Path, timekeeper_env: dict[str, str] | None = None,
                 webhook_env: dict[str, str] | None = None, webhook_threads: int = 32):
        self.plane = plane
        self.directory = directory
        self.timekeeper_env = timekeeper_env or {}
        self.database = self.timekeeper_env.get(
            "TIMEKEEPER_DATABASE_URL", f"sqlite:///{directory / 'timekeeper.sqlite'}"
        )
        self.webhook_env = webhook_env or {}
        self.webhook_threads = webhook_threads
        self.api = plane.api_client()
        self.session = plane.admin_session()
        self.manifests = crds() + kustomize(installable_manifests(directory))
        self.timekeeper_url = ""
        self.webhook_url = ""
        self._names = itertools.count(1)
        self._stack = ExitStack()

    # --- installation -------------------------------------------------------------------------------------------

    def start(self) -> None:
        for obj in self.manifests:
            if not obj["kind"].endswith("WebhookConfiguration"):
                utils.create_from_dict(self.api, obj)
        for crd in (o for o in self.manifests if o["kind"] == "CustomResourceDefinition"):
            path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
            wait_for(
                lambda: any(
                    c["type"] == "Established" and c["status"] == "True"
                    for c in self.rest("GET", path).get("status", {}).get("conditions", [])
                ),
                f"{path} established",
            )
        self.timekeeper_url = self._start_timekeeper()
        self.webhook_url, ca_pem = self._start_webhook()
        self.ca_bundle = base64.b64encode(ca_pem).decode()
        for configuration in self.webhook_configurations():
            self.rest("POST", _collection(configuration), configuration)

    def webhook_configurations(
        self, url: str | None = None, objects: list[dict[str, Any]] | None = None
    ) -> list[dict[str, Any]]:
        """The webhook configurations of `objects` (default: the manifests'), their clientConfig pointed at `url`
        (default: the loopback webhook)."""
        configurations = []
        for configuration in (
            o for o in (self.manifests if objects is None else objects) if o["kind"].endswith("WebhookConfiguration")
        ):
            configuration = copy.deepcopy(configuration)
            for webhook in configuration["webhooks"]:
                path = webhook["clientConfig"]["service"]["path"]
                webhook["clientConfig"] = {"url": f"{url or self.webhook_url}{path}", "caBundle": self.ca_bundle}
            configurations.append(configuration)
        return configurations

    def _start_timekeeper(self) -> str:
        # Through a link the tests can cut: the timekeeper losing the API server (its pod watch failing).
        api = urllib.parse.urlsplit(self.plane.url)
        self.timekeeper_link = Link(str(api.hostname), int(api.port or 443))
        self._stack.callback(self.timekeeper_link.close)
        api_url = f"https://127.0.0.1:{self.timekeeper_link.port}"
        self.timekeeper, url = self.timekeeper_service("timekeeper", self.database, api_url=api_url)
        self.controller = self.controller_service("controller", self.database, api_url=api_url)
        return url

    def controller_service(self, name: str, database: str, api_url: str | None = None, **env: str) -> Service:
        """A controller process (`gpusharing timekeeper controller`) on loopback with the manifests' ServiceAccount
        (the system's `timekeeper_env`, and `env` on top), started once its caches have listed the cluster; stopped
        with the system at the latest. The database must be migrated (timekeeper_service does)."""
        kubeconfig = self.service_account_kubeconfig(name, CONTROLLER_ACCOUNT, api_url)
        port = free_port()
        settings = {"TIMEKEEPER_DATABASE_URL": database, "TIMEKEEPER_KUBECONFIG": "", "KUBECONFIG": str(kubeconfig),
                    **TASK_INTERVALS, **self.timekeeper_env, **env}
        args = ["timekeeper", "controller", "--host", "127.0.0.1", "--port", str(port)]
        return self._stack.enter_context(Service(name, args, f"http://127.0.0.1:{port}/readyz", env=settings,
                                                 log_path=self.directory / f"{name}.log"))

    def controller_metrics(self) -> str:
        """The system's controller's /metrics (what it did: evictions, idle actions, its tasks)."""
        return requests.get(self.controller.ready_url.replace("/readyz", "/metrics"), timeout=10).text

    @contextmanager
    def timekeeper_settings(self, **env: str) -> Iterator[None]:
        """Meanwhile, the system's timekeeper and controller run with `env` on top of their settings."""
        services = (self.timekeeper, self.controller)
        before = [dict(service.env) for service in services]
        for service in services:
            service.stop()
            service.env.update(env)
        for service in services:
            service.__enter__()
        try:
            yield
        finally:
            for service, settings in zip(services, before):
                service.stop()
                service.env = settings
            for service in services:
                service.__enter__()

    @contextmanager
    def fair_share(self, **env: str) -> Iterator[None]:
        """Meanwhile, fair share is on (docs/fair-share.md): the chart's objects of fairShare.enabled installed (the
        bands' classes, the controller's read of nodes), and the timekeeper and its controller run with fair share
        enabled and `env`, on a ledger of their own: the earlier tests' namespaces, with use and budgets of their
        own, would be every new team's siblings in the tree."""
        added = []
        for obj in render({"fairShare": {"enabled": True}}):
            if obj["kind"] == "PriorityClass" and not self.exists(f"{_collection(obj)}/{obj['metadata']['name']}"):
                self.rest("POST", _collection(obj), obj)
                added.append(obj["metadata"]["name"])
            elif obj["kind"] == "ClusterRole" and obj["metadata"]["name"] == "gpusharing-controller":
                self.replace(obj)
        settings = {
            "TIMEKEEPER_FAIRSHARE_ENABLED": "true",
            "TIMEKEEPER_DATABASE_URL": self.fresh_database("fair-share"),
            **env,
        }
        try:
            with self.timekeeper_settings(**settings):
                yield
        finally:
            for name in added:
                self.rest("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")

    def service_account_kubeconfig(self, name: str, service_account: str, api_url: str | None = None) -> Path:
        """A kubeconfig (`name`.kubeconfig in the system's directory) with a token of the manifests' `service_account`
        in the system's namespace, for the API server at `api_url` (default: the control plane's)."""
        return write_kubeconfig(
            self.directory / f"{name}.kubeconfig",
            api_url or self.plane.url,
            self.plane.ca_file,
            {"token": self.token(SYSTEM_NAMESPACE, service_account, audience=None)},
        )

    def fresh_database(self, name: str) -> str:
        """A new SQLite database in the system's directory (one of that name before is removed), migrated: a ledger
        no earlier test has used."""
        path = self.directory / f"{name}.sqlite"
        path.unlink(missing_ok=True)
        database = f"sqlite:///{path}"
        migrate(database)
        return database

    def timekeeper_service(
        self, name: str, database: str, upgrade: bool = True, api_url: str | None = None, **env: str
    ) -> tuple[Service, str]:
        """A web timekeeper process on loopback as the manifests' ServiceAccount of the timekeeper (the system's
        `timekeeper_env`, and `env` on top), started; stopped with the system at the latest."""
        kubeconfig = self.service_account_kubeconfig(name, TIMEKEEPER_ACCOUNT, api_url)
        if upgrade:
            migrate(database)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        settings = {
            "TIMEKEEPER_DATABASE_URL": database,
            "TIMEKEEPER_AUTH": "tokenreview",
            "TIMEKEEPER_KUBECONFIG": "",  # found through KUBECONFIG, as the Kubernetes client finds it
            "KUBECONFIG": str(kubeconfig),
            **self.timekeeper_env,
            **env,
        }
        args = ["timekeeper", "serve", "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--threads", "8"]
        log = self.directory / f"{name}.log"
        service = self._stack.enter_context(Service(name, args, f"{url}/readyz", env=settings, log_path=log))
        return service, url

    def _start_webhook(self) -> tuple[str, bytes]:
        certificate = make_serving_certificate(["127.0.0.1", "localhost"])
        paths = certificate.write(self.directory / "webhook-tls")
        port = free_port()
        self.webhook_ca_file = str(paths["ca"])
        self.webhook = self._stack.enter_context(
            self.webhook_service("webhook", port, paths["cert"], paths["key"], verify=str(paths["ca"]))
        )
        return f"https://127.0.0.1:{port}", certificate.ca_pem

    def webhook_service(self, name: str, port: int, cert: Path, key: Path, verify: str | bool) -> Service:
        """A webhook on 127.0.0.1:`port` serving `cert` and `key`, with the tokens of the manifests' webhook
        ServiceAccount and the loopback timekeeper; started by entering it."""
        token_file = self.directory / f"{name}-token"
        token_file.write_text(self.token(SYSTEM_NAMESPACE, "gpusharing-webhook"))
        kubeconfig = write_kubeconfig(
            self.directory / f"{name}.kubeconfig",
            self.plane.url,
            self.plane.ca_file,
            {"token": self.token(SYSTEM_NAMESPACE, "gpusharing-webhook", audience=None)},
        )
        env = {
            "GPUSHARING_TIMEKEEPER_URL": self.timekeeper_url,
            "GPUSHARING_TIMEKEEPER_TOKEN_FILE": str(token_file),
            "GPUSHARING_BUDGET_REFRESH_SECONDS": str(WEBHOOK_REFRESH_SECONDS),
            "GPUSHARING_KUBECONFIG": "",  # found through KUBECONFIG, as the Kubernetes client finds it
            "KUBECONFIG": str(kubeconfig),
            # The API server's client certificate (its AdmissionConfiguration): no one else is answered.
            "GPUSHARING_CLIENT_CA_FILE": str(self.plane.webhook_client_ca),
            "GPUSHARING_ALLOWED_PRIORITY_CLASSES": ALLOWED_PRIORITY_CLASS,
            **self.webhook_env,
        }
        args = ["webhook", "serve", "--host", "127.0.0.1", "--port", str(port), "--cert", str(cert),
                "--key", str(key), "--workers", "1", "--threads", str(self.webhook_threads)]
        return Service(
            name,
            args,
            f"https://127.0.0.1:{port}/readyz",
            env=env,
            verify=verify,
            log_path=self.directory / f"{name}.log",
        )

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

    def rest(
        self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None, patch: str = ""
    ) -> Any:
        """One call to the API server as the cluster admin; the answer's JSON, or ApiError with the server's Status."""
        content_type = {
            "": "application/json",
            "merge": "application/merge-patch+json",
            "strategic": "application/strategic-merge-patch+json",
            "json": "application/json-patch+json",
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
        """Creates a cluster-scoped object, or replaces the one of its name; ApiError carries the API server's
        refusal."""
        query = {"dryRun": "All"} if dry_run else None
        path = f"{_collection(obj)}/{obj['metadata']['name']}"
        if self.exists(path):
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
        wait_for(
            lambda: self.exists(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
            f"the default ServiceAccount of {name}",
        )
        return name

    def require_controllers(self) -> None:
        if not self.plane.runs_controllers:
            pytest.skip("this test needs kube-controller-manager, which KUBEBUILDER_ASSETS does not hold")

    def bind(self, namespace: str, service_account: str, cluster_role: str) -> None:
        """A new ServiceAccount holding `cluster_role` in `namespace` alone (a RoleBinding of its name)."""
        self.service_account(namespace, service_account)
        self.rest("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": service_account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        })

    def service_account(self, namespace: str, name: str) -> None:
        self.rest(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        )

    def core_api_as(self, namespace: str, service_account: str) -> client.CoreV1Api:
        """The official client's core API with a ServiceAccount's own token: what RBAC grants it, and nothing more."""
        kubeconfig = write_kubeconfig(
            self.directory / f"{namespace}.{service_account}.kubeconfig",
            self.plane.url,
            self.plane.ca_file,
            {"token": self.token(namespace, service_account, audience=None)},
        )
        return client.CoreV1Api(self.plane.api_client(kubeconfig))

    def namespace_admin(self, namespace: str) -> client.CoreV1Api:
        """A tenant's administrator: a ServiceAccount with the built-in `admin` ClusterRole bound in `namespace` alone
        (that role is aggregated by a controller, so the caller needs kube-controller-manager)."""
        self.bind(namespace, "tenant-admin", "admin")
        api = self.core_api_as(namespace, "tenant-admin")
        wait_for(
            lambda: _allowed(lambda: api.list_namespaced_pod(namespace)), f"the admin of {namespace} to list its pods"
        )
        return api

    def release(self, namespace: str, name: str) -> None:
        """Removes the billing finalizer from a pod as a cluster admin would (the timekeeper does once the pod's bill
        is closed), if the pod still carries it."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"

        def released() -> bool:
            pod = self.pod(namespace, name)
            finalizers = pod["metadata"].get("finalizers", []) if pod else []
            if BILLING_FINALIZER not in finalizers:
                return True
            at = f"/metadata/finalizers/{finalizers.index(BILLING_FINALIZER)}"
            try:  # tested first: the timekeeper may be removing it at the same time
                self.rest(
                    "PATCH",
                    path,
                    [{"op": "test", "path": at, "value": BILLING_FINALIZER}, {"op": "remove", "path": at}],
                    patch="json",
                )
            except ApiError as exc:
                if exc.status not in (404, 409, 422):
                    raise
                return False
            return True

        wait_for(released, f"the billing finalizer of pod {namespace}/{name} removed")

    def token(
        self,
        namespace: str,
        service_account: str,
        audience: str | None = TIMEKEEPER_TOKEN_AUDIENCE,
        pod: dict[str, Any] | None = None,
    ) -> str:
        """A token from the TokenRequest API, for `audience` (None: the API server's own), bound to `pod` if given."""
        spec: dict[str, Any] = {"expirationSeconds": 3600}
        if audience:
            spec["audiences"] = [audience]
        if pod:
            spec["boundObjectRef"] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            }
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
        answer = self.rest(
            "POST", path, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        )
        return str(answer["status"]["token"])

    def create(self, namespace: str, manifest: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Creates a Pod, Job, Deployment, PodDisruptionBudget or resource claim (template); ApiError carries the
        API server's refusal."""
        return self.rest("POST", _collection(manifest, namespace), manifest, {"dryRun": "All"} if dry_run else None)

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        return list(
            self.rest(
                "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": selector} if selector else None
            )["items"]
        )

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.rest("GET", f"/api/v1/namespaces/{namespace}/pods/{name}"))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def exists(self, path: str) -> bool:
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
            self.rest(
                "POST",
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": f"e2e-budget-admin-{namespace}"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "gpusharing-budget-admin",
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": "budget-admin", "namespace": namespace}],
                },
            )
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

    def report(
        self, pod: dict[str, Any], token: str, gpu_seconds: float, seq: int = 1, final: bool = False
    ) -> requests.Response:
        """A meter's report for `pod`, as its injected meter would send it, and send again after a 503 as it would
        (gpusharing.serving.delivery): a timekeeper that could not review the token in time on a loaded machine."""
        metadata = pod["metadata"]
        body = {
            "podUid": metadata["uid"], "namespace": metadata["namespace"], "pod": metadata["name"],
            "gpuShare": float(metadata["annotations"]["gpusharing.io/gpu-share"]), "seq": seq,
            "gpuSeconds": gpu_seconds, "final": final,
        }
        answer = self.timekeeper_call("POST", "/api/v1/reports", token, body)
        for _ in range(REPORT_ATTEMPTS - 1):
            if answer.status_code != 503:
                break
            time.sleep(1)
            answer = self.timekeeper_call("POST", "/api/v1/reports", token, body)
        return answer

    def webhook_state(self, namespace: str, probe: dict[str, Any]) -> str:
        """The budget state the webhook now gives a GPU pod of `namespace` (a dry-run create through the API server)."""
        probe = {**probe, "metadata": {**probe["metadata"], "name": "budget-state-probe"}}
        created = self.create(namespace, probe, dry_run=True)
        return str(created["metadata"]["annotations"]["gpusharing.io/budget-state"])


def _allowed(call: Callable[[], object]) -> bool:
    """Whether the API server lets the call through (False on 403: RBAC may not have caught up yet)."""
    try:
        call()
    except ApiException as exc:
        if exc.status != 403:
            raise
        return False
    return True


def _collection(manifest: dict[str, Any], namespace: str | None = None) -> str:
    group_version, kind = manifest["apiVersion"], manifest["kind"].lower()
    plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "es" if kind.endswith("s") else kind + "s"
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
