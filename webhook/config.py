"""The webhook's settings, read once from GPUSHARING_* environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpusharing.contract import (
    DEFAULT_BUDGET_REFRESH_SECONDS,
    DEFAULT_METER_INTERVAL_SECONDS,
    MAX_BUDGET_REFRESH_SECONDS,
    MIN_BUDGET_REFRESH_SECONDS,
)
from gpusharing.gpu.request import GpuRequestSettings
from gpusharing.settings.env import ConfigError, env_choice, env_flag, env_float, env_list, env_text, env_url
from gpusharing.settings.gpu import gpu_request_settings
from gpusharing.settings.meter import meter_interval_seconds

DEFAULT_EXEMPT_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")
SIDECAR_MODES = ("native", "container")
# the timekeeper's controller's ServiceAccount, in the webhook's namespace: it closes bills
BILLING_SERVICE_ACCOUNT = "gpusharing-controller"
CLUSTER_ADMINS = "system:masters"  # the group that may clear the billing finalizer of a stuck pod


def billing_account(namespace: str) -> str:
    """The username the API server gives the tokens of the controller's ServiceAccount, which removes the billing
    finalizer once a pod's bill is closed."""
    return f"system:serviceaccount:{namespace}:{BILLING_SERVICE_ACCOUNT}"


@dataclass(frozen=True)
class MeterSpec:
    """What the injected metering sidecar looks like."""

    name: str = "gpusharing-meter"
    image: str = "ghcr.io/kube-gpusharing/gpusharing:0.1.0"
    mode: str = "native"  # native: an init container with restartPolicy Always (Kubernetes >= 1.29)
    timekeeper_url: str = "http://gpusharing-timekeeper.gpusharing-system.svc:8080"
    cpu_request: str = "10m"
    cpu_limit: str = "100m"
    memory_request: str = "48Mi"
    memory_limit: str = "64Mi"
    run_as_user: int = 65532
    token_expiration_seconds: int = 3600
    interval_seconds: float = DEFAULT_METER_INTERVAL_SECONDS  # GPUSHARING_METER_INTERVAL_SECONDS, the timekeeper's too


@dataclass(frozen=True)
class WebhookConfig:
    """Everything a review is decided with, read once at start (`from_env`)."""

    gpu_request: GpuRequestSettings = field(default_factory=GpuRequestSettings)
    meter: MeterSpec = field(default_factory=MeterSpec)
    own_namespace: str = "gpusharing-system"
    exempt_namespaces: frozenset[str] = frozenset((*DEFAULT_EXEMPT_NAMESPACES, "gpusharing-system"))
    priority_class_in_budget: str = "gpusharing-in-budget"
    priority_class_over_budget: str = "gpusharing-over-budget"
    # Classes an administrator lets GPU pods keep while in budget; any other class of a pod's own is refused.
    allowed_priority_classes: frozenset[str] = frozenset()
    timekeeper_url: str | None = None  # where budget states are polled from; None: every namespace is unknown
    timekeeper_token_file: str | None = None
    budget_refresh_seconds: float = DEFAULT_BUDGET_REFRESH_SECONDS  # within the bounds the timekeeper accepts
    kubeconfig: str | None = None  # where resource claims and Jobs are watched from; None: in-cluster, if in a cluster
    # Who may send reviews (the API server's client authentication): a client certificate signed by this CA, or a
    # bearer token TokenReview authenticates for one of these users. Neither: anyone, answered without budget figures.
    client_ca_file: str | None = None
    client_token_users: frozenset[str] = frozenset()
    # Safe admission: how long a review waits for the timekeeper's reservation (the mutating webhook's own timeout,
    # 5 s in the manifests, must leave room for it).
    reservation_timeout_seconds: float = 2.0
    # The billing finalizer on every governed pod, and the users who may remove it (besides cluster admins).
    billing_finalizer: bool = True
    billing_accounts: frozenset[str] = frozenset((billing_account("gpusharing-system"),))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> WebhookConfig:
        own_namespace = env_text("GPUSHARING_WEBHOOK_NAMESPACE", "gpusharing-system", environ)
        exempt = env_list("GPUSHARING_EXEMPT_NAMESPACES", DEFAULT_EXEMPT_NAMESPACES, environ)
        timekeeper_url = env_url("GPUSHARING_TIMEKEEPER_URL", environ=environ)
        meter_defaults = MeterSpec()
        kubeconfig = environ.get("GPUSHARING_KUBECONFIG", "").strip() or environ.get("KUBECONFIG", "").strip() or None
        token_users = frozenset(env_list("GPUSHARING_CLIENT_TOKEN_USERS", (), environ))
        if token_users and not kubeconfig and not environ.get("KUBERNETES_SERVICE_HOST"):
            raise ConfigError(
                "GPUSHARING_CLIENT_TOKEN_USERS needs the Kubernetes API to verify tokens with TokenReview (in a "
                "cluster, or GPUSHARING_KUBECONFIG or KUBECONFIG)"
            )
        return cls(
            gpu_request=gpu_request_settings(environ),
            meter=MeterSpec(
                name=env_text("GPUSHARING_METER_NAME", meter_defaults.name, environ),
                image=env_text("GPUSHARING_METER_IMAGE", meter_defaults.image, environ),
                mode=env_choice("GPUSHARING_SIDECAR_MODE", "native", SIDECAR_MODES, environ),
                timekeeper_url=str(
                    env_url("GPUSHARING_METER_TIMEKEEPER_URL", timekeeper_url or meter_defaults.timekeeper_url, environ)
                ),
                interval_seconds=meter_interval_seconds(environ),
            ),
            own_namespace=own_namespace,
            exempt_namespaces=frozenset((*exempt, own_namespace)),
            priority_class_in_budget=env_text(
                "GPUSHARING_PRIORITY_CLASS_IN_BUDGET", cls.priority_class_in_budget, environ
            ),
            priority_class_over_budget=env_text(
                "GPUSHARING_PRIORITY_CLASS_OVER_BUDGET", cls.priority_class_over_budget, environ
            ),
            allowed_priority_classes=frozenset(env_list("GPUSHARING_ALLOWED_PRIORITY_CLASSES", (), environ)),
            timekeeper_url=timekeeper_url,
            timekeeper_token_file=environ.get("GPUSHARING_TIMEKEEPER_TOKEN_FILE", "").strip() or None,
            budget_refresh_seconds=env_float(
                "GPUSHARING_BUDGET_REFRESH_SECONDS",
                DEFAULT_BUDGET_REFRESH_SECONDS,
                MIN_BUDGET_REFRESH_SECONDS,
                environ,
                maximum=MAX_BUDGET_REFRESH_SECONDS,
            ),
            kubeconfig=kubeconfig,
            client_ca_file=environ.get("GPUSHARING_CLIENT_CA_FILE", "").strip() or None,
            client_token_users=token_users,
            reservation_timeout_seconds=env_float("GPUSHARING_RESERVATION_TIMEOUT_SECONDS", 2.0, 0.05, environ),
            billing_finalizer=env_flag("GPUSHARING_BILLING_FINALIZER", True, environ),
            billing_accounts=frozenset(
                env_list("GPUSHARING_BILLING_ACCOUNTS", (billing_account(own_namespace),), environ)
            ),
        )
