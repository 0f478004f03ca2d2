"""`kubectl gpusharing` reaches the API server as the official client does for the kubeconfig: through the cluster's
`proxy-url`, with an exec plugin's token fetched again when it expires, `tls-server-name`, `insecure-skip-tls-verify`,
the chosen context; and every kubeconfig it cannot use, every server it cannot reach and every credential refused
is one line on stderr saying what to fix, with its exit status.

The API server is the loopback fake of demo/kubeapi.py over TLS (a test CA), its service proxy leading to a
stand-in of the timekeeper's budget listing; the proxy is tests/connectproxy.py."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from flask import Flask

from demo.kubeapi import FakeKube
from gpusharing.cli import main
from tests.connectproxy import ConnectProxy
from tests.timekeeper.conftest import served

SERVICE = ("gpusharing-system", "http:gpusharing-timekeeper:8080")
LISTING = {"items": [], "default": {"state": "in-budget"}}
PROXY_VARIABLES = tuple(
    v for name in ("https", "http", "all", "no") for v in (f"{name}_proxy", f"{name.upper()}_PROXY")
)
APISERVER_NAME = "apiserver.test"  # the only name in the certificate of `named_kube`


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def serve_as(ca: trustme.CA, *names: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(context)
    return context


@pytest.fixture
def timekeeper() -> Iterator[str]:
    """A stand-in of the timekeeper: its budget listing, and who asked for it."""
    app = Flask("stand-in")
    app.add_url_rule("/api/v1/budgets", "budgets", lambda: LISTING)
    with served(app) as url:
        yield url


def fake_kube(tls: ssl.SSLContext, timekeeper: str) -> FakeKube:
    fake = FakeKube(tls=tls)
    fake.services[SERVICE] = timekeeper
    fake.service_account_tokens[("gpusharing-system", "gpusharing-budget-admin")] = "admin-token"
    return fake


@pytest.fixture
def kube(ca: trustme.CA, timekeeper: str) -> Iterator[FakeKube]:
    fake = fake_kube(serve_as(ca, "127.0.0.1"), timekeeper)
    yield fake
    fake.close()


@pytest.fixture
def named_kube(ca: trustme.CA, timekeeper: str) -> Iterator[FakeKube]:
    """An API server on 127.0.0.1 whose certificate names only APISERVER_NAME."""
    fake = fake_kube(serve_as(ca, APISERVER_NAME), timekeeper)
    yield fake
    fake.close()


@pytest.fixture
def proxy() -> Iterator[ConnectProxy]:
    proxy = ConnectProxy()
    yield proxy
    proxy.close()


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The official client, like kubectl, also takes a proxy from the environment: none here but the kubeconfig's.
    for variable in ("TIMEKEEPER_URL", "TIMEKEEPER_TOKEN", "KUBECONFIG", *PROXY_VARIABLES):
        monkeypatch.delenv(variable, raising=False)


def write_kubeconfig(path: Path, server: str, ca: trustme.CA | None = None, user: dict[str, Any] | None = None,
                     **cluster: Any) -> Path:
    """A kubeconfig of one context, `fake`, and a second one, `other`, of the same cluster and another user."""
    if ca is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca.cert_pem.bytes()).decode()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "someone", "user": user or {"token": "kubectl-user"}},
                  {"name": "other", "user": {"token": "other-user"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "someone"}},
                     {"name": "other", "context": {"cluster": "fake", "user": "other", "namespace": "team-b"}}],
    }))
    return path


def plugin(capsys: pytest.CaptureFixture[str], kubeconfig: Path | str, *args: str) -> tuple[int, str, str]:
    try:
        code = main(
            ["budget", "ls", "-o", "json", "--kubeconfig", str(kubeconfig), *args],
            prog="kubectl gpusharing",
            plugin=True,
        )
    except SystemExit as exited:
        code = int(exited.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def listed(result: tuple[int, str, str]) -> bool:
    code, out, err = result
    return code == 0 and err == "" and json.loads(out) == LISTING


def one_line(result: tuple[int, str, str], code: int) -> str:
    """The single line on stderr of a failure with exit status `code`, nothing on stdout."""
    assert result[:2] == (code, ""), result
    assert result[2].count("\n") == 1 and result[2].startswith("gpusharing: "), result[2]
    return result[2].rstrip("\n")


def test_the_clusters_proxy_url_carries_every_request(
    kube: FakeKube, ca: trustme.CA, proxy: ConnectProxy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    direct = write_kubeconfig(tmp_path / "direct", kube.url, ca)
    assert listed(plugin(capsys, direct)) and proxy.tunnels == []
    proxied = write_kubeconfig(tmp_path / "proxied", kube.url, ca, **{"proxy-url": proxy.url})
    requests = len(kube.requests)
    assert listed(plugin(capsys, proxied))
    # The TokenRequest and the proxied listing went through the proxy's tunnel, TLS to the API server inside it.
    assert len(kube.requests) == requests + 2
    assert proxy.tunnels and set(proxy.tunnels) == {kube.url.removeprefix("https://")}


def test_a_proxy_url_that_cannot_be_reached_is_named(kube: FakeKube, ca: trustme.CA, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, ca, **{"proxy-url": "http://127.0.0.1:1"})
    assert one_line(plugin(capsys, kubeconfig), 1) == (
        f"gpusharing: cannot reach the API server {kube.url} (context fake) through its proxy-url http://127.0.0.1:1: "
        "connection refused by 127.0.0.1:1: is the server running there? (check the proxy-url of the context's cluster)"
    )
    assert kube.requests == []


def exec_plugin(
    tmp_path: Path, lifetime: dt.timedelta, token: str | None = None, fails: bool = False
) -> dict[str, Any]:
    """The user of a kubeconfig whose exec plugin (a script) issues `token`, else a new token each run (`exec-1`,
    `exec-2`, ...), valid for `lifetime`; or, `fails`, says it cannot log in and exits 1 as a plugin does."""
    count = tmp_path / "issued"
    script = tmp_path / "credential-plugin"
    script.write_text(f"""#!{sys.executable}
import datetime, json, pathlib, sys
if {fails!r}:
    sys.exit("no login for this cluster: run the provider's login first")
count = pathlib.Path({str(count)!r})
issued = int(count.read_text()) + 1 if count.exists() else 1
count.write_text(str(issued))
expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds={lifetime.total_seconds()})
print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {{"token": {token!r} or f"exec-{{issued}}",
                              "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}}}}))
""")
    script.chmod(0o755)
    return {
        "exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(script), "interactiveMode": "Never"}
    }


def test_an_exec_plugins_token_is_what_the_api_server_sees(kube: FakeKube, ca: trustme.CA, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    kube.accepted_tokens.update(f"exec-{n}" for n in range(1, 10))
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", kube.url, ca, user=exec_plugin(tmp_path, dt.timedelta(hours=1))
    )
    assert listed(plugin(capsys, kubeconfig))
    assert kube.authorizations == ["Bearer exec-1", "Bearer exec-1"]  # TokenRequest, then the proxied listing


def test_an_exec_plugins_expiring_token_is_fetched_again(kube: FakeKube, ca: trustme.CA, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A token that expires within the client's safety margin (5 minutes) is fetched again before each request."""
    kube.accepted_tokens.update(f"exec-{n}" for n in range(1, 10))
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", kube.url, ca, user=exec_plugin(tmp_path, dt.timedelta(minutes=1))
    )
    assert listed(plugin(capsys, kubeconfig))
    sent = kube.authorizations
    assert len(sent) == 2 and len(set(sent)) == 2 and all(token.startswith("Bearer exec-") for token in sent)


def test_an_exec_plugin_that_cannot_log_in_is_said_with_the_refusal(kube: FakeKube, ca: trustme.CA, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", kube.url, ca, user=exec_plugin(tmp_path, dt.timedelta(hours=1), fails=True)
    )
    line = one_line(plugin(capsys, kubeconfig), 1)
    assert line.startswith(
        f"gpusharing: the API server {kube.url} refused the credentials of context fake (401 Unauthorized): "
        "exec: process returned 1. no login for this cluster: run the provider's login first: "
    )


def test_refused_credentials_say_to_log_in_again(kube: FakeKube, ca: trustme.CA, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, ca, user={"token": "expired"})
    assert one_line(plugin(capsys, kubeconfig), 1) == (
        f"gpusharing: the API server {kube.url} refused the credentials of context fake (401 Unauthorized): log in "
        "again (renew the user's token, certificate or exec plugin's login in the kubeconfig), or give another "
        "--context"
    )


def test_tls_server_name_is_the_name_the_certificate_is_checked_against(
    named_kube: FakeKube, ca: trustme.CA, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unnamed = write_kubeconfig(tmp_path / "unnamed", named_kube.url, ca)
    line = one_line(plugin(capsys, unnamed), 1)
    assert line.startswith(
        f"gpusharing: cannot reach the API server {named_kube.url} (context fake): the TLS certificate of 127.0.0.1:"
    )
    assert line.endswith(
        " (check the certificate-authority, tls-server-name or insecure-skip-tls-verify of the context's cluster)"
    )
    named = write_kubeconfig(tmp_path / "named", named_kube.url, ca, **{"tls-server-name": APISERVER_NAME})
    assert listed(plugin(capsys, named))


def test_insecure_skip_tls_verify_takes_any_certificate(
    kube: FakeKube, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    untrusted = write_kubeconfig(tmp_path / "untrusted", kube.url)  # no certificate authority: the system's
    assert "is not trusted" in one_line(plugin(capsys, untrusted), 1)
    insecure = write_kubeconfig(tmp_path / "insecure", kube.url, **{"insecure-skip-tls-verify": True})
    assert listed(plugin(capsys, insecure))  # and no warning from urllib3: the kubeconfig asked for it


def test_the_context_given_is_the_one_used(
    kube: FakeKube, ca: trustme.CA, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, ca)
    kube.accepted_tokens.add("other-user")
    assert listed(plugin(capsys, kubeconfig, "--context", "other"))
    assert kube.authorizations == ["Bearer other-user"] * 2
    assert one_line(plugin(capsys, kubeconfig, "--context", "prod"), 2) == (
        f"gpusharing: the kubeconfig {kubeconfig} has no context 'prod': give --context one of: fake, other")


def test_kubeconfig_is_read_from_the_environment_and_may_be_a_list(
    kube: FakeKube, ca: trustme.CA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, ca)
    # kubectl merges them, skipping the absent
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}{os.pathsep}{kubeconfig}")
    code = main(["budget", "ls", "-o", "json"], prog="kubectl gpusharing", plugin=True)
    assert listed((code, *capsys.readouterr()))


def test_an_unreachable_api_server_is_one_line(
    ca: trustme.CA, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:1", ca)
    assert one_line(plugin(capsys, kubeconfig), 1) == (
        "gpusharing: cannot reach the API server https://127.0.0.1:1 (context fake): connection refused by "
        "127.0.0.1:1: is "
        "the server running there? (check the server of the context's cluster)"
    )


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "gpusharing: no kubeconfig at {path}: give one with --kubeconfig or KUBECONFIG (the file kubectl uses)"),
        (
            "clusters: [\n  - {name: x\n",
            "gpusharing: the kubeconfig {path} is not valid YAML: expected the node content, but "
            "found '-' at line 2, column 3",
        ),
        (
            "just a sentence\n",
            "gpusharing: the kubeconfig {path} is not a kubeconfig: it must be a YAML mapping of clusters, "
            "users and contexts, as `kubectl config view` shows",
        ),
        (
            "- a\n- list\n",
            "gpusharing: the kubeconfig {path} is not a kubeconfig: it must be a YAML mapping of clusters, "
            "users and contexts, as `kubectl config view` shows",
        ),
        ("", "gpusharing: cannot use the kubeconfig {path}: Invalid kube-config. {path} file is empty"),
        (
            "apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncontexts: []\n",
            "gpusharing: cannot use the kubeconfig {path}: Invalid kube-config file. Expected key current-context in "
            "{path}",
        ),
        ("directory", "gpusharing: cannot read the kubeconfig {path}: Is a directory"),
    ],
)
def test_a_kubeconfig_that_cannot_be_used_is_one_line_with_status_2(
    content: str | None, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "kubeconfig"
    if content == "directory":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    assert one_line(plugin(capsys, path), 2) == said.replace("{path}", str(path))
