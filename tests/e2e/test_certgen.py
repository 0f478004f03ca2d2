"""The chart installed without cert-manager, on a real API server: its certgen makes the webhook's certificate, the
webhook configurations trust it, and the API server, verifying the webhook's Service name against that caBundle,
admits a GPU pod through it; it makes the statements' signing key once, which it cannot read. With cert-manager, its
Job makes that key alone.

The chart is rendered as a release of its own (fullnameOverride e2e-certgen, in a namespace of its own) and every
object of it created as `helm install` creates it. The certgen runs as the Job's container would (its arguments, its
namespace, its ServiceAccount's token), so the chart's RBAC is what lets it work. The session's webhook
configurations are taken away meanwhile (two pairs would each admit a GPU pod) and put back after. What no control
plane here has: a kubelet to run pods, and kube-proxy behind the webhook's Service. So the Service becomes an
ExternalName for localhost, where the webhook listens with the Secret's certificate and key (as the kubelet would
mount them), and the configurations name the webhook's port there: the API server still calls the Service by name
and verifies the certificate for `e2e-certgen-webhook.NAMESPACE.svc` against the configurations' caBundle.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography import x509
from cryptography.x509.verification import DNSName, PolicyBuilder, Store

from demo.processes import free_port, run_command
from gpusharing.serving.certs import make_serving_certificate, statement_key
from tests.e2e.controlplane import write_kubeconfig
from tests.e2e.system import SYSTEM_NAMESPACE, ApiError, GpuSharing, wait_for
from tests.e2e.test_admission import assert_governed, example
from tests.helm import render
from timekeeper.config import signing_keys

RELEASE = "e2e-certgen"
CONFIGURATIONS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
# The CRDs: the session's, the same file. The fair-share gate's policy: a second one would let only this release's
# controller remove the gate, and so refuse the session's controller.
NOT_CREATED = ("CustomResourceDefinition", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


@dataclass
class Release:
    namespace: str
    objects: list[dict[str, Any]]
    args: list[str]  # the certgen's, as the kubelet expands them
    kubeconfig: Path  # the certgen ServiceAccount's
    port: int  # where the webhook listens on loopback

    def secret(self, gpusharing: GpuSharing) -> dict[str, Any]:
        return dict(gpusharing.rest("GET", f"/api/v1/namespaces/{self.namespace}/secrets/{RELEASE}-webhook-tls"))

    def certgen(self) -> tuple[int, str, str]:
        """`gpusharing certs --format cluster ...` as the Job runs it: exit code, stdout, stderr."""
        done = run_command(*self.args, env={"KUBECONFIG": str(self.kubeconfig)})
        return done.returncode, done.stdout, done.stderr


def statement_key_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/secrets/{RELEASE}-statement-key"


def denied(gpusharing: GpuSharing, namespace: str, service_account: str, method: str, path: str) -> bool:
    """Whether the API server refuses `service_account`'s token `method` on `path` (403)."""
    session = requests.Session()
    session.trust_env = False
    session.verify = str(gpusharing.plane.ca_file)
    session.headers["Authorization"] = f"Bearer {gpusharing.token(namespace, service_account, audience=None)}"
    return session.request(method, f"{gpusharing.plane.url}{path}", timeout=30).status_code == 403


def gpu_pod(name: str) -> dict[str, Any]:
    pod = example("hami-fraction.yaml")
    return {**pod, "metadata": {**pod["metadata"], "name": name}}


def configuration_path(kind: str) -> str:
    return f"/apis/admissionregistration.k8s.io/v1/{kind.lower()}s/{RELEASE}"


@pytest.fixture(scope="module")
def release(gpusharing: GpuSharing, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    namespace = gpusharing.namespace("e2e-certgen")
    objects = render({"fullnameOverride": RELEASE, "priorityClasses": {"create": False}}, namespace=namespace)
    port = free_port()
    theirs = gpusharing.webhook_configurations()
    for configuration in theirs:
        kind, name = configuration["kind"].lower(), configuration["metadata"]["name"]
        gpusharing.rest("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}s/{name}")
    try:
        for obj in objects:
            if obj["kind"] in NOT_CREATED:
                continue
            if obj["kind"] == "Service" and obj["metadata"]["name"] == f"{RELEASE}-webhook":
                obj = {
                    **obj,
                    "spec": {"type": "ExternalName", "externalName": "localhost", "ports": obj["spec"]["ports"]},
                }
            if obj["kind"] in CONFIGURATIONS:
                for webhook in obj["webhooks"]:
                    webhook["clientConfig"]["service"]["port"] = port
            if "namespace" in obj["metadata"]:
                gpusharing.create(namespace, obj)
            else:
                gpusharing.replace(obj)
        (job,) = [o for o in objects if o["kind"] == "Job"]
        pod = job["spec"]["template"]["spec"]
        args = [arg.replace("$(NAMESPACE)", namespace) for arg in pod["containers"][0]["args"]]
        kubeconfig = write_kubeconfig(
            tmp_path_factory.mktemp("certgen") / "kubeconfig", gpusharing.plane.url, gpusharing.plane.ca_file,
            {"token": gpusharing.token(namespace, pod["serviceAccountName"], audience=None)},
        )
        yield Release(namespace, objects, args, kubeconfig, port)
    finally:
        for obj in objects:
            if "namespace" not in obj["metadata"] and obj["kind"] not in NOT_CREATED and obj["kind"] != "PriorityClass":
                path = (
                    configuration_path(obj["kind"])
                    if obj["kind"] in CONFIGURATIONS
                    else f"/apis/rbac.authorization.k8s.io/v1/{obj['kind'].lower()}s/{obj['metadata']['name']}"
                )
                gpusharing.rest("DELETE", path)
        for configuration in theirs:
            gpusharing.replace(configuration)


@pytest.fixture(scope="module")
def first_run(release: Release) -> str:
    code, out, err = release.certgen()
    assert code == 0, err
    return out


# The readiness probe cannot verify the webhook for 127.0.0.1: the API server's calls below verify it for its name.
@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_the_certgen_makes_a_certificate_the_api_server_trusts_and_a_gpu_pod_is_admitted(
    gpusharing: GpuSharing, release: Release, first_run: str, tmp_path: Path
) -> None:
    assert (
        f"Secret {release.namespace}/{RELEASE}-webhook-tls: made a CA and a certificate (there was no Secret)"
        in first_run
    )
    secret = release.secret(gpusharing)
    assert secret["type"] == "kubernetes.io/tls"
    data = {key: base64.b64decode(value) for key, value in secret["data"].items()}
    # Owned by the certgen's ServiceAccount: uninstalling the chart deletes it (the garbage collector's work).
    account = gpusharing.rest("GET", f"/api/v1/namespaces/{release.namespace}/serviceaccounts/{RELEASE}-certgen")
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "ServiceAccount",
        f"{RELEASE}-certgen",
        account["metadata"]["uid"],
    )
    for kind in CONFIGURATIONS:
        (webhook,) = gpusharing.rest("GET", configuration_path(kind))["webhooks"]
        bundle = base64.b64decode(webhook["clientConfig"]["caBundle"])
        assert bundle == data["ca.crt"]
        # The caBundle verifies the serving certificate for the name the API server asks for.
        verifier = (
            PolicyBuilder()
            .store(Store(x509.load_pem_x509_certificates(bundle)))
            .time(datetime.datetime.now(datetime.timezone.utc))
        )
        verifier.build_server_verifier(DNSName(f"{RELEASE}-webhook.{release.namespace}.svc")).verify(
            x509.load_pem_x509_certificate(data["tls.crt"]), []
        )
    # The webhook serving the Secret's pair, as the kubelet would mount it; the API server calls it by the Service.
    (tmp_path / "tls.crt").write_bytes(data["tls.crt"])
    (tmp_path / "tls.key").write_bytes(data["tls.key"])
    with gpusharing.webhook_service(
        "certgen-webhook", release.port, tmp_path / "tls.crt", tmp_path / "tls.key", verify=False
    ):
        namespace = gpusharing.namespace("e2e-certgen-pods")
        assert_governed(gpusharing.create(namespace, gpu_pod("admitted")))
        # The API server does verify: with a CA bundle of another CA, GPU pods are refused (fail closed) ...
        foreign = base64.b64encode(make_serving_certificate(["elsewhere"]).ca_pem).decode()
        for kind in CONFIGURATIONS:
            gpusharing.rest("PATCH", configuration_path(kind), [
                {"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": foreign}], patch="json")
        with pytest.raises(ApiError, match="x509: certificate signed by unknown authority"):
            gpusharing.create(namespace, gpu_pod("refused"))
        # ... until the certgen's next run sets the Secret's again.
        code, out, err = release.certgen()
        assert code == 0 and out.count("caBundle set") == 2, err
        assert_governed(gpusharing.create(namespace, gpu_pod("admitted-again")))


def test_a_second_run_keeps_everything_and_another_puts_back_a_ca_bundle_taken_away(
    gpusharing: GpuSharing, release: Release, first_run: str
) -> None:
    version = release.secret(gpusharing)["metadata"]["resourceVersion"]
    code, out, err = release.certgen()
    assert code == 0, err
    assert (
        f"Secret {release.namespace}/{RELEASE}-webhook-tls: kept (the certificate expires " in out
        and "caBundle set" not in out
    )
    assert release.secret(gpusharing)["metadata"]["resourceVersion"] == version
    # As an apply of a configuration with a caBundle the certgen did not set would leave it.
    for kind in CONFIGURATIONS:
        gpusharing.rest(
            "PATCH",
            configuration_path(kind),
            [{"op": "remove", "path": "/webhooks/0/clientConfig/caBundle"}],
            patch="json",
        )
    code, out, err = release.certgen()
    assert code == 0, err
    for kind in CONFIGURATIONS:
        assert (
            f"{kind} {RELEASE}: caBundle set to the CA bundle of Secret {release.namespace}/{RELEASE}-webhook-tls"
            in out
        )
        (webhook,) = gpusharing.rest("GET", configuration_path(kind))["webhooks"]
        assert webhook["clientConfig"]["caBundle"] == release.secret(gpusharing)["data"]["ca.crt"]


def test_the_certgen_may_read_no_other_secret_nor_change_another_configuration(
    gpusharing: GpuSharing, release: Release, first_run: str
) -> None:
    other = [
        *release.args[: release.args.index("--secret") + 1],
        f"{RELEASE}-database",
        *release.args[release.args.index("--secret") + 2 :],
    ]
    code, out, err = Release(release.namespace, release.objects, other, release.kubeconfig, release.port).certgen()
    assert code == 1 and out == ""
    assert err.strip() == (
        f"gpusharing certs: cannot read Secret {release.namespace}/{RELEASE}-database: 403 Forbidden: secrets "
        f'"{RELEASE}-database" is forbidden: User "system:serviceaccount:{release.namespace}:{RELEASE}-certgen" cannot '
        f'get '
        f'resource "secrets" in API group "" in the namespace "{release.namespace}"'
    )
    session = requests.Session()
    session.trust_env = False
    session.verify = str(gpusharing.plane.ca_file)
    session.headers["Authorization"] = (
        f"Bearer {gpusharing.token(release.namespace, f'{RELEASE}-certgen', audience=None)}"
    )
    for method, path in (
        ("GET", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"),  # no listing
        ("GET", f"/api/v1/namespaces/{release.namespace}/secrets"),
        # no more than get and update
        ("DELETE", f"/api/v1/namespaces/{release.namespace}/secrets/{RELEASE}-webhook-tls"),
        ("DELETE", configuration_path("ValidatingWebhookConfiguration")),
    ):
        assert session.request(method, f"{gpusharing.plane.url}{path}", timeout=30).status_code == 403, (method, path)


def test_the_certgen_makes_the_statements_signing_key_once_keeps_it_and_cannot_read_it(
    gpusharing: GpuSharing, release: Release, first_run: str, tmp_path: Path
) -> None:
    where = f"Secret {release.namespace}/{RELEASE}-statement-key"
    (made,) = [line for line in first_run.splitlines() if line.startswith(f"{where}: ")]
    secret = gpusharing.rest("GET", statement_key_path(release.namespace))
    assert secret["type"] == "Opaque" and "ownerReferences" not in secret["metadata"]  # uninstalling keeps it
    data = {key: base64.b64decode(value) for key, value in secret["data"].items()}
    assert set(data) == {"key", "verifier"}
    verifier = data["verifier"].decode().strip()
    assert made == (f"{where}: made a key to sign the statements of closed billing periods; publish its verifier key "
                    f"{verifier}")
    # What the controller reads from it, where the chart mounts `key` and no `previous-key`.
    (tmp_path / "key").write_bytes(data["key"])
    keys = signing_keys({"TIMEKEEPER_STATEMENT_KEY_FILE": str(tmp_path / "key"),
                         "TIMEKEEPER_STATEMENT_PREVIOUS_KEY_FILE": str(tmp_path / "previous-key")})
    assert keys is not None and keys.previous is None
    assert (keys.current.verifier.text, keys.current.name) == (verifier, "gpusharing.io/kubernetes/statements")
    # A later run keeps it as it is, and so after the admin rotated it (a new `key`, the old one as `previous-key`).
    kept = f"{where}: kept (it exists; the statements' signing key is never changed by the certgen)"
    code, out, err = release.certgen()
    assert code == 0 and kept in out, err
    assert gpusharing.rest("GET", statement_key_path(release.namespace))["metadata"]["resourceVersion"] == (
        secret["metadata"]["resourceVersion"]
    )
    new = statement_key("gpusharing.io/kubernetes/statements")
    rotated = gpusharing.rest("PUT", statement_key_path(release.namespace), {**secret, "data": {
        "key": base64.b64encode(new["key"]).decode(),
        "previous-key": secret["data"]["key"],
        "verifier": base64.b64encode(new["verifier"]).decode(),
    }})
    code, out, err = release.certgen()
    assert code == 0 and kept in out, err
    assert gpusharing.rest("GET", statement_key_path(release.namespace))["metadata"]["resourceVersion"] == (
        rotated["metadata"]["resourceVersion"]
    )
    # Its only right to it is the create: it can neither read the key nor change or delete it.
    path = statement_key_path(release.namespace)
    for method in ("GET", "PUT", "DELETE"):
        assert denied(gpusharing, release.namespace, f"{RELEASE}-certgen", method, path), method


def test_with_cert_manager_the_certgens_job_makes_the_statements_signing_key_alone(
    gpusharing: GpuSharing, tmp_path: Path
) -> None:
    """The chart's certgen with cert-manager, as the Job runs it with its own ServiceAccount and Role: the key made,
    and nothing of the webhook's within its reach."""
    namespace = gpusharing.namespace("e2e-statement-key")
    objects = render({"fullnameOverride": RELEASE, "certManager": {"enabled": True}}, namespace=namespace)
    certgen = [o for o in objects if o["metadata"]["name"].startswith(f"{RELEASE}-certgen")]
    assert sorted(o["kind"] for o in certgen) == ["Job", "Role", "RoleBinding", "ServiceAccount"]
    for obj in certgen:
        if obj["kind"] != "Job":  # no kubelet runs its pod: its container's command is run below
            gpusharing.create(namespace, obj)
    (job,) = [o for o in certgen if o["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    args = [arg.replace("$(NAMESPACE)", namespace) for arg in pod["containers"][0]["args"]]
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", gpusharing.plane.url, gpusharing.plane.ca_file,
        {"token": gpusharing.token(namespace, pod["serviceAccountName"], audience=None)},
    )
    done = run_command(*args, env={"KUBECONFIG": str(kubeconfig)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        f"Secret {namespace}/{RELEASE}-statement-key: made a key to sign the statements of closed billing periods; "
    ) and len(done.stdout.splitlines()) == 1  # nothing of the webhook's certificate
    assert set(gpusharing.rest("GET", statement_key_path(namespace))["data"]) == {"key", "verifier"}
    again = run_command(*args, env={"KUBECONFIG": str(kubeconfig)})
    assert again.returncode == 0 and again.stdout.endswith(": kept (it exists; the statements' signing key is never "
                                                           "changed by the certgen)\n"), again.stderr
    account = pod["serviceAccountName"]
    for method, path in (
        ("GET", statement_key_path(namespace)),
        ("GET", f"/api/v1/namespaces/{namespace}/secrets/{RELEASE}-webhook-tls"),  # cert-manager's
        ("GET", f"/api/v1/namespaces/{namespace}/secrets"),
        ("GET", f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{RELEASE}"),
    ):
        assert denied(gpusharing, namespace, account, method, path), (method, path)


def test_the_installations_certgen_job_runs_a_pod_pod_security_restricted_admits(gpusharing: GpuSharing) -> None:
    """The manifests' Job in gpusharing-system, whose namespace enforces Pod Security `restricted`: its controller
    makes the pod (no kubelet runs it here)."""
    gpusharing.require_controllers()
    wait_for(
        lambda: gpusharing.pods(SYSTEM_NAMESPACE, "app.kubernetes.io/name=gpusharing-certgen"), "the certgen Job's pod"
    )
    namespace = gpusharing.rest("GET", f"/api/v1/namespaces/{SYSTEM_NAMESPACE}")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
