"""`gpusharing certs`: certificates that strict verifiers accept (OpenSSL -x509_strict, Python 3.13's default
context)."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpusharing.cli import main
from gpusharing.serving.certs import make_serving_certificate


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_serving_certificate(["127.0.0.1", "localhost"]).write(tmp_path_factory.mktemp("tls"))


def strict_client(ca_file: Path) -> ssl.SSLContext:
    """The client context Python 3.13 makes by default; the flag is set explicitly so that 3.11 and 3.12 check it
    too."""
    context = ssl.create_default_context(cafile=str(ca_file))
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    return context


def handshake(cert: Path, key: Path, client: ssl.SSLContext, server_name: str) -> str:
    """A TLS handshake on loopback; the protocol version agreed, or the client's ssl.SSLError."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(str(cert), str(key))
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def serve_one() -> None:
            connection, _ = listener.accept()
            try:
                with server.wrap_socket(connection, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass  # the client refused the certificate

        thread = threading.Thread(target=serve_one, daemon=True)
        thread.start()
        try:
            with socket.create_connection(listener.getsockname(), timeout=10) as raw:
                with client.wrap_socket(raw, server_hostname=server_name) as tls:
                    return str(tls.version())
        finally:
            thread.join(timeout=10)


def test_openssl_verifies_the_certificate_strictly_for_a_tls_server(pem: dict[str, Path]) -> None:
    result = subprocess.run(
        ["openssl", "verify", "-x509_strict", "-purpose", "sslserver", "-CAfile", str(pem["ca"]), str(pem["cert"])],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("server_name", ["127.0.0.1", "localhost"])
def test_a_strict_default_client_context_accepts_the_certificate(pem: dict[str, Path], server_name: str) -> None:
    assert handshake(pem["cert"], pem["key"], strict_client(pem["ca"]), server_name).startswith("TLS")


def test_the_strict_client_refuses_a_certificate_without_key_identifiers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `gpusharing certs` made before: the same chain less the key identifiers. The strict check bites."""
    keys: list[ec.EllipticCurvePrivateKey] = []
    generate = ec.generate_private_key
    monkeypatch.setattr(ec, "generate_private_key", lambda curve: keys.append(generate(curve)) or keys[-1])
    pem = make_serving_certificate(["127.0.0.1"]).write(tmp_path)
    ca_key = keys[0]  # the CA's key is made first
    served = x509.load_pem_x509_certificate(pem["cert"].read_bytes())
    issuer = x509.load_pem_x509_certificate(pem["ca"].read_bytes()).subject
    builder = (
        x509.CertificateBuilder()
        .subject_name(served.subject)
        .issuer_name(issuer)
        .public_key(served.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(served.not_valid_before_utc)
        .not_valid_after(served.not_valid_after_utc)
    )
    for extension in served.extensions:
        if not isinstance(extension.value, (x509.AuthorityKeyIdentifier, x509.SubjectKeyIdentifier)):
            builder = builder.add_extension(extension.value, extension.critical)
    (tmp_path / "bare.crt").write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    assert handshake(pem["cert"], pem["key"], strict_client(pem["ca"]), "127.0.0.1").startswith("TLS")
    with pytest.raises(ssl.SSLCertVerificationError, match="Authority Key Identifier"):
        handshake(tmp_path / "bare.crt", pem["key"], strict_client(pem["ca"]), "127.0.0.1")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--days", "-3"], "argument --days: -3 must be from 1 to 3,650"),
        (["--days", "many"], "argument --days: 'many' is not a whole number"),
        (["--namespace", "Bad_NS"], "argument --namespace: 'Bad_NS' is not a namespace name"),
        (["--format", "pem", "--name", "not a host"], "argument --name: 'not a host' is neither a DNS name"),
    ],
)
def test_bad_arguments_are_one_usage_line_not_a_traceback(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["certs", "--output", str(tmp_path / "out"), *args])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"gpusharing certs: error: {message}")
    assert not (tmp_path / "out").exists()
