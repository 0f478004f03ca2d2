"""The certgen (`gpusharing certs --format cluster`, a Job and a CronJob): the webhook's CA and serving certificate
in its Secret, made and renewed in the cluster where cert-manager is not installed, and both webhook configurations
kept trusting the Secret's CA bundle; and the key that signs the statements of closed billing periods, made into its
Secret once. Decisions are plain functions of the Secret's data and the time (`renewal`, `ca_bundle_patch`,
`statement_key_secret`), so that tests need no cluster; `sync` reads and writes. docs/operations.md (the webhook's
certificate, the statements' signing key) says what is renewed when, why the webhook needs no restart, and why the
signing key is never changed here.
"""

from __future__ import annotations

import base64
import datetime
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gpusharing.kube.client import api_client
from gpusharing.serving.certs import (
    Authority,
    PrivateKey,
    certified_names,
    issue,
    key_pem,
    make_authority,
    pem,
    service_names,
    statement_key,
)

CA_LIFETIMES = 10  # the CA lives ten certificates' validity
RENEW_WHEN_LEFT = 3  # a certificate is renewed when a third of its validity is left
CONFIGURATION_WAIT_SECONDS = 60.0  # at install the Job may start before the configurations exist
# the Secret's: the CA bundle (current CA first), its key, the serving pair
KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key")
SECRET_TYPE = "kubernetes.io/tls"
FIELD_MANAGER = "gpusharing-certgen"
LABELS = {"app.kubernetes.io/part-of": "kube-gpusharing", "app.kubernetes.io/managed-by": FIELD_MANAGER}


class CertgenError(RuntimeError):
    """The API server refused or could not answer; the message says what was asked and why."""


@dataclass(frozen=True)
class StatementKey:
    """The Secret the statements' signing key is made into where there is none, and the new key's name."""

    secret: str
    name: str


@dataclass(frozen=True)
class Target:
    """What the certgen keeps: names in the webhook's namespace, and the webhook configurations' name."""

    namespace: str
    service: str
    secret: str
    configuration: str
    owner: str | None = None  # a ServiceAccount whose deletion deletes the Secret
    certificate: bool = True  # False: cert-manager issues it, and the Secret and configurations are left alone
    statement_key: StatementKey | None = None


@dataclass(frozen=True)
class Renewal:
    """The Secret's new data, and why it is renewed (the line the certgen prints)."""

    data: dict[str, bytes]  # the Secret's new data (KEYS), PEM
    why: str


class Unusable(ValueError):
    """The Secret holds no CA to keep; the message says why."""


@dataclass(frozen=True)
class Held:
    """What the Secret holds: the CAs it trusts, the current one with its key, and its data as read."""

    authorities: list[x509.Certificate]  # ca.crt: the current CA first
    authority: Authority
    data: Mapping[str, bytes]


def renewal(
    current: Mapping[str, bytes] | None, names: Sequence[str], days: int, now: datetime.datetime
) -> Renewal | None:
    """The Secret's new data and why, or None when `current` (its data, or None when there is none) serves `names`
    for long enough. `days` is the serving certificate's validity."""
    lifetime = datetime.timedelta(days=days)
    try:
        held = _held(current)
    except Unusable as exc:
        authority = make_authority(days * CA_LIFETIMES, now)
        return _issued(authority, [authority.cert], names, days, now, f"made a CA and a certificate ({exc})")
    ca = held.authority.cert
    trusted = [c for c in held.authorities if c.not_valid_after_utc > now]
    if ca.not_valid_after_utc - now < lifetime:
        authority = make_authority(days * CA_LIFETIMES, now)
        why = (f"made a new CA and a certificate (the CA expires {ca.not_valid_after_utc:%Y-%m-%d}; trusted beside "
               "the new one until then)")
        return _issued(authority, [authority.cert, *trusted], names, days, now, why)
    problem = _certificate_problem(held, names, lifetime, now)
    if problem:
        return _issued(held.authority, trusted, names, days, now, f"renewed the certificate ({problem})")
    if len(trusted) < len(held.authorities):
        data = {**held.data, "ca.crt": b"".join(pem(c) for c in trusted)}
        return Renewal(data, "dropped the expired CA from the bundle")
    return None


def _held(current: Mapping[str, bytes] | None) -> Held:
    if current is None:
        raise Unusable("there was no Secret")
    missing = [key for key in KEYS if not current.get(key)]
    if missing:
        raise Unusable(f"the Secret had no {', '.join(missing)}")
    try:
        authorities = x509.load_pem_x509_certificates(current["ca.crt"])
        key = serialization.load_pem_private_key(current["ca.key"], password=None)
    except ValueError as exc:
        raise Unusable(f"its CA could not be read: {exc}") from None
    if not isinstance(key, PrivateKey) or _public(key) != _public(authorities[0]):
        raise Unusable("ca.key was not the key of the first certificate of ca.crt")
    return Held(authorities, Authority(authorities[0], key), current)


def _certificate_problem(held: Held, names: Sequence[str], lifetime: datetime.timedelta, now: datetime.datetime) -> str:
    """Why the serving certificate must be renewed, or ''."""
    try:
        cert = x509.load_pem_x509_certificate(held.data["tls.crt"])
        key = serialization.load_pem_private_key(held.data["tls.key"], password=None)
    except ValueError:
        return "tls.crt or tls.key could not be read"
    try:
        cert.verify_directly_issued_by(held.authority.cert)
    except (ValueError, TypeError, InvalidSignature):
        return "it was not issued by the CA"
    if _public(key) != _public(cert):
        return "tls.key was not its key"
    if certified_names(cert) != set(names):
        return f"it was for {', '.join(sorted(certified_names(cert)))}"
    if cert.not_valid_after_utc - now < lifetime / RENEW_WHEN_LEFT:
        return f"it expires {cert.not_valid_after_utc:%Y-%m-%d}"
    return ""


def _public(subject: Any) -> bytes:
    """The public key of a certificate or a private key, comparable."""
    public = subject.public_key()
    return bytes(public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))


def _issued(
    authority: Authority,
    trusted: list[x509.Certificate],
    names: Sequence[str],
    days: int,
    now: datetime.datetime,
    why: str,
) -> Renewal:
    cert, key = issue(authority, list(names), days, now)
    data = {
        "ca.crt": b"".join(pem(c) for c in trusted),
        "ca.key": key_pem(authority.key),
        "tls.crt": pem(cert),
        "tls.key": key_pem(key),
    }
    return Renewal(data, why)


def statement_key_secret(namespace: str, key: StatementKey) -> dict[str, Any]:
    """The Secret of a new signing key for statements (`key`, and `verifier` to publish), as the certgen creates it.
    It has no owner: uninstalling leaves it beside the database whose statements it signed, so that a reinstall goes
    on signing their chain."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": key.secret, "namespace": namespace, "labels": dict(LABELS)},
        "data": {name: base64.b64encode(value).decode() for name, value in statement_key(key.name).items()},
    }


def ca_bundle_patch(webhooks: Sequence[tuple[str, str | None]], bundle: str) -> list[dict[str, Any]]:
    """The JSON patch that makes every webhook of a configuration ((name, caBundle) in order) trust `bundle` (base64),
    each change guarded by the webhook's name; [] when they all do."""
    patch: list[dict[str, Any]] = []
    for index, (name, current) in enumerate(webhooks):
        if current != bundle:
            patch.append({"op": "test", "path": f"/webhooks/{index}/name", "value": name})
            patch.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": bundle})
    return patch


def sync(
    api: client.ApiClient,
    target: Target,
    days: int,
    now: datetime.datetime,
    say: Callable[[str], None] = print,
    wait_seconds: float = CONFIGURATION_WAIT_SECONDS,
) -> None:
    """Keeps the webhook's certificate (unless `target.certificate` is False), then makes the statements' signing key
    where `target` names its Secret and it does not exist. CertgenError when the API server refuses or cannot
    answer."""
    if target.certificate:
        _sync_certificate(api, target, days, now, say, wait_seconds)
    if target.statement_key is not None:
        _make_statement_key(client.CoreV1Api(api), target.namespace, target.statement_key, say)


def _sync_certificate(
    api: client.ApiClient,
    target: Target,
    days: int,
    now: datetime.datetime,
    say: Callable[[str], None],
    wait_seconds: float,
) -> None:
    """Makes or renews the Secret as `renewal` decides, and has both webhook configurations trust its CA bundle:
    first the configurations (a new bundle holds the CA the webhook serves with until the Secret changes), then the
    Secret."""
    core = client.CoreV1Api(api)
    where = f"Secret {target.namespace}/{target.secret}"
    secret = _call(
        f"read {where}", lambda: core.read_namespaced_secret(target.secret, target.namespace), missing_ok=True
    )
    current = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()} if secret else None
    planned = renewal(current, service_names(target.namespace, target.service), days, now)
    data = planned.data if planned else current
    assert data is not None  # renewal makes data whenever there is none
    bundle = base64.b64encode(data["ca.crt"]).decode()
    admission = client.AdmissionregistrationV1Api(api)
    for kind, read, patch in (
        (
            "MutatingWebhookConfiguration",
            admission.read_mutating_webhook_configuration,
            admission.patch_mutating_webhook_configuration,
        ),
        (
            "ValidatingWebhookConfiguration",
            admission.read_validating_webhook_configuration,
            admission.patch_validating_webhook_configuration,
        ),
    ):
        configuration = _wait_for(
            f"{kind} {target.configuration}", functools.partial(read, target.configuration), wait_seconds, say
        )
        webhooks = [(w.name, w.client_config.ca_bundle) for w in configuration.webhooks or []]
        changes = ca_bundle_patch(webhooks, bundle)
        if changes:
            _call(f"patch the caBundle of {kind} {target.configuration}",
                  functools.partial(patch, target.configuration, changes, field_manager=FIELD_MANAGER))
            say(f"{kind} {target.configuration}: caBundle set to the CA bundle of {where}")
    if planned is None:
        expires = x509.load_pem_x509_certificate(data["tls.crt"]).not_valid_after_utc
        say(f"{where}: kept (the certificate expires {expires:%Y-%m-%d}, renewed a third of its validity before)")
        return
    metadata: dict[str, Any] = {
        "name": target.secret,
        "namespace": target.namespace,
        "labels": {**LABELS, **((secret.metadata.labels or {}) if secret else {})},
    }
    if target.owner:
        metadata["ownerReferences"] = [_owned_by(core, target.namespace, target.owner)]
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": SECRET_TYPE,
        "metadata": metadata,
        "data": {key: base64.b64encode(value).decode() for key, value in planned.data.items()},
    }
    if secret is None:
        # The client sends a dict body as it is (sanitize_for_serialization); its types name the model class alone.
        _call(
            f"create {where}",
            lambda: core.create_namespaced_secret(
                target.namespace, body, field_manager=FIELD_MANAGER  # type: ignore[arg-type]
            ),
        )
    else:
        # Replaced, not patched: its resourceVersion makes a concurrent run's write fail rather than mix two
        # certificates.
        metadata["resourceVersion"] = secret.metadata.resource_version
        metadata["annotations"] = secret.metadata.annotations
        if not target.owner:
            metadata["ownerReferences"] = api.sanitize_for_serialization(secret.metadata.owner_references)
        _call(
            f"update {where}",
            lambda: core.replace_namespaced_secret(
                target.secret, target.namespace, body, field_manager=FIELD_MANAGER  # type: ignore[arg-type]
            ),
        )
    say(f"{where}: {planned.why}")


def _make_statement_key(core: client.CoreV1Api, namespace: str, key: StatementKey, say: Callable[[str], None]) -> None:
    """Creates the key's Secret unless it exists. Never a read: the certgen may create Secrets but not get this one,
    so it cannot read a signing key, and an existing one (the admin's, or rotated) is never changed."""
    where = f"Secret {namespace}/{key.secret}"
    body = statement_key_secret(namespace, key)
    # The client sends a dict body as it is (sanitize_for_serialization); its types name the model class alone.
    created = _call(
        f"create {where}",
        lambda: core.create_namespaced_secret(namespace, body, field_manager=FIELD_MANAGER),  # type: ignore[arg-type]
        exists_ok=True,
    )
    if created is None:
        say(f"{where}: kept (it exists; the statements' signing key is never changed by the certgen)")
        return
    verifier = base64.b64decode(body["data"]["verifier"]).decode().strip()
    say(f"{where}: made a key to sign the statements of closed billing periods; publish its verifier key {verifier}")


def _owned_by(core: client.CoreV1Api, namespace: str, service_account: str) -> dict[str, Any]:
    owner = _call(f"read ServiceAccount {namespace}/{service_account}",
                  lambda: core.read_namespaced_service_account(service_account, namespace))
    return {"apiVersion": "v1", "kind": "ServiceAccount", "name": service_account, "uid": owner.metadata.uid}


def _wait_for(what: str, read: Callable[[], Any], seconds: float, say: Callable[[str], None]) -> Any:
    """`read()`'s object, waiting up to `seconds` for it to be created (the install applies it beside the Job)."""
    deadline = time.monotonic() + seconds
    waited = False
    while True:
        found = _call(f"read {what}", read, missing_ok=True)
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise CertgenError(
                f"{what} does not exist (waited {seconds:.0f} s): install the chart or the manifests, which create it"
            )
        if not waited:
            say(f"waiting for {what} to be created")
            waited = True
        time.sleep(1)


def _call(what: str, call: Callable[[], Any], missing_ok: bool = False, exists_ok: bool = False) -> Any:
    """`call()`'s answer; None for a 404 where `missing_ok`, and for a create's 409 (it exists) where `exists_ok`."""
    try:
        return call()
    except ApiException as exc:
        if (missing_ok and exc.status == 404) or (exists_ok and exc.status == 409):
            return None
        raise CertgenError(f"cannot {what}: {exc.status} {exc.reason}: {_message(exc)}") from None
    except HTTPError as exc:  # urllib3's retries exhausted: the last attempt's reason says the most
        raise CertgenError(
            f"cannot {what}: the API server did not answer ({getattr(exc, 'reason', None) or exc})"
        ) from None


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.body or "").strip()[:200]


def main(target: Target, days: int) -> int:
    """`gpusharing certs --format cluster`: 0 when the Secrets and the configurations are as they must be, 1 (one line
    on stderr) when the API server refused or could not be reached; the Job then tries again."""
    api = api_client(os.environ.get("KUBECONFIG") or None, "KUBECONFIG")
    # its retries: the last one's reason is said below
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    try:
        sync(api, target, days, datetime.datetime.now(datetime.timezone.utc))
    except CertgenError as exc:
        print(f"gpusharing certs: {exc}", file=sys.stderr)
        return 1
    return 0
