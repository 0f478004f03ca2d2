"""The controller process's factory (`gpusharing timekeeper controller`), as timekeeper.app is the web replicas': it
builds the stores and the controller's machinery (timekeeper.cluster.manager) and nothing else. The web replicas
never import it (a contract in .importlinter)."""

from __future__ import annotations

from gpusharing.clock import Clock
from gpusharing.settings.env import ConfigError
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.manager import ControllerManager
from timekeeper.cluster.utilisation import UtilisationSink
from timekeeper.config import TimekeeperConfig
from timekeeper.services import build_stores, kube_api


def build_controller(config: TimekeeperConfig, kube: KubeApi | None = None, clock: Clock | None = None,
                     utilisation_sink: UtilisationSink | None = None) -> ControllerManager:
    """The controller process's manager (`gpusharing timekeeper controller`), not started. ConfigError without a
    Kubernetes API: the controller's work is the cluster's. `utilisation_sink`: where readings from Prometheus go
    (default: the pods' ledgers)."""
    if kube is None:
        kube = kube_api(config)
    if kube is None:
        raise ConfigError(
            "the controller works on a cluster: set KUBECONFIG (or TIMEKEEPER_KUBECONFIG), or run it in one"
        )
    stores = build_stores(config, clock)
    return ControllerManager(config, stores.budgets, stores.ledger, stores.idle, stores.capacity, kube, stores.clock,
                             utilisation_sink=utilisation_sink)
