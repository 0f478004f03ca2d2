"""Reaching the Kubernetes API through the official client, as the services find it: a kubeconfig, else in-cluster."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gpusharing.settings.env import ConfigError

if TYPE_CHECKING:
    from kubernetes import client

# Every call gives up after this long (connect and read): a slow API server delays a pass or a report, never
# stalls it.
REQUEST_TIMEOUT_SECONDS = 10.0


def in_cluster_available() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def api_client(kubeconfig: str | None, setting: str, connections: int | None = None) -> client.ApiClient:
    """The API given by `kubeconfig` (paths joined by ':' are merged, as kubectl does), or the in-cluster
    ServiceAccount when None; ConfigError naming `setting` (the service's own kubeconfig variable) when neither works.
    `connections`: how many HTTP connections its one pool keeps open (the client's default is 4: threads beyond
    them would each open, and drop, a connection of their own)."""
    # Imported here: the official client takes 0.4 s to import, which a process that never reaches the API skips.
    from kubernetes import client
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    if connections is not None:
        configuration.connection_pool_maxsize = connections
    try:
        if kubeconfig:
            kube_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            kube_config.load_incluster_config(client_configuration=configuration)
    except (kube_config.ConfigException, OSError) as exc:
        where = (
            f"the kubeconfig {kubeconfig} ({setting}, else KUBECONFIG)"
            if kubeconfig
            else f"the in-cluster ServiceAccount (outside a cluster, set KUBECONFIG or {setting})"
        )
        raise ConfigError(f"cannot configure the Kubernetes API from {where}: {exc}") from None
    return client.ApiClient(configuration)
