"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager and, for the cluster
tier, kube-scheduler.

The binaries come from the directory in KUBEBUILDER_ASSETS (controller-runtime envtest's convention): the project's
`../shared/kube/unpack`, `setup-envtest use`, or the `kubernetes-server-linux-amd64` release archive's
`server/bin` with an etcd beside them. No kubelet runs: without a scheduler pods stay Pending, which is all admission
needs, and a test that needs a running pod writes its status itself; with one (tests/cluster) they are bound to the
simulated Nodes of tests/cluster/nodes.py, which plays their kubelet.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import trustme
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from kubernetes import client
from kubernetes import config as kube_config

from demo.processes import free_port

REQUIRED = ("etcd", "kube-apiserver")
CONTROLLER_MANAGER = "kube-controller-manager"  # optional: envtest's binaries come without it
SCHEDULER = "kube-scheduler"  # the cluster tier's
START_TIMEOUT_SECONDS = 90  # only stops a broken start from hanging; not a speed check
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMISSION_PLUGINS = (
    "NamespaceLifecycle,LimitRanger,ServiceAccount,Priority,DefaultTolerationSeconds,"
    "MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ResourceQuota"
)
# What a namespace, a Job, a Deployment, a PodDisruptionBudget and the aggregated roles (view, edit, admin) need to
# work as in a cluster.
CONTROLLERS = (
    "serviceaccount-controller,serviceaccount-token-controller,namespace-controller,"
    "root-ca-certificate-publisher-controller,job-controller,deployment-controller,replicaset-controller,"
    "disruption-controller,clusterrole-aggregation-controller"
)


# The API server's own record of every eviction asked for: who asked, for which pod, and its answer.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [{"level": "Metadata", "verbs": ["create"], "resources": [{"group": "", "resources": ["pods/eviction"]}]},
              {"level": "None"}],
}


@dataclass(frozen=True)
class EvictionAnswer:
    """One eviction as the API server's audit log records it: the pod, the HTTP status (201 granted, 429 refused by a
    PodDisruptionBudget) and when the API server received the request."""

    pod: str
    code: int
    received: dt.datetime


class ControlPlaneUnavailable(RuntimeError):
    """The binaries are missing or a component did not start; the message says which and why."""


def missing_binaries(assets: Path, required: tuple[str, ...] = REQUIRED) -> list[str]:
    return [name for name in required if not os.access(assets / name, os.X_OK)]


def control_plane_for(tier: str, scheduler: bool = False) -> "ControlPlane":
    """The control plane of KUBEBUILDER_ASSETS for a test tier, with kube-scheduler if asked.

    Without KUBEBUILDER_ASSETS (or, for `scheduler`, without kube-scheduler there: envtest's binaries have none) the
    tier is skipped with a line saying how to enable it; under CI=true that fails the run instead, as does a
    control plane that does not start.
    """
    wanted = (*REQUIRED, *([SCHEDULER] if scheduler else []))
    how = (
        f"the {tier} needs a Kubernetes control plane: set KUBEBUILDER_ASSETS to a directory with {', '.join(wanted)} "
        "and optionally kube-controller-manager (KUBEBUILDER_ASSETS=$(../shared/kube/unpack), or `setup-envtest use -p "
        "path`)"
    )
    assets = os.environ.get("KUBEBUILDER_ASSETS", "").strip()
    if not assets or (scheduler and missing_binaries(Path(assets), (SCHEDULER,))):
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but KUBEBUILDER_ASSETS={assets!r} will not do: {how}", pytrace=False)
        pytest.skip(how)
    try:
        return ControlPlane.start(Path(assets), scheduler)
    except ControlPlaneUnavailable as exc:
        pytest.fail(f"the Kubernetes control plane could not be started: {exc}", pytrace=False)


@dataclass
class ControlPlane:
    directory: Path
    url: str
    ca_file: Path
    admin_kubeconfig: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def webhook_client_ca(self) -> Path:
        """The CA of the client certificate kube-apiserver presents to admission webhooks (its
        AdmissionConfiguration)."""
        return self.directory / "webhook-client-ca.crt"

    @property
    def runs_controllers(self) -> bool:
        """Whether kube-controller-manager runs (Jobs, Deployments, ServiceAccounts, PodDisruptionBudget status)."""
        return CONTROLLER_MANAGER in self.processes

    @classmethod
    def start(cls, assets: Path, scheduler: bool = False) -> "ControlPlane":
        missing = missing_binaries(assets)
        if missing:
            raise ControlPlaneUnavailable(f"KUBEBUILDER_ASSETS={assets} lacks {', '.join(missing)}")
        # etcd syncs every write: on tmpfs that costs nothing, and the tier stays quick on two cores.
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        directory = Path(tempfile.mkdtemp(prefix="gpusharing-kube-", dir=base))
        port = free_port()
        plane = cls(directory, f"https://127.0.0.1:{port}", directory / "ca.crt", directory / "admin.kubeconfig")
        try:
            plane._start(assets, port)
            if scheduler:
                plane._start_scheduler(assets)
        except BaseException:
            plane.stop()
            raise
        return plane

    def _start(self, assets: Path, port: int) -> None:
        d = self.directory
        ca = trustme.CA(organization_name="gpusharing e2e")
        ca.cert_pem.write_to_path(str(self.ca_file))
        serving = ca.issue_cert(
            "127.0.0.1", "localhost", "kubernetes", "kubernetes.default.svc", common_name="kube-apiserver"
        )
        serving.cert_chain_pems[0].write_to_path(str(d / "apiserver.crt"))
        serving.private_key_pem.write_to_path(str(d / "apiserver.key"))
        admin = ca.issue_cert("admin", common_name="admin", organization_name="system:masters")
        admin.cert_chain_pems[0].write_to_path(str(d / "admin.crt"))
        admin.private_key_pem.write_to_path(str(d / "admin.key"))
        (d / "client-ca.crt").write_bytes(ca.cert_pem.bytes())
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (d / "sa.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        (d / "sa.pub").write_bytes(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        (d / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
        write_kubeconfig(
            self.admin_kubeconfig,
            self.url,
            self.ca_file,
            {"client-certificate": str(d / "admin.crt"), "client-key": str(d / "admin.key")},
        )
        admission_configuration = self._webhook_client_authentication()

        etcd_port, peer_port = free_port(), free_port()
        etcd = f"http://127.0.0.1:{etcd_port}"
        self._run(
            "etcd",
            assets / "etcd",
            "--data-dir", d / "etcd",
            "--listen-client-urls", etcd,
            "--advertise-client-urls", etcd,
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--log-level", "warn",
        )
        self._run(
            "kube-apiserver",
            assets / "kube-apiserver",
            "--etcd-servers", etcd,
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            "--cert-dir", d,
            "--tls-cert-file", d / "apiserver.crt",
            "--tls-private-key-file", d / "apiserver.key",
            "--client-ca-file", d / "client-ca.crt",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer", SERVICE_ACCOUNT_ISSUER,
            "--service-account-key-file", d / "sa.pub",
            "--service-account-signing-key-file", d / "sa.key",
            "--service-cluster-ip-range=10.0.0.0/24",
            f"--enable-admission-plugins={ADMISSION_PLUGINS}",
            "--admission-control-config-file", admission_configuration,
            "--profiling=false",
            "--audit-policy-file", d / "audit-policy.yaml",
            "--audit-log-path", d / "audit.log",
            "--audit-log-format=json",
        )
        self._wait_ready()
        if not os.access(assets / CONTROLLER_MANAGER, os.X_OK):
            return
        self._run(
            CONTROLLER_MANAGER,
            assets / CONTROLLER_MANAGER,
            "--kubeconfig", self.admin_kubeconfig,
            "--service-account-private-key-file", d / "sa.key",
            "--root-ca-file", self.ca_file,
            "--use-service-account-credentials",
            f"--controllers={CONTROLLERS}",
            "--leader-elect=false",
            "--secure-port=0",
            "--concurrent-job-syncs=2",
            # The default 20 requests/s would make a ReplicaSet of thousands of pods a matter of minutes.
            "--kube-api-qps=300",
            "--kube-api-burst=600",
        )

    def _webhook_client_authentication(self) -> Path:
        """The AdmissionConfiguration of a self-managed control plane whose webhooks authenticate the API server: a
        kubeconfig for both webhook plugins, whose user `*` (any webhook) is a client certificate of its own CA."""
        d = self.directory
        ca = trustme.CA(organization_name="gpusharing e2e webhook clients")
        ca.cert_pem.write_to_path(str(self.webhook_client_ca))
        client = ca.issue_cert("kube-apiserver", common_name="kube-apiserver")
        client.cert_chain_pems[0].write_to_path(str(d / "webhook-client.crt"))
        client.private_key_pem.write_to_path(str(d / "webhook-client.key"))
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "users": [
                {
                    "name": "*",
                    "user": {
                        "client-certificate": str(d / "webhook-client.crt"),
                        "client-key": str(d / "webhook-client.key"),
                    },
                }
            ],
        }
        (d / "webhook-admission.kubeconfig").write_text(yaml.safe_dump(kubeconfig))
        webhook = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
                   "kubeConfigFile": str(d / "webhook-admission.kubeconfig")}
        configuration = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "AdmissionConfiguration",
            "plugins": [
                {"name": plugin, "configuration": webhook}
                for plugin in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
            ],
        }
        (d / "admission-configuration.yaml").write_text(yaml.safe_dump(configuration))
        return d / "admission-configuration.yaml"

    def _start_scheduler(self, assets: Path) -> None:
        """kube-scheduler, binding pods to whatever Nodes exist (the cluster tier's simulated GPU nodes)."""
        configuration = self.directory / "scheduler.yaml"
        configuration.write_text(yaml.safe_dump({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.admin_kubeconfig), "qps": 300, "burst": 600},
            "leaderElection": {"leaderElect": False},
        }))
        self._run(SCHEDULER, assets / SCHEDULER, "--config", configuration, "--bind-address=127.0.0.1",
                  f"--secure-port={free_port()}", "-v=1")

    def _run(self, name: str, *argv: object) -> None:
        log = (self.directory / f"{name}.log").open("wb")
        env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
        self.processes[name] = subprocess.Popen(
            [str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def admin_session(self) -> requests.Session:
        """HTTP to the API server as the cluster admin (a client certificate in system:masters)."""
        session = requests.Session()
        session.mount("https://", requests.adapters.HTTPAdapter(pool_maxsize=32))  # tests create from many threads
        session.trust_env = False
        session.verify = str(self.ca_file)
        session.cert = (str(self.directory / "admin.crt"), str(self.directory / "admin.key"))
        return session

    def _wait_ready(self) -> None:
        session = self.admin_session()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise ControlPlaneUnavailable(f"{name} exited with {process.returncode}:\n{self.log_tail(name)}")
            try:
                if session.get(f"{self.url}/readyz", timeout=2).text == "ok":
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise ControlPlaneUnavailable(
                    f"kube-apiserver not ready in {START_TIMEOUT_SECONDS} s:\n{self.log_tail('kube-apiserver')}"
                )
            time.sleep(0.2)

    def evictions(self, namespace: str) -> list[tuple[str, int]]:
        """Every eviction of a pod of `namespace` the API server answered, as (pod, HTTP status), from its audit log."""
        return [(answer.pod, answer.code) for answer in self.eviction_answers(namespace)]

    def eviction_answers(self, namespace: str) -> list[EvictionAnswer]:
        """Every eviction of a pod of `namespace` the API server answered, with when it received the request, from
        its audit log (a line the API server is still writing is left for the next read)."""
        answered = []
        lines = (self.directory / "audit.log").read_text().splitlines()
        for index, line in enumerate(lines):
            try:
                event = json.loads(line)
            except ValueError:
                if index == len(lines) - 1:
                    break
                raise
            ref = event.get("objectRef", {})
            if (
                event.get("stage") == "ResponseComplete"
                and ref.get("namespace") == namespace
                and ref.get("subresource") == "eviction"
            ):
                received = dt.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
                answered.append(
                    EvictionAnswer(ref["name"], int(event.get("responseStatus", {}).get("code", 0)), received)
                )
        return answered

    def log_tail(self, name: str, characters: int = 3000) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace")[-characters:] if path.exists() else ""

    def api_client(self, kubeconfig: Path | None = None) -> client.ApiClient:
        configuration = client.Configuration()
        kube_config.load_kube_config(
            config_file=str(kubeconfig or self.admin_kubeconfig), client_configuration=configuration
        )
        return client.ApiClient(configuration)

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def write_kubeconfig(path: Path, server: str, ca_file: Path, user: dict[str, Any]) -> Path:
    """A kubeconfig with one cluster, one user (a client certificate or a token) and a current context."""
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": "e2e", "user": user}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(document))
    return path

