"""A private CA and a serving certificate, for the webhook where cert-manager is not installed (and for the demo); a
CA and a client certificate, for the API server to prove itself to the webhook; the key that signs the statements of
closed billing periods, made at install beside them."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpusharing.statements.note import generate_signer
from gpusharing.statements.statement import origin_of

PrivateKey = ec.EllipticCurvePrivateKey
CA_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpusharing webhook CA")])
CLIENT_CA_NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpusharing webhook client CA")])
CLOCK_SKEW = datetime.timedelta(minutes=5)  # valid from a little before `now`, for clocks a little behind


@dataclass(frozen=True)
class ServingCertificate:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path) -> dict[str, Path]:
        """ca.crt, tls.crt and tls.key in `directory` (the names of a kubernetes.io/tls Secret)."""
        directory.mkdir(parents=True, exist_ok=True)
        paths = {"ca": directory / "ca.crt", "cert": directory / "tls.crt", "key": directory / "tls.key"}
        paths["ca"].write_bytes(self.ca_pem)
        paths["cert"].write_bytes(self.cert_pem)
        paths["key"].touch(mode=0o600)
        paths["key"].write_bytes(self.key_pem)
        return paths


def make_serving_certificate(names: list[str], days: int = 365) -> ServingCertificate:
    """A fresh CA and a certificate signed by it for `names` (DNS names or IP addresses), both valid `days`."""
    now = datetime.datetime.now(datetime.timezone.utc)
    authority = make_authority(days, now)
    cert, key = issue(authority, names, days, now)
    return ServingCertificate(ca_pem=pem(authority.cert), cert_pem=pem(cert), key_pem=key_pem(key))


def make_client_certificate(common_name: str, days: int = 365) -> ServingCertificate:
    """A fresh CA and a client certificate (clientAuth) signed by it, for `common_name`."""
    now = datetime.datetime.now(datetime.timezone.utc)
    authority = make_authority(days, now, CLIENT_CA_NAME)
    cert, key = issue(authority, [], days, now, ExtendedKeyUsageOID.CLIENT_AUTH, common_name)
    return ServingCertificate(ca_pem=pem(authority.cert), cert_pem=pem(cert), key_pem=key_pem(key))


@dataclass(frozen=True)
class Authority:
    """A CA: its certificate and the key it signs with."""

    cert: x509.Certificate
    key: PrivateKey


def make_authority(days: int, now: datetime.datetime, name: x509.Name = CA_NAME) -> Authority:
    """A new CA (ECDSA P-256) valid `days` from `now`, named `name`.

    It and what it issues carry what strict verifiers require (OpenSSL's -x509_strict, Python 3.13's default TLS
    context): key identifiers, critical basicConstraints and keyUsage, and serverAuth for a serving certificate.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Authority(cert, key)


def issue(
    authority: Authority, names: list[str], days: int, now: datetime.datetime,
    usage: x509.ObjectIdentifier = ExtendedKeyUsageOID.SERVER_AUTH, common_name: str | None = None,
) -> tuple[x509.Certificate, PrivateKey]:
    """A certificate for `names` (DNS names or IP addresses; the first is its common name unless one is given),
    signed by `authority`, valid `days` from `now`, for `usage` (a server's by default), and its new key."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name or names[0])]))
        .issuer_name(authority.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False)
    cert = (
        builder
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()), critical=False)
        .sign(authority.key, hashes.SHA256())
    )
    return cert, key


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def certified_names(cert: x509.Certificate) -> set[str]:
    """The DNS names and IP addresses a serving certificate is for."""
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {*names.get_values_for_type(x509.DNSName), *(str(ip) for ip in names.get_values_for_type(x509.IPAddress))}


def _key_usage(digital_signature: bool = False, key_cert_sign: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=key_cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


WEBHOOK_SERVICE = "gpusharing-webhook"
WEBHOOK_SECRET = "gpusharing-webhook-tls"
WEBHOOK_CONFIGURATION = "gpusharing"  # the name of the mutating and of the validating one
WEBHOOK_CONFIGURATIONS = (("MutatingWebhookConfiguration", 0), ("ValidatingWebhookConfiguration", 0))
DATABASE_SECRET = "gpusharing-database"
DATABASE_ENV = "database.env"
STATEMENT_KEY_SECRET = "gpusharing-statement-key"
# The key's name in signatures: the origin of the statements a timekeeper writes under TIMEKEEPER_CLUSTER_NAME's
# default, as a C2SP checkpoint's log signs under its origin.
STATEMENT_KEY_NAME = origin_of("kubernetes")
STATEMENT_KEY_FILE, STATEMENT_VERIFIER_FILE = "statement.key", "statement.pub"  # the overlay's


def statement_key(name: str) -> dict[str, bytes]:
    """A new key to sign the statements of closed billing periods with, as its Secret holds it: `key`, the signer key
    the controller reads (TIMEKEEPER_STATEMENT_KEY_FILE), and `verifier`, its verifier key, to publish."""
    signer = generate_signer(name)
    return {"key": f"{signer.text}\n".encode(), "verifier": f"{signer.verifier.text}\n".encode()}


def service_names(namespace: str, service: str = WEBHOOK_SERVICE) -> list[str]:
    """The DNS names the API server may use for the webhook's Service (the first is the one it verifies)."""
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local", f"{service}.{namespace}", service]


def write_overlay(namespace: str, base: Path, output: Path, days: int = 365) -> Path:
    """A kustomize overlay of `base` with the webhook's TLS Secret and the caBundle of both configurations, the
    database Secret generated from a database.env with a random password, and the statements' signing key's from
    statement.key and statement.pub (both kept when the overlay is written again: PostgreSQL keeps the password it
    was first started with, and the statements' chain the key it was first signed with)."""
    certificate = make_serving_certificate(service_names(namespace), days)
    output.mkdir(parents=True, exist_ok=True)
    database_env = output / DATABASE_ENV
    if not database_env.exists():
        database_env.touch(mode=0o600)
        database_env.write_text(f"password={secrets.token_hex(24)}\n")
    key_file = output / STATEMENT_KEY_FILE
    if not key_file.exists():
        made = statement_key(STATEMENT_KEY_NAME)
        (output / STATEMENT_VERIFIER_FILE).write_bytes(made["verifier"])
        key_file.touch(mode=0o600)
        key_file.write_bytes(made["key"])
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": WEBHOOK_SECRET, "namespace": namespace},
        "data": {
            "tls.crt": base64.b64encode(certificate.cert_pem).decode(),
            "tls.key": base64.b64encode(certificate.key_pem).decode(),
            "ca.crt": base64.b64encode(certificate.ca_pem).decode(),
        },
    }
    ca_bundle = base64.b64encode(certificate.ca_pem).decode()
    patches = [
        {
            "target": {"group": "admissionregistration.k8s.io", "kind": kind, "name": WEBHOOK_CONFIGURATION},
            "patch": json.dumps(
                [{"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": ca_bundle}]
            ),
        }
        for kind, index in WEBHOOK_CONFIGURATIONS
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base.resolve(), output.resolve()), "webhook-tls-secret.yaml"],
        "patches": patches,
        "secretGenerator": [
            {"name": DATABASE_SECRET, "namespace": namespace, "envs": [DATABASE_ENV]},
            {
                "name": STATEMENT_KEY_SECRET,
                "namespace": namespace,
                "files": [f"key={STATEMENT_KEY_FILE}", f"verifier={STATEMENT_VERIFIER_FILE}"],
            },
        ],
    }
    (output / "webhook-tls-secret.yaml").touch(mode=0o600)
    (output / "webhook-tls-secret.yaml").write_text(yaml.safe_dump(secret, sort_keys=False))
    (output / "kustomization.yaml").write_text(
        "# Written by `gpusharing certs`: the webhook's TLS without cert-manager, the database password from\n"
        "# database.env, the statements' signing key from statement.key. Apply with kubectl apply -k.\n"
        + yaml.safe_dump(kustomization, sort_keys=False)
    )
    return output


API_SERVER_PATH = "/etc/kubernetes/gpusharing"  # where the control plane's nodes keep the API server's files


def write_client_auth(namespace: str, output: Path, days: int = 365, api_server_path: str = API_SERVER_PATH) -> Path:
    """The API server's client authentication to the webhook, for manifests/client-auth (a kustomize component):
    ca.crt (the webhook verifies the API server's certificate against it), and in apiserver/ the AdmissionConfiguration
    and the kubeconfig it names (the client certificate and key, for the webhook's Service name), for the control
    plane's nodes under `api_server_path`."""
    certificate = make_client_certificate("kube-apiserver", days)
    (output / "apiserver").mkdir(parents=True, exist_ok=True)
    (output / "ca.crt").write_bytes(certificate.ca_pem)
    user = {"client-certificate-data": base64.b64encode(certificate.cert_pem).decode(),
            "client-key-data": base64.b64encode(certificate.key_pem).decode()}
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "users": [{"name": f"{WEBHOOK_SERVICE}.{namespace}.svc", "user": user}],
    }
    (output / "apiserver" / "webhook-kubeconfig.yaml").touch(mode=0o600)
    (output / "apiserver" / "webhook-kubeconfig.yaml").write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
              "kubeConfigFile": f"{api_server_path}/webhook-kubeconfig.yaml"}
    admission = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {"name": name, "configuration": plugin}
            for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
        ],
    }
    (output / "apiserver" / "admission-configuration.yaml").write_text(yaml.safe_dump(admission, sort_keys=False))
    return output
