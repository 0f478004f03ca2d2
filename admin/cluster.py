"""The cluster of a kubeconfig's context, as kubectl plugins reach it: its API server with the context's
credentials, the timekeeper behind the API server's service proxy, and a token for the timekeeper.

The kubeconfig is read by the official client (every way a kubeconfig authenticates: certificates, tokens, exec
plugins); the requests themselves go through the core's JSON client. The API server authenticates the caller with
the Authorization header and drops it before proxying, so the timekeeper's own token travels in
TIMEKEEPER_TOKEN_HEADER.
"""

from __future__ import annotations

import ssl
import urllib.parse
from dataclasses import dataclass
from typing import Any

from gpusharing.contract import TIMEKEEPER_TOKEN_AUDIENCE, TIMEKEEPER_TOKEN_HEADER
from gpusharing.serving.jsonhttp import Answer, JsonClient
from gpusharing.settings.env import ConfigError

SYSTEM_NAMESPACE = "gpusharing-system"
TIMEKEEPER_SERVICE = "http:gpusharing-timekeeper:8080"  # scheme:name:port, as the service proxy names a Service's port
BUDGET_ADMIN = "gpusharing-budget-admin"  # the ServiceAccount of manifests/examples/budget-admin.yaml
TOKEN_SECONDS = 600


@dataclass(frozen=True)
class Cluster:
    server: str  # the API server's URL
    namespace: str  # the context's namespace, else default
    context: str
    ssl_context: ssl.SSLContext | None
    headers: dict[str, str]  # the context's credentials for the API server (a bearer token), if any

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None) -> "Cluster":
        """The context `context` (default: the current one) of `path` (default: KUBECONFIG, else ~/.kube/config);
        ConfigError in one line when there is none or it cannot be read."""
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        configuration = client.Configuration()
        try:
            contexts, current = config.list_kube_config_contexts(config_file=path)
            chosen = next((c for c in contexts if c["name"] == context), None) if context else current
            if chosen is None:
                raise ConfigError(f"the kubeconfig has no context {context!r}: it has {', '.join(c['name'] for c in contexts)}")
            config.load_kube_config(config_file=path, context=chosen["name"], client_configuration=configuration,
                                    persist_config=False)
        except ConfigException as exc:
            where = path or "KUBECONFIG or ~/.kube/config"
            raise ConfigError(f"cannot use the kubeconfig ({where}): {str(exc).strip().splitlines()[0]}") from None
        except OSError as exc:
            raise ConfigError(f"cannot read the kubeconfig {path}: {exc.strerror or exc}") from None
        tls = None
        if configuration.host.startswith("https://"):
            tls = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
            if configuration.cert_file:
                tls.load_cert_chain(configuration.cert_file, configuration.key_file)
            if not configuration.verify_ssl:
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
        # The client keeps the token under "BearerToken" (kubernetes 33 and later) or "authorization" (before).
        bearer = configuration.get_api_key_with_prefix("BearerToken") or configuration.get_api_key_with_prefix("authorization")
        return cls(
            server=configuration.host.rstrip("/"),
            namespace=chosen.get("context", {}).get("namespace") or "default",
            context=chosen["name"],
            ssl_context=tls,
            headers={"Authorization": bearer} if bearer else {},
        )

    def api(self, timeout: float = 10.0) -> JsonClient:
        return JsonClient(self.server, timeout=timeout, ssl_context=self.ssl_context, headers=self.headers)

    def timekeeper(self, system_namespace: str = SYSTEM_NAMESPACE) -> JsonClient:
        """The timekeeper's API through the API server's service proxy."""
        proxy = f"/api/v1/namespaces/{system_namespace}/services/{TIMEKEEPER_SERVICE}/proxy"
        return JsonClient(self.server + proxy, ssl_context=self.ssl_context, headers=self.headers,
                          token_header=TIMEKEEPER_TOKEN_HEADER)

    def get(self, path: str) -> Answer:
        return self.api().request("GET", path)

    def timekeeper_token(self, system_namespace: str = SYSTEM_NAMESPACE, service_account: str = BUDGET_ADMIN) -> tuple[str | None, str]:
        """A short-lived token of `service_account` for the timekeeper's audience (what `kubectl create token`
        makes), or None and the API server's reason when the context may not have one."""
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"audiences": [TIMEKEEPER_TOKEN_AUDIENCE], "expirationSeconds": TOKEN_SECONDS}}
        path = f"/api/v1/namespaces/{system_namespace}/serviceaccounts/{urllib.parse.quote(service_account)}/token"
        answer = self.api().request("POST", path, request)
        token = (answer.json() or {}).get("status", {}).get("token") if answer.status == 201 else None
        if isinstance(token, str) and token:
            return token, ""
        return None, f"no token of ServiceAccount {system_namespace}/{service_account} ({answer.status}: {answer.message})"


def status_message(answer: Answer) -> str:
    """The API server's Status message, else its body, on one line."""
    body: Any = answer.json()
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return " ".join(body["message"].split())
    return answer.message
