"""`kubectl gpusharing` against the real API server: a token of the budget-admin ServiceAccount made with
TokenRequest and accepted by the timekeeper's TokenReview and SubjectAccessReview, `explain` reading a pod the
webhook admitted, and the service proxy path the API server authorizes.

What cannot be shown here: a request going all the way through the service proxy to the timekeeper. The API
server proxies only to a Service's endpoints, refuses loopback endpoints ("may not be in the loopback range"),
and nothing here runs pods on a non-loopback address. tests/timekeeper/test_kubectl_plugin.py covers the rest of
that path against a loopback fake of the proxy that drops the Authorization header as the real one does."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.connectproxy import ConnectProxy
from tests.e2e.controlplane import write_kubeconfig
from tests.e2e.system import SYSTEM_NAMESPACE, GpuSharing
from tests.e2e.test_admission import example
from tests.gpusharing.admin.test_cluster import PROXY_VARIABLES, exec_plugin

PLUGIN = str(Path(sys.executable).parent / "kubectl-gpusharing")


def plugin(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "GPUSHARING_LOG_LEVEL": "warning"}
    # The client, as kubectl, would also take a proxy (or exceptions to it) from the environment: none but the
    # kubeconfig's.
    for variable in ("TIMEKEEPER_URL", "TIMEKEEPER_TOKEN", *PROXY_VARIABLES):
        env.pop(variable, None)
    return subprocess.run([PLUGIN, *args], capture_output=True, text=True, env=env, timeout=60)


def test_budgets_and_explain_with_the_kubeconfigs_credentials(gpusharing: GpuSharing) -> None:
    """The budget-admin ServiceAccount comes with the installation (manifests/base/rbac.yaml)."""
    admin = gpusharing.plane.admin_kubeconfig
    namespace = gpusharing.namespace("e2e-plugin")
    at = ("--timekeeper", gpusharing.timekeeper_url)

    done = plugin(admin, "budget", "set", namespace, "--gpu-minutes", "30", *at, "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["gpuMinutes"] == 30
    changes = gpusharing.timekeeper_call(
        "GET", f"/api/v1/budgets/{namespace}/changes", gpusharing.budget_admin_token()
    ).json()
    assert changes["items"][0]["actor"] == f"system:serviceaccount:{SYSTEM_NAMESPACE}:gpusharing-budget-admin"

    pod = gpusharing.create(namespace, example("hami-fraction.yaml"))
    explained = plugin(admin, "explain", f"pod/{pod['metadata']['name']}", "-n", namespace, *at, "-o", "json")
    assert explained.returncode == 0, explained.stderr
    record = json.loads(explained.stdout)
    annotations = pod["metadata"]["annotations"]
    assert record["pod"]["record"] == {
        k.split("/", 1)[1]: v for k, v in annotations.items() if k.startswith("gpusharing.io/")
    }
    assert (record["pod"]["priorityClassName"], record["pod"]["priority"], record["pod"]["meter"]) == (
        "gpusharing-in-budget",
        1000,
        "native sidecar",
    )
    assert record["namespace"]["state"] == "in-budget" and record["metering"] is None
    table = plugin(admin, "explain", pod["metadata"]["name"], "-n", namespace, *at)
    assert (
        table.returncode == 0
        and "Admitted:" in table.stdout
        and "Namespace now:  in-budget: 0.0 of 30.0" in table.stdout
    )


def test_the_service_proxy_is_asked_with_the_kubeconfigs_credentials(gpusharing: GpuSharing, tmp_path: Path) -> None:
    admin = plugin(gpusharing.plane.admin_kubeconfig, "budget", "ls")
    assert admin.returncode == 1 and admin.stdout == "" and admin.stderr.count("\n") == 1
    # The API server authorized the admin's proxy request, and found no endpoint to send it to: no pod runs here.
    assert admin.stderr.startswith("gpusharing: the API server did not reach the timekeeper (")
    assert "is kube-gpusharing installed in namespace gpusharing-system (--system-namespace)" in admin.stderr

    namespace = gpusharing.namespace("e2e-plugin-nobody")
    nobody = write_kubeconfig(tmp_path / "nobody.kubeconfig", gpusharing.plane.url, gpusharing.plane.ca_file,
                              {"token": gpusharing.token(namespace, "default", audience=None)})
    refused = plugin(nobody, "budget", "ls", "--token", "whatever")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("gpusharing: the API server did not reach the timekeeper (403): ")
    assert 'cannot get resource "services/proxy"' in refused.stderr


def test_an_exec_plugins_token_through_the_clusters_proxy_url(gpusharing: GpuSharing, tmp_path: Path) -> None:
    """The kubeconfig as kubectl reads it, on the real API server: a user whose exec plugin prints a ServiceAccount's
    token (one that may view the namespace), every request through the cluster's proxy-url; then a token the API
    server does not know, refused in one line."""
    namespace = gpusharing.namespace("e2e-plugin-exec")
    gpusharing.service_account(namespace, "viewer")
    gpusharing.rest("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": namespace}],
    })
    pod = gpusharing.create(namespace, example("hami-fraction.yaml"))
    at = ("--timekeeper", gpusharing.timekeeper_url, "--token", gpusharing.budget_admin_token())
    proxy = ConnectProxy()
    try:
        def kubeconfig(token: str) -> Path:
            path = write_kubeconfig(tmp_path / token[:8], gpusharing.plane.url, gpusharing.plane.ca_file,
                                    exec_plugin(tmp_path, dt.timedelta(hours=1), token=token))
            document = yaml.safe_load(path.read_text())
            document["clusters"][0]["cluster"]["proxy-url"] = proxy.url
            path.write_text(yaml.safe_dump(document))
            return path

        explained = plugin(kubeconfig(gpusharing.token(namespace, "viewer", audience=None)), "explain",
                           f"pod/{pod['metadata']['name']}", "-n", namespace, *at, "-o", "json")
        assert explained.returncode == 0, explained.stderr
        assert json.loads(explained.stdout)["pod"]["uid"] == pod["metadata"]["uid"]
        assert set(proxy.tunnels) == {gpusharing.plane.url.removeprefix("https://")}

        refused = plugin(kubeconfig("not-a-token-the-api-server-knows"), "explain", f"pod/{pod['metadata']['name']}",
                         "-n", namespace, *at)
        assert refused.returncode == 1 and refused.stdout == "" and refused.stderr.count("\n") == 1
        assert refused.stderr.startswith(
            f"gpusharing: the API server {gpusharing.plane.url} refused the credentials of "
            "context e2e (401 Unauthorized)"
        )
    finally:
        proxy.close()
