"""The timekeeper's API as the command line reaches it: directly by URL, or through the API server's service proxy of a
kubeconfig's context; every refusal a sentence for the user, with the exit status it deserves."""

from __future__ import annotations

import argparse
import os
import urllib.parse
from typing import Any

from gpusharing.admin.cluster import (
    SYSTEM_NAMESPACE,
    Cluster,
    ClusterRefused,
    ServiceProxy,
    is_kubernetes_status,
    status_message,
)
from gpusharing.serving.jsonhttp import Answer, JsonClient, Unreachable
from gpusharing.settings.env import env_url

DEFAULT_URL = "http://127.0.0.1:8080"


URL_ENV = "TIMEKEEPER_URL"


TOKEN_ENV = "TIMEKEEPER_TOKEN"


BAD_ARGUMENTS = 2  # the exit status of arguments or settings that cannot be used (argparse's own)


NOT_FOUND = 3  # the exit status when what was named does not exist


class Refused(Exception):
    """A server could not be reached or refused the request; the message is a sentence for the user."""

    exit_status = 1


class NotFound(Refused):
    exit_status = NOT_FOUND


class BadArguments(Refused):
    exit_status = BAD_ARGUMENTS


class TimekeeperClient:
    """The API as the options and the environment say where it is and who asks; the cluster of the kubeconfig's
    context when a kubectl plugin runs, or --kubeconfig or --context is given."""

    def __init__(self, args: argparse.Namespace, cluster_needed: bool = False) -> None:
        def option(name: str) -> Any:  # options absent from a parser read as not given
            return getattr(args, name, None)

        self.system_namespace = option("system_namespace") or SYSTEM_NAMESPACE
        self.cluster: Cluster | None = None
        if cluster_needed or option("plugin") or option("kubeconfig") or option("context"):
            self.cluster = Cluster.from_kubeconfig(option("kubeconfig"), option("context"))
        url = option("timekeeper") or env_url(URL_ENV)
        self._http: JsonClient | ServiceProxy
        if url or self.cluster is None:
            self.url = str(url or DEFAULT_URL)
            self._http = JsonClient(self.url)
        else:
            self.url = f"the service proxy of {self.cluster.server} (context {self.cluster.context})"
            self._http = self.cluster.timekeeper(self.system_namespace)
        self.token = option("token") or os.environ.get(TOKEN_ENV, "").strip() or None
        self._no_token = ""
        # Asked of the API server at the first call, so that arguments refused before it are refused without a request.
        self._token_pending = self.token is None and self.cluster is not None

    def _cluster_token(self) -> None:
        assert self.cluster is not None
        self._token_pending = False
        try:
            self.token, self._no_token = self.cluster.timekeeper_token(self.system_namespace)
        except ClusterRefused as exc:
            raise Refused(str(exc)) from None

    def call(
        self, method: str, path: str, body: dict[str, Any] | None = None, query: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """The API's JSON answer (`timeout`: how long to wait for it; None: the client's default)."""
        answer = self._answer(method, path, body, query, timeout)
        if answer.status == 204:
            return None
        body_read = answer.json()
        if body_read is None:
            raise Refused(f"{self.url} answered {answer.status} without JSON: is it the timekeeper's URL?")
        return body_read

    def download(self, path: str, query: dict[str, str] | None = None, timeout: float | None = None) -> bytes:
        """A document the API answers as it is (a CSV export), not as JSON."""
        return self._answer("GET", path, None, query, timeout).body

    def _answer(
        self, method: str, path: str, body: dict[str, Any] | None, query: dict[str, str] | None,
        timeout: float | None = None,
    ) -> Answer:
        if self._token_pending:
            self._cluster_token()
        try:
            answer = self._http.request(method, f"/api/v1/{path}", body, self.token, query=query, timeout=timeout)
        except Unreachable as exc:
            raise Refused(f"cannot reach the timekeeper at {self.url}: {exc}{self._where_hint(exc)}") from None
        except ClusterRefused as exc:
            raise Refused(str(exc)) from None
        if is_kubernetes_status(answer):  # the API server's answer, not the timekeeper's
            raise Refused(f"the API server did not reach the timekeeper ({answer.status}): {status_message(answer)}"
                           f"{self._proxy_hint(answer)}")
        if answer.status == 401:
            if self.token is None:
                hint = "give a token with --token or TIMEKEEPER_TOKEN" + (
                    f" ({self._no_token})" if self._no_token else ""
                )
            else:
                hint = "the token given (--token or TIMEKEEPER_TOKEN) was not accepted"
            raise Refused(f"the timekeeper refused (401): {answer.message}: {hint}")
        if answer.status == 404:
            raise NotFound(f"the timekeeper refused (404): {answer.message or answer.reason}")
        if answer.status >= 400:
            raise Refused(f"the timekeeper refused ({answer.status}): {answer.message or answer.reason}")
        return answer

    def _where_hint(self, exc: Unreachable) -> str:
        if "connection refused" in str(exc) and self.url == DEFAULT_URL:
            return (f" (give its URL with --timekeeper or {URL_ENV}; on a cluster, use `kubectl gpusharing`, which "
                    "reaches it through the API server, or `kubectl -n gpusharing-system port-forward "
                    "svc/gpusharing-timekeeper 8080`)")
        return ""

    def _proxy_hint(self, answer: Answer) -> str:
        if answer.status in (404, 503):
            return (f": is kube-gpusharing installed in namespace {self.system_namespace} (--system-namespace) and its "
                    "timekeeper running?")
        return ""

    def pod_events(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        """The Events about the pod of `uid` (none when the caller may not read its namespace's Events)."""
        assert self.cluster is not None
        query = urllib.parse.urlencode({"fieldSelector": f"involvedObject.uid={uid}"})
        try:
            answer = self.cluster.get(f"/api/v1/namespaces/{namespace}/events?{query}")
        except ClusterRefused:
            return []
        items = answer.json().get("items") if answer.status == 200 else None
        return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        """The pod as the API server of the kubeconfig's context has it."""
        assert self.cluster is not None
        try:
            answer = self.cluster.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ClusterRefused as exc:
            raise Refused(str(exc)) from None
        if answer.status == 404:
            raise NotFound(f"pod {name} not found in namespace {namespace}")
        if answer.status >= 400:
            raise Refused(f"the API server refused ({answer.status}): {status_message(answer)}")
        return dict(answer.json())

