"""The certgen's decisions: when the webhook's Secret gets a new certificate or a new CA, what the webhook
configurations must trust, and that every certificate it serves verifies under the bundle they trust (strictly, as
the API server verifies it); the statements' signing key it makes, and that an existing one is kept. Its reads and
writes run against a real API server in tests/e2e/test_certgen.py."""

from __future__ import annotations

import base64
import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.verification import DNSName, PolicyBuilder, Store, VerificationError
from kubernetes.client.exceptions import ApiException

from demo.processes import free_port
from gpusharing.cli import main
from gpusharing.serving.certgen import (
    CA_LIFETIMES,
    FIELD_MANAGER,
    CertgenError,
    Renewal,
    StatementKey,
    _call,
    ca_bundle_patch,
    renewal,
    statement_key_secret,
)
from gpusharing.serving.certs import STATEMENT_KEY_NAME, certified_names, make_serving_certificate, service_names
from gpusharing.statements.note import Signer, Verifier, open_note, sign_note
from gpusharing.statements.statement import origin_of
from tests.e2e.controlplane import write_kubeconfig

START = datetime.datetime(2026, 3, 1, tzinfo=datetime.timezone.utc)
DAYS = 365
NAMES = service_names("gpusharing-system")


def at(days: float) -> datetime.datetime:
    return START + datetime.timedelta(days=days)


def made() -> Renewal:
    first = renewal(None, NAMES, DAYS, START)
    assert first is not None
    return first


def cert(data: dict[str, bytes]) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data["tls.crt"])


def authorities(data: dict[str, bytes]) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(data["ca.crt"])


def serves(data: dict[str, bytes], when: datetime.datetime, trusted: bytes | None = None) -> bool:
    """Whether a verifier trusting `trusted` (default: the data's own bundle) accepts, at `when`, the data's
    certificate for the name the API server verifies (cryptography's RFC 5280 verifier, strict as the Web PKI's)."""
    store = Store(x509.load_pem_x509_certificates(trusted or data["ca.crt"]))
    verifier = PolicyBuilder().store(store).time(when).build_server_verifier(DNSName(NAMES[0]))
    try:
        verifier.verify(cert(data), [])
    except VerificationError:
        return False
    return True


def test_without_a_secret_it_makes_a_ca_and_a_certificate_for_the_services_names() -> None:
    data = made().data
    assert set(data) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    (ca,) = authorities(data)
    assert certified_names(cert(data)) == set(NAMES)
    assert cert(data).not_valid_after_utc == at(DAYS)
    assert ca.not_valid_after_utc == at(DAYS * CA_LIFETIMES)
    assert serves(data, START) and serves(data, at(DAYS - 1)) and not serves(data, at(DAYS + 1))


def test_a_secret_that_serves_long_enough_is_kept() -> None:
    data = made().data
    assert renewal(data, NAMES, DAYS, START) is None
    assert renewal(data, NAMES, DAYS, at(DAYS - DAYS / 3 - 1)) is None


def test_a_third_of_its_validity_before_the_end_the_certificate_is_renewed_by_the_same_ca() -> None:
    data = made().data
    renewed = renewal(data, NAMES, DAYS, at(DAYS - DAYS / 3 + 1))
    assert renewed is not None and renewed.why == "renewed the certificate (it expires 2027-03-01)"
    assert renewed.data["ca.crt"] == data["ca.crt"] and renewed.data["ca.key"] == data["ca.key"]  # the caBundle stays
    assert renewed.data["tls.key"] != data["tls.key"]
    assert cert(renewed.data).not_valid_after_utc == at(DAYS - DAYS / 3 + 1 + DAYS)
    assert serves(renewed.data, at(DAYS + 1), trusted=data["ca.crt"])  # by what the configurations already trust


def test_a_certificate_for_other_names_is_renewed() -> None:
    renewed = renewal(made().data, service_names("elsewhere", "gpu-governance-webhook"), DAYS, START)
    assert renewed is not None and renewed.why.startswith("renewed the certificate (it was for gpusharing-webhook, ")
    assert certified_names(cert(renewed.data)) == set(service_names("elsewhere", "gpu-governance-webhook"))


def test_before_the_ca_would_cut_a_certificate_short_a_new_ca_is_trusted_beside_the_old_one() -> None:
    old = made().data
    when = at(DAYS * CA_LIFETIMES - DAYS + 1)  # a certificate issued now would outlive the CA
    rotated = renewal(old, NAMES, DAYS, when)
    assert rotated is not None and rotated.why.startswith("made a new CA and a certificate (the CA expires 2036-02-27;")
    new_ca, old_ca = authorities(rotated.data)
    assert old_ca == authorities(old)[0] and new_ca.not_valid_after_utc == when + datetime.timedelta(
        days=DAYS * CA_LIFETIMES
    )
    assert cert(rotated.data).not_valid_after_utc <= new_ca.not_valid_after_utc


def test_once_the_old_ca_has_expired_it_leaves_the_bundle() -> None:
    rotated = renewal(made().data, NAMES, DAYS, at(DAYS * CA_LIFETIMES - 200))
    assert rotated is not None and len(authorities(rotated.data)) == 2
    later = renewal(rotated.data, NAMES, DAYS, at(DAYS * CA_LIFETIMES + 1))
    assert later is not None and later.why == "dropped the expired CA from the bundle"
    assert authorities(later.data) == authorities(rotated.data)[:1] and later.data["tls.crt"] == rotated.data["tls.crt"]
    assert renewal(later.data, NAMES, DAYS, at(DAYS * CA_LIFETIMES + 1)) is None


def test_run_every_week_for_two_ca_lifetimes_the_webhook_is_always_trusted() -> None:
    """What the CronJob does over the years: at every run, the certificate the webhook serves (the one before, until
    the kubelet brings the new one) verifies under the bundle the configurations get."""
    data, renewals = made().data, []
    for week in range(1, 2 * CA_LIFETIMES * DAYS // 7):
        when = at(week * 7)
        assert serves(data, when), f"week {week}: the certificate no longer verifies"
        renewed = renewal(data, NAMES, DAYS, when)
        if renewed:
            assert serves(data, when, trusted=renewed.data["ca.crt"]) and serves(renewed.data, when), f"week {week}"
            data = renewed.data
            renewals.append(renewed.why.split(" (")[0])
    assert (
        renewals.count("made a new CA and a certificate") == 2 and "dropped the expired CA from the bundle" in renewals
    )


@pytest.mark.parametrize(("change", "why"), [
    ({"ca.key": b""}, "made a CA and a certificate (the Secret had no ca.key)"),
    ({"ca.crt": b"not PEM"}, "made a CA and a certificate (its CA could not be read: "),
    ({"tls.crt": b"not PEM"}, "renewed the certificate (tls.crt or tls.key could not be read)"),
])
def test_a_broken_secret_is_made_anew_or_its_certificate_renewed(change: dict[str, bytes], why: str) -> None:
    renewed = renewal({**made().data, **change}, NAMES, DAYS, START)
    assert renewed is not None and renewed.why.startswith(why)


def test_a_secret_of_another_issuer_is_made_anew() -> None:
    """What cert-manager wrote, for one: no CA key to renew with."""
    renewed = renewal({"ca.crt": b"x", "tls.crt": b"x", "tls.key": b"x"}, NAMES, DAYS, START)
    assert renewed is not None and renewed.why == "made a CA and a certificate (the Secret had no ca.key)"


def test_keys_that_belong_to_other_certificates_are_found() -> None:
    first, second = made().data, made().data
    swapped_ca = renewal({**first, "ca.key": second["ca.key"]}, NAMES, DAYS, START)
    assert swapped_ca is not None and swapped_ca.why.endswith(
        "(ca.key was not the key of the first certificate of ca.crt)"
    )
    swapped_key = renewal({**first, "tls.key": second["tls.key"]}, NAMES, DAYS, START)
    assert swapped_key is not None and swapped_key.why == "renewed the certificate (tls.key was not its key)"
    other_issuer = renewal({**first, "tls.crt": second["tls.crt"], "tls.key": second["tls.key"]}, NAMES, DAYS, START)
    assert other_issuer is not None and other_issuer.why == "renewed the certificate (it was not issued by the CA)"


def test_the_ca_bundle_patch_sets_each_webhook_that_lacks_it_guarded_by_its_name() -> None:
    assert ca_bundle_patch([("mutate.gpusharing.io", "QQ==")], "QQ==") == []
    assert ca_bundle_patch([("a", None), ("b", "QQ=="), ("c", "old")], "QQ==") == [
        {"op": "test", "path": "/webhooks/0/name", "value": "a"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "QQ=="},
        {"op": "test", "path": "/webhooks/2/name", "value": "c"},
        {"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": "QQ=="},
    ]


def test_a_statement_key_secret_holds_a_new_signing_key_and_its_verifier_key() -> None:
    key = StatementKey("gpusharing-statement-key", "gpusharing.io/prod-eu/statements")
    secret = statement_key_secret("gpusharing-system", key)
    assert (secret["kind"], secret["type"]) == ("Secret", "Opaque")
    assert secret["metadata"] == {
        "name": "gpusharing-statement-key",
        "namespace": "gpusharing-system",
        "labels": {"app.kubernetes.io/part-of": "kube-gpusharing", "app.kubernetes.io/managed-by": FIELD_MANAGER},
    }  # no ownerReferences: uninstalling keeps it, beside the database whose statements it signed
    data = {name: base64.b64decode(value).decode() for name, value in secret["data"].items()}
    assert set(data) == {"key", "verifier"} and data["key"].endswith("\n") and data["verifier"].endswith("\n")
    signer, verifier = Signer.from_text(data["key"].strip()), Verifier.from_text(data["verifier"].strip())
    assert signer.verifier == verifier and verifier.name == "gpusharing.io/prod-eu/statements"
    # A note it signs opens under the verifier key alone, as an auditor opens a statement.
    assert open_note(sign_note("gpusharing.io/prod-eu/statements\n0\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n",
                               [signer]), [verifier]).signed_by(verifier)
    assert statement_key_secret("gpusharing-system", key)["data"] != secret["data"]  # a new key each time


def test_the_default_key_name_is_the_origin_of_the_statements_of_the_default_cluster() -> None:
    assert STATEMENT_KEY_NAME == origin_of("kubernetes") == "gpusharing.io/kubernetes/statements"


def test_a_statement_key_that_exists_is_kept_and_any_other_refusal_said() -> None:
    def refused(status: int) -> None:
        raise ApiException(status=status, reason="Conflict" if status == 409 else "Forbidden")

    what = "create Secret ns/gpusharing-statement-key"
    assert _call(what, lambda: refused(409), exists_ok=True) is None  # it exists: kept, never read
    with pytest.raises(CertgenError, match="cannot create Secret ns/gpusharing-statement-key: 409 Conflict"):
        _call(what, lambda: refused(409))
    with pytest.raises(CertgenError, match="cannot create Secret ns/gpusharing-statement-key: 403 Forbidden"):
        _call(what, lambda: refused(403), exists_ok=True)


@pytest.mark.parametrize(("args", "message"), [
    (["--service", "Webhook"], "argument --service: 'Webhook' is not a Kubernetes object name"),
    (["--secret", "a" * 64], "argument --secret: "),
    (["--owner", "x_y"], "argument --owner: 'x_y' is not a Kubernetes object name"),
    (["--format", "secret"], "argument --format: invalid choice: 'secret'"),
    (["--statement-key-secret", "Key"], "argument --statement-key-secret: 'Key' is not a Kubernetes object name"),
    (["--statement-key-name", "prod gpus"], "argument --statement-key-name: signer key's key name has a space"),
    (["--statement-key-name", "a+b"], "argument --statement-key-name: signer key's key name has a '+'"),
])
def test_bad_cluster_arguments_are_one_usage_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["certs", "--format", "cluster", *args])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"gpusharing certs: error: {message}")


@pytest.mark.parametrize(("args", "message"), [
    (["--no-certificate"], "--no-certificate leaves nothing to do without --statement-key-secret"),
    (["--statement-key-name", "prod"], "--statement-key-name names the key --statement-key-secret makes: give its "
                                       "Secret too"),
])
def test_options_that_do_nothing_together_are_one_line_before_any_call(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["certs", "--format", "cluster", *args]) == 2
    assert capsys.readouterr().err.strip() == f"gpusharing: {message}"


def test_outside_a_cluster_without_a_kubeconfig_it_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["certs", "--format", "cluster"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(
        "gpusharing: cannot configure the Kubernetes API from the in-cluster ServiceAccount (outside a cluster, set "
        "KUBECONFIG"
    )
    assert len(error.splitlines()) == 1


def test_an_api_server_that_does_not_answer_is_one_line_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    ca = make_serving_certificate(["127.0.0.1"]).write(tmp_path)["ca"]
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", server, ca, {"token": "t"})))
    assert main(["certs", "--format", "cluster", "--namespace", "ns"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == (
        "gpusharing certs: cannot read Secret ns/gpusharing-webhook-tls: the API server did not answer "
        f"(HTTPSConnection(host='127.0.0.1', port={server.rsplit(':', 1)[1]}): Failed to establish a new connection: "
        "[Errno 111] Connection refused)"
    )
