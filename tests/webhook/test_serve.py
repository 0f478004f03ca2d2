"""The webhook as it runs: gunicorn, several gthread workers, real TLS from a test CA, keep-alive."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
import trustme
import yaml

from demo.apiserver import admission_review, api_server_pod, example_pod
from demo.processes import Service, child_pids, free_port
from gpusharing.serving.certs import write_client_auth
from tests.webhook.conftest import FakeTimekeeper


def make_tls(directory: Path) -> dict[str, str]:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost", "gpusharing-webhook.gpusharing-system.svc")
    paths = {"ca": directory / "ca.pem", "cert": directory / "tls.crt", "key": directory / "tls.key"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    return {k: str(v) for k, v in paths.items()}


@pytest.fixture
def tls(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return make_tls(tmp_path_factory.mktemp("tls"))


@contextmanager
def serving(tls: dict[str, str], timekeeper: FakeTimekeeper) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`gpusharing webhook serve` with two workers: its URL and its process (the gunicorn master), which must exit 0
    when told to stop."""
    timekeeper.set_states(greedy="over-budget")
    port = free_port()
    env = {**os.environ, "GPUSHARING_TIMEKEEPER_URL": timekeeper.url, "GPUSHARING_BUDGET_REFRESH_SECONDS": "0.2"}
    process = subprocess.Popen(
        [sys.executable, "-m", "gpusharing.cli", "webhook", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--cert", tls["cert"], "--key", tls["key"], "--workers", "2"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    url = f"https://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            requests.get(f"{url}/readyz", verify=tls["ca"], timeout=1).raise_for_status()
            if len(child_pids(process.pid)) == 2:  # both workers booted: the tests count them
                break
        except requests.RequestException:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"webhook did not start: {process.communicate()[1]}")
        time.sleep(0.1)
    yield url, process
    process.terminate()
    assert process.wait(timeout=30) == 0


@pytest.fixture
def webhook_process(tls: dict[str, str], timekeeper: FakeTimekeeper) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    with serving(tls, timekeeper) as served:
        yield served


@pytest.fixture
def webhook(webhook_process: tuple[str, subprocess.Popen[str]]) -> str:
    return webhook_process[0]


def test_reviews_over_tls_with_keep_alive_and_metrics_merged_across_workers(webhook: str, tls: dict[str, str]) -> None:
    session = requests.Session()
    session.trust_env = False  # else REQUESTS_CA_BUNDLE from the environment overrides session.verify
    session.verify = tls["ca"]
    for _ in range(40):
        answer = session.post(f"{webhook}/mutate", json=admission_review(example_pod("vcuda-fraction.yaml")), timeout=5)
        assert answer.status_code == 200 and answer.json()["response"]["allowed"]
        assert answer.raw.version == 11 and answer.headers.get("Connection", "").lower() != "close"

    # Several scrapes: whichever worker answers, it reports all workers' admissions.
    for _ in range(4):
        text = session.get(f"{webhook}/metrics", timeout=5).text
        counted = re.search(
            r'gpusharing_webhook_admissions_total\{decision="allowed",dialect="gpu-manager",endpoint="mutate",'
            r'operation="CREATE"\} (\S+)',
            text,
        )
        assert counted and float(counted.group(1)) == 40


def test_budget_states_reach_every_worker_and_bad_bodies_get_400(webhook: str, tls: dict[str, str]) -> None:
    deadline = time.monotonic() + 20
    demoted = 0
    while demoted < 10:  # ten demotions in a row: both workers have polled the timekeeper
        answer = requests.post(
            f"{webhook}/mutate",
            json=admission_review(example_pod("kai-fraction.yaml", "greedy")),
            verify=tls["ca"],
            timeout=5,
        )
        demoted = demoted + 1 if answer.json()["response"].get("warnings") else 0
        assert time.monotonic() < deadline, "over-budget state never reached the workers"

    bad = requests.post(f"{webhook}/validate", data=b"\x00garbage", verify=tls["ca"], timeout=5)
    assert bad.status_code == 400 and "not an AdmissionReview" in bad.json()["error"]


def test_plain_http_is_not_served(webhook: str) -> None:
    with pytest.raises(requests.ConnectionError):
        requests.get(webhook.replace("https", "http") + "/livez", timeout=2)


def test_serve_refuses_to_start_without_tls(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpusharing.cli", "webhook", "serve", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUSHARING_TLS")},
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "gpusharing: the webhook serves TLS only: give --cert and --key (or GPUSHARING_TLS_CERT, GPUSHARING_TLS_KEY)"
    )


def test_serve_names_a_malformed_setting(tls: dict[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpusharing.cli", "webhook", "serve", "--cert", tls["cert"], "--key", tls["key"]],
        capture_output=True, text=True, timeout=30, env={**os.environ, "GPUSHARING_SIDECAR_MODE": "sideways"},
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "gpusharing: GPUSHARING_SIDECAR_MODE='sideways' must be one of native, container"


def test_a_renewed_certificate_is_served_without_a_restart(webhook: str, tls: dict[str, str], tmp_path: Path) -> None:
    renewed_ca = trustme.CA()
    renewed = renewed_ca.issue_cert("127.0.0.1")
    renewed_ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    # As the kubelet updates a mounted Secret: new files swapped in by rename.
    for source, target in ((renewed.cert_chain_pems[0], tls["cert"]), (renewed.private_key_pem, tls["key"])):
        source.write_to_path(target + ".new")
        os.replace(target + ".new", target)
    deadline = time.monotonic() + 10
    while True:
        try:
            answer = requests.get(f"{webhook}/livez", verify=str(tmp_path / "ca.pem"), timeout=2)
            break
        except requests.exceptions.SSLError:
            assert time.monotonic() < deadline, "the renewed certificate was never served"
            time.sleep(0.1)
    assert answer.status_code == 200
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{webhook}/livez", verify=tls["ca"], timeout=2)


def test_a_denied_pod_leaves_an_info_line_with_its_request_id(
    tls: dict[str, str], timekeeper: FakeTimekeeper, tmp_path: Path
) -> None:
    timekeeper.set_states(greedy="over-budget")
    port = free_port()
    log = tmp_path / "webhook.log"
    env = {
        "GPUSHARING_LOG_FORMAT": "json",
        "GPUSHARING_TIMEKEEPER_URL": timekeeper.url,
        "GPUSHARING_BUDGET_REFRESH_SECONDS": "0.2",
    }
    args = [
        "webhook",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--cert",
        tls["cert"],
        "--key",
        tls["key"],
        "--workers",
        "2",
    ]
    invalid = example_pod("vcuda-fraction.yaml")
    invalid["spec"]["containers"][0]["resources"]["limits"]["tencent.com/vcuda-core"] = "150"
    denied = admission_review(invalid)
    with Service("webhook", args, f"https://127.0.0.1:{port}/readyz", env=env, verify=tls["ca"], log_path=log):
        answer = requests.post(f"https://127.0.0.1:{port}/mutate", json=denied, verify=tls["ca"], timeout=5).json()
        assert answer["response"]["allowed"] is False

        def demotes() -> bool:
            review = admission_review(example_pod("kai-fraction.yaml", "greedy"))
            response = requests.post(
                f"https://127.0.0.1:{port}/mutate", json=review, verify=tls["ca"], timeout=5
            ).json()
            return bool(response["response"].get("warnings"))

        deadline = time.monotonic() + 20
        while not demotes():
            assert time.monotonic() < deadline, "the over-budget state never reached a worker"
            time.sleep(0.1)

    entries = [json.loads(line) for line in log.read_text().splitlines()]  # every line is JSON, gunicorn's too
    request = denied["request"]
    [line] = [e for e in entries if e.get("request_id") == request["uid"]]
    assert line["level"] == "info" and line["logger"] == "webhook.api.reviews"
    assert (line["decision"], line["namespace"], line["pod"], line["operation"]) == (
        "denied",
        "ml-team",
        invalid["metadata"]["name"],
        "CREATE",
    )
    assert "vcuda-core" in line["message"]
    assert any(
        e.get("decision") == "allowed" and e.get("namespace") == "greedy" and "demoted" in e["message"] for e in entries
    )
    # gunicorn's own lines take the same form, and the line came from one of the workers it booted.
    booted = {
        e["pid"] for e in entries if e["logger"] == "gunicorn.error" and e["message"].startswith("Booting worker")
    }
    assert len(booted) == 2 and line["pid"] in booted


def test_with_a_client_ca_only_the_api_servers_certificate_is_answered(tls: dict[str, str], tmp_path: Path) -> None:
    """The API server presents the client certificate of its AdmissionConfiguration's kubeconfig (as `gpusharing
    certs --format client-auth` writes it); a pod that reaches the webhook has none, or one of another CA, which TLS
    refuses."""
    generated = write_client_auth("gpusharing-system", tmp_path / "client-auth")
    (user,) = yaml.safe_load((generated / "apiserver" / "webhook-kubeconfig.yaml").read_text())["users"]
    api_server, stranger = tmp_path / "apiserver.pem", tmp_path / "stranger.pem"
    api_server.write_bytes(
        base64.b64decode(user["user"]["client-key-data"]) + base64.b64decode(user["user"]["client-certificate-data"])
    )
    trustme.CA().issue_cert("kube-apiserver").private_key_and_cert_chain_pem.write_to_path(str(stranger))
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    args = [
        "webhook",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--cert",
        tls["cert"],
        "--key",
        tls["key"],
        "--workers",
        "1",
    ]
    review = admission_review(example_pod("vcuda-fraction.yaml"))
    with Service(
        "webhook", args, f"{url}/readyz", env={"GPUSHARING_CLIENT_CA_FILE": str(generated / "ca.crt")}, verify=tls["ca"]
    ):
        answer = requests.post(f"{url}/mutate", json=review, verify=tls["ca"], cert=str(api_server), timeout=5)
        assert answer.status_code == 200 and answer.json()["response"]["allowed"]
        anyone = requests.post(f"{url}/mutate", json=review, verify=tls["ca"], timeout=5)
        assert anyone.status_code == 401
        assert anyone.json() == {
            "error": "the GPU-sharing webhook answers only the API server: "
            "present a client certificate of the API server"
        }
        with pytest.raises(requests.exceptions.SSLError):
            requests.post(f"{url}/mutate", json=review, verify=tls["ca"], cert=str(stranger), timeout=5)
        assert requests.get(f"{url}/livez", verify=tls["ca"], timeout=5).status_code == 200  # the kubelet's probes


def test_a_missing_client_ca_stops_the_webhook_at_start(tls: dict[str, str], tmp_path: Path) -> None:
    env = {**os.environ, "GPUSHARING_CLIENT_CA_FILE": str(tmp_path / "missing.crt")}
    done = subprocess.run(
        [sys.executable, "-m", "gpusharing.cli", "webhook", "serve", "--cert", tls["cert"], "--key", tls["key"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        done.returncode == 2
        and done.stderr == f"gpusharing: GPUSHARING_CLIENT_CA_FILE={tmp_path / 'missing.crt'}: no such file\n"
    )


def hostile_review(where: str, key: str, value: object) -> dict[str, Any]:
    pod = api_server_pod(
        {
            "metadata": {"name": "p", "annotations": {key: value} if where == "annotation" else {}},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "cuda",
                        "resources": {"limits": {key: value}} if where == "limits" else {},
                    }
                ]
            },
        }
    )
    return admission_review(pod)


PATHOLOGICAL = {
    "gpu-memory 1e999999": (json.dumps(hostile_review("annotation", "gpu-memory", "1e999999")).encode(), 200),
    "gpu-memory 1e300000": (json.dumps(hostile_review("annotation", "gpu-memory", "1e300000")).encode(), 200),
    "gpu-fraction 1e-999999999": (
        json.dumps(hostile_review("annotation", "gpu-fraction", "1e-999999999")).encode(),
        200,
    ),
    "nvidia.com/gpu 1e28": (json.dumps(hostile_review("limits", "nvidia.com/gpu", "1e28")).encode(), 200),
    "a 5,000-digit gpu-mem": (json.dumps(hostile_review("limits", "aliyun.com/gpu-mem", "9" * 5000)).encode(), 200),
    "100,000 [": (b"[" * 100_000, 400),
    "100,000 deep": (b"[" * 100_000 + b"]" * 100_000, 400),
    "metadata a string, denied": (
        json.dumps(hostile_review("limits", "nvidia.com/gpu", "x"))
        .replace(
            '"metadata": {"name": "p", "annotations": {}, "namespace": "ml-team", "creationTimestamp": null}',
            '"metadata": "p"',
        )
        .encode(),
        200,
    ),
    "a 400-digit integer": (
        b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "n": ' + b"9" * 400 + b"}",
        400,
    ),
}


@pytest.fixture(scope="module")
def pathological_webhook(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, subprocess.Popen[str], dict[str, str]]]:
    """One webhook for every pathological review: each test counts the workers before and after its own (a worker
    that dies is restarted by gunicorn under another pid, which that test sees), and the server must still exit 0."""
    tls, timekeeper = make_tls(tmp_path_factory.mktemp("tls")), FakeTimekeeper()
    try:
        with serving(tls, timekeeper) as (url, process):
            yield url, process, tls
    finally:
        timekeeper.server.shutdown()
        timekeeper.server.server_close()


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_a_pathological_review_is_answered_within_a_second_and_no_worker_dies(
    pathological_webhook: tuple[str, subprocess.Popen[str], dict[str, str]], name: str
) -> None:
    url, process, tls = pathological_webhook
    workers = child_pids(process.pid)
    session = requests.Session()
    session.trust_env = False
    session.verify = tls["ca"]
    body, status = PATHOLOGICAL[name]
    for endpoint in ("/mutate", "/validate"):
        started = time.perf_counter()
        answer = session.post(f"{url}{endpoint}", data=body, headers={"Content-Type": "application/json"}, timeout=30)
        elapsed = time.perf_counter() - started
        assert answer.status_code == status, answer.text
        if status == 200:
            assert answer.json()["response"]["allowed"] is False and answer.json()["response"]["status"]["code"] == 422
        else:
            assert answer.json()["error"].startswith("not an AdmissionReview: ")
        assert elapsed < 1.0, f"{name} took {elapsed:.2f} s"  # the issue's guard for one pathological input
    assert child_pids(process.pid) == workers  # no worker killed by gunicorn's timeout, none restarted
