"""A private CA and a serving certificate, for the webhook where cert-manager is not installed (and for the demo); a
CA and a client certificate, for the API server to prove itself to the webhook."""

from __future__ import annotations

import argparse
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

from gpusharing.settings.arguments import host_name, namespace, whole_number
from gpusharing.settings.env import ConfigError


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
    """A fresh CA and a certificate signed by it for `names` (DNS names or IP addresses).

    Both carry what strict verifiers require (OpenSSL's -x509_strict, Python 3.13's default TLS context): key
    identifiers, critical basicConstraints and keyUsage, and serverAuth for the serving certificate.
    """
    return _signed("gpusharing webhook CA", names[0], [_general_name(n) for n in names], ExtendedKeyUsageOID.SERVER_AUTH, days)


def make_client_certificate(common_name: str, days: int = 365) -> ServingCertificate:
    """A fresh CA and a client certificate (clientAuth) signed by it, for `common_name`."""
    return _signed("gpusharing webhook client CA", common_name, [], ExtendedKeyUsageOID.CLIENT_AUTH, days)


def _signed(ca_common_name: str, common_name: str, names: list[x509.GeneralName], usage: x509.ObjectIdentifier,
            days: int) -> ServingCertificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_common_name)])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = (
        builder
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ServingCertificate(
        ca_pem=ca.public_bytes(serialization.Encoding.PEM),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


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
WEBHOOK_CONFIGURATIONS = (("MutatingWebhookConfiguration", 0), ("ValidatingWebhookConfiguration", 0))
DATABASE_SECRET = "gpusharing-database"
DATABASE_ENV = "database.env"


def service_names(namespace: str) -> list[str]:
    """The DNS names the API server may use for the webhook's Service."""
    return [
        f"{WEBHOOK_SERVICE}.{namespace}.svc",
        f"{WEBHOOK_SERVICE}.{namespace}.svc.cluster.local",
        f"{WEBHOOK_SERVICE}.{namespace}",
        WEBHOOK_SERVICE,
    ]


def write_overlay(namespace: str, base: Path, output: Path, days: int = 365) -> Path:
    """A kustomize overlay of `base` with the webhook's TLS Secret and the caBundle of both configurations, and the
    database Secret generated from a database.env with a random password (kept when the overlay is written again:
    PostgreSQL keeps the password it was first started with)."""
    certificate = make_serving_certificate(service_names(namespace), days)
    output.mkdir(parents=True, exist_ok=True)
    database_env = output / DATABASE_ENV
    if not database_env.exists():
        database_env.touch(mode=0o600)
        database_env.write_text(f"password={secrets.token_hex(24)}\n")
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
            "target": {"group": "admissionregistration.k8s.io", "kind": kind, "name": "gpusharing"},
            "patch": json.dumps([{"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": ca_bundle}]),
        }
        for kind, index in WEBHOOK_CONFIGURATIONS
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base.resolve(), output.resolve()), "webhook-tls-secret.yaml"],
        "patches": patches,
        "secretGenerator": [{"name": DATABASE_SECRET, "namespace": namespace, "envs": [DATABASE_ENV]}],
    }
    (output / "webhook-tls-secret.yaml").touch(mode=0o600)
    (output / "webhook-tls-secret.yaml").write_text(yaml.safe_dump(secret, sort_keys=False))
    (output / "kustomization.yaml").write_text(
        "# Written by `gpusharing certs`: the webhook's TLS without cert-manager, and the database password from\n"
        "# database.env. Apply with kubectl apply -k.\n"
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
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "users": [{"name": f"{WEBHOOK_SERVICE}.{namespace}.svc", "user": user}]}
    (output / "apiserver" / "webhook-kubeconfig.yaml").touch(mode=0o600)
    (output / "apiserver" / "webhook-kubeconfig.yaml").write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
              "kubeConfigFile": f"{api_server_path}/webhook-kubeconfig.yaml"}
    admission = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
                 "plugins": [{"name": name, "configuration": plugin} for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")]}
    (output / "apiserver" / "admission-configuration.yaml").write_text(yaml.safe_dump(admission, sort_keys=False))
    return output


MAX_DAYS = 3650  # ten years: beyond it a renewal is forgotten rather than planned


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    certs = subparsers.add_parser(
        "certs",
        help="make a CA and the webhook's serving certificate: a kustomize overlay for clusters without cert-manager, "
        "or PEM files for local runs",
        description="Make a private CA and the webhook's serving certificate (ECDSA P-256, SHA-256).",
        epilog="examples:\n"
        "  gpusharing certs --namespace gpusharing-system     # writes manifests/local-certs/, then:\n"
        "  kubectl apply -k manifests/local-certs\n"
        "  gpusharing certs --format pem --output /tmp/tls --name localhost --name 127.0.0.1\n"
        "  gpusharing certs --format client-auth --output manifests/client-auth",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    certs.add_argument("--namespace", default="gpusharing-system", type=namespace, help="where the webhook runs")
    certs.add_argument("--base", default="manifests/base", type=Path, help="the manifests to overlay")
    certs.add_argument("--output", default="manifests/local-certs", type=Path, help="the overlay's (or PEM files') directory")
    certs.add_argument("--days", type=whole_number(1, MAX_DAYS), default=365,
                       help=f"validity of the CA and the certificate, 1 to {MAX_DAYS} (default 365)")
    certs.add_argument("--format", choices=("overlay", "pem", "client-auth"), default="overlay",
                       help="overlay: Secret and caBundle patch over --base; pem: ca.crt, tls.crt, tls.key; client-auth: the "
                       "API server's client certificate for the webhook (ca.crt for manifests/client-auth, apiserver/ for "
                       "the control plane's nodes)")
    certs.add_argument("--apiserver-path", default=API_SERVER_PATH,
                       help=f"with --format client-auth: where the control plane's nodes keep apiserver/'s files (default {API_SERVER_PATH})")
    certs.add_argument("--name", action="append", default=[], type=host_name,
                       help="with --format pem: a DNS name or IP to certify (repeatable)")
    certs.set_defaults(run=_certs)


def _certs(args: argparse.Namespace) -> int:
    if args.format == "client-auth":
        output = write_client_auth(args.namespace, args.output, args.days, args.apiserver_path)
        print(f"wrote {output}/ca.crt (for components: [client-auth]) and {output}/apiserver/ (keep it secret)")
        print(f"on every control plane node: copy {output}/apiserver/*.yaml into {args.apiserver_path}/ and run kube-apiserver "
              f"with --admission-control-config-file={args.apiserver_path}/admission-configuration.yaml")
        return 0
    if args.format == "pem":
        names = args.name or service_names(args.namespace)
        make_serving_certificate(names, args.days).write(args.output)
        print(f"wrote {args.output}/ca.crt, tls.crt, tls.key for {', '.join(names)}")
        return 0
    if not (args.base / "kustomization.yaml").is_file():
        raise ConfigError(f"{args.base} holds no kustomization.yaml: give --base the path of manifests/base")
    output = write_overlay(args.namespace, args.base, args.output, args.days)
    print(f"wrote {output}/ (Secret {WEBHOOK_SECRET}, the caBundle of both webhook configurations, {DATABASE_ENV})")
    print(f"install with: kubectl apply -k {output}")
    return 0
