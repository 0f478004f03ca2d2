"""The cluster of a kubeconfig's context, as kubectl plugins reach it: its API server with the context's credentials,
the timekeeper behind the API server's service proxy, and a token for the timekeeper.

The kubeconfig is read by the official client, and every request goes through that client's ApiClient, so the
connection is the one the client makes for that context: the server's `proxy-url`, `tls-server-name`,
`insecure-skip-tls-verify` and certificate authority, client certificates, tokens, and exec plugins whose tokens are
fetched again when they expire. The API server authenticates the caller with the Authorization header and drops it
before proxying, so the timekeeper's own token travels in TIMEKEEPER_TOKEN_HEADER.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import urllib.parse
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import urllib3
import yaml

if TYPE_CHECKING:
    from kubernetes import client

from gpusharing.contract import TIMEKEEPER_TOKEN_AUDIENCE, TIMEKEEPER_TOKEN_HEADER
from gpusharing.serving.jsonhttp import Answer, unreachable_reason
from gpusharing.settings.env import ConfigError

SYSTEM_NAMESPACE = "gpusharing-system"
TIMEKEEPER_SERVICE = "http:gpusharing-timekeeper:8080"  # scheme:name:port, as the service proxy names a Service's port
BUDGET_ADMIN = "gpusharing-budget-admin"  # the ServiceAccount of manifests/examples/budget-admin.yaml
TOKEN_SECONDS = 600
DEFAULT_KUBECONFIG = "~/.kube/config"
CONNECT_SECONDS = 5.0
KUBECONFIG_SHAPE = "a YAML mapping of clusters, users and contexts, as `kubectl config view` shows"


class ClusterRefused(Exception):
    """The API server could not be reached, or refused the context's credentials; the message is a sentence for the
    user."""


@dataclass(frozen=True)
class Cluster:
    server: str  # the API server's URL
    namespace: str  # the context's namespace, else default
    context: str
    api: client.ApiClient = field(repr=False)  # the official client, configured as the kubeconfig says
    proxy: str | None = None  # the cluster's proxy-url, to name it when it cannot be reached
    # What the official client logged instead of raising while getting credentials (an exec plugin that failed).
    credential_errors: list[str] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None) -> "Cluster":
        """The context `context` (default: the current one) of `path` (paths joined by ':' are merged, as kubectl
        does; default: KUBECONFIG, else ~/.kube/config); ConfigError in one line saying what to fix when there is
        none or it cannot be used."""
        path = path or os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
        files = [os.path.expanduser(p) for p in path.split(os.pathsep) if p]
        if not any(os.path.exists(f) for f in files):
            raise ConfigError(
                f"no kubeconfig at {path}: give one with --kubeconfig or KUBECONFIG (the file kubectl uses)"
            )
        # Imported here: the official client takes 0.4 s to import, which a command given --timekeeper never needs.
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        configuration = client.Configuration()
        configuration.retries = False  # as kubectl: an unreachable server is said at once, not after retries
        errors: list[str] = []
        try:
            with _client_errors(errors):
                contexts, current = config.list_kube_config_contexts(config_file=path)
                chosen = next((c for c in contexts if c["name"] == context), None) if context else current
                if chosen is not None:
                    config.load_kube_config(
                        config_file=path,
                        context=chosen["name"],
                        client_configuration=configuration,
                        persist_config=False,
                    )
        except ConfigException as exc:
            raise ConfigError(f"cannot use the kubeconfig {path}: {_first_line(exc)}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"the kubeconfig {path} is not valid YAML: {_yaml_problem(exc)}") from None
        except OSError as exc:
            raise ConfigError(f"cannot read the kubeconfig {exc.filename or path}: {exc.strerror or exc}") from None
        except (AttributeError, KeyError, TypeError, ValueError):  # YAML, but not shaped as a kubeconfig
            raise ConfigError(f"the kubeconfig {path} is not a kubeconfig: it must be {KUBECONFIG_SHAPE}") from None
        if chosen is None:
            names = ", ".join(sorted(c["name"] for c in contexts)) or "none"
            raise ConfigError(f"the kubeconfig {path} has no context {context!r}: give --context one of: {names}")
        if not configuration.verify_ssl:  # the kubeconfig asked for it: no warning per request, as kubectl gives none
            warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        return cls(
            server=configuration.host.rstrip("/"),
            namespace=chosen.get("context", {}).get("namespace") or "default",
            context=chosen["name"],
            api=client.ApiClient(configuration),
            proxy=configuration.proxy,
            credential_errors=errors,
        )

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                query: dict[str, str] | None = None, timeout: float = 10.0) -> Answer:
        """One request to the API server with the context's credentials, through the official client; ClusterRefused
        when no answer comes or the API server refuses the credentials (401)."""
        from kubernetes.client.exceptions import ApiException  # loaded with the client, by from_kubeconfig

        sent = {"Accept": "application/json", **(headers or {})}
        if body is not None:
            sent["Content-Type"] = "application/json"
        try:
            with _client_errors(self.credential_errors):  # credentials refreshed now, when an exec plugin's expired
                request = self.api.param_serialize(method, path, query_params=list((query or {}).items()),
                                                   header_params=sent, body=body, auth_settings=["BearerToken"])
                response = self.api.call_api(*request, _request_timeout=(CONNECT_SECONDS, timeout))
                answer = Answer(response.status, response.reason or "", response.read() or b"")
        except (urllib3.exceptions.HTTPError, ApiException, OSError) as exc:
            raise ClusterRefused(self._unreachable(exc, timeout)) from None
        if answer.status == 401 and is_kubernetes_status(answer):
            raise ClusterRefused(self._credentials_refused(answer))
        return answer

    def get(self, path: str) -> Answer:
        return self.request("GET", path)

    def timekeeper(self, system_namespace: str = SYSTEM_NAMESPACE) -> "ServiceProxy":
        """The timekeeper's API through the API server's service proxy."""
        return ServiceProxy(self, f"/api/v1/namespaces/{system_namespace}/services/{TIMEKEEPER_SERVICE}/proxy")

    def timekeeper_token(
        self, system_namespace: str = SYSTEM_NAMESPACE, service_account: str = BUDGET_ADMIN
    ) -> tuple[str | None, str]:
        """A short-lived token of `service_account` for the timekeeper's audience (what `kubectl create token`
        makes), or None and the API server's reason when the context may not have one."""
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"audiences": [TIMEKEEPER_TOKEN_AUDIENCE], "expirationSeconds": TOKEN_SECONDS}}
        path = f"/api/v1/namespaces/{system_namespace}/serviceaccounts/{urllib.parse.quote(service_account)}/token"
        answer = self.request("POST", path, request)
        token = (answer.json() or {}).get("status", {}).get("token") if answer.status == 201 else None
        if isinstance(token, str) and token:
            return token, ""
        return (
            None,
            f"no token of ServiceAccount {system_namespace}/{service_account} ({answer.status}: {answer.message})",
        )

    def _unreachable(self, exc: BaseException, timeout: float) -> str:
        cause, through_proxy = _root_cause(exc)
        where = f"cannot reach the API server {self.server} (context {self.context})"
        if through_proxy and self.proxy:
            proxy = urllib.parse.urlsplit(self.proxy)
            said = unreachable_reason(cause, proxy.hostname or "", proxy.port or 80, self.proxy, timeout)
            return f"{where} through its proxy-url {self.proxy}: {said} (check the proxy-url of the context's cluster)"
        parts = urllib.parse.urlsplit(self.server)
        said = unreachable_reason(cause, parts.hostname or "", parts.port or 443, self.server, timeout)
        if isinstance(cause, ssl.SSLError):
            return (f"{where}: {said} (check the certificate-authority, tls-server-name or insecure-skip-tls-verify of "
                    "the context's cluster)")
        return f"{where}: {said} (check the server of the context's cluster)"

    def _credentials_refused(self, answer: Answer) -> str:
        why = f": {self.credential_errors[-1]}" if self.credential_errors else ""
        return (f"the API server {self.server} refused the credentials of context {self.context} ({answer.status} "
                f"{status_message(answer)}){why}: log in again (renew the user's token, certificate or exec plugin's "
                "login in the kubeconfig), or give another --context")


@dataclass(frozen=True)
class ServiceProxy:
    """A Service's HTTP API behind the API server's service proxy, asked as the core's JsonClient is asked."""

    cluster: Cluster
    prefix: str

    def request(self, method: str, path: str, body: Any = None, token: str | None = None, timeout: float | None = None,
                query: dict[str, str] | None = None) -> Answer:
        headers = {TIMEKEEPER_TOKEN_HEADER: f"Bearer {token}"} if token else {}
        return self.cluster.request(method, self.prefix + path, body, headers, query, timeout or 10.0)


def is_kubernetes_status(answer: Answer) -> bool:
    """Whether the answer is the API server's own refusal (a Status object), not a proxied Service's."""
    body = answer.json()
    return answer.status >= 400 and isinstance(body, dict) and body.get("kind") == "Status"


def status_message(answer: Answer) -> str:
    """The API server's Status message, else its body, on one line."""
    body: Any = answer.json()
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return " ".join(body["message"].split())
    return answer.message


class _Captured(logging.Filter):
    """The official client logs an exec plugin that fails on the root logger and carries on without credentials:
    its message is kept for the line about refused credentials instead of printed beside it."""

    def __init__(self, into: list[str]) -> None:
        super().__init__()
        self.into = into

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "root" and f"{os.sep}kubernetes{os.sep}config{os.sep}" in record.pathname:
            self.into.append(" ".join(record.getMessage().split()))
            return False
        return True


@contextlib.contextmanager
def _client_errors(into: list[str]) -> Iterator[None]:
    captured = _Captured(into)
    root = logging.getLogger()
    root.addFilter(captured)
    try:
        yield
    finally:
        root.removeFilter(captured)


def _root_cause(exc: BaseException) -> tuple[BaseException, bool]:
    """The error under urllib3's wrappers (the refused connection, the certificate check, the unknown host), and
    whether it happened on the way to the proxy."""
    from kubernetes.client.exceptions import ApiException  # loaded with the client, by from_kubeconfig

    through_proxy = False
    while isinstance(exc, (urllib3.exceptions.HTTPError, ApiException)):
        if isinstance(exc, urllib3.exceptions.ProxyError):
            through_proxy = True
        inner = getattr(exc, "reason", None) if isinstance(exc, urllib3.exceptions.MaxRetryError) else None
        inner = inner or getattr(exc, "original_error", None) or exc.__cause__ or exc.__context__
        if not isinstance(inner, BaseException):
            return (TimeoutError() if isinstance(exc, urllib3.exceptions.TimeoutError) else exc), through_proxy
        exc = inner
    return exc, through_proxy


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or _first_line(exc)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
