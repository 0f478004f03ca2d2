"""`kubectl gpusharing`: the same commands, the timekeeper found through the kubeconfig's context (the API server's
service proxy, here a loopback fake that drops the Authorization header as the real one does), a token for the
timekeeper made with TokenRequest, kubectl's output flags and exit statuses, and `explain pod/NAME`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from flask import Flask

from demo.kubeapi import FakeKube
from gpusharing.cli import main
from tests.kustomize import KUBECTL
from tests.timekeeper.conftest import ADMIN, METER, READER, served

SERVICE = ("gpusharing-system", "http:gpusharing-timekeeper:8080")
BUDGET_ADMIN = ("gpusharing-system", "gpusharing-budget-admin")


@pytest.fixture
def cluster(app: Flask, fake_kube: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKube]:
    """A fake cluster whose service proxy leads to the timekeeper, and a kubeconfig of its user in KUBECONFIG."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(fake_kube.user_kubeconfig(namespace="team-a")))
    for variable in ("TIMEKEEPER_URL", "TIMEKEEPER_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("GPUSHARING_LOG_LEVEL", "warning")
    fake_kube.service_account_tokens[BUDGET_ADMIN] = ADMIN
    with served(app) as url:
        fake_kube.services[SERVICE] = url
        yield fake_kube


def plugin(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args), prog="kubectl gpusharing", plugin=True)
    except SystemExit as exited:  # argparse's usage errors
        code = int(exited.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def report(app: Flask, namespace: str, pod: str, uid: str, gpu_seconds: float) -> None:
    answer = app.test_client().post("/api/v1/reports", headers={"Authorization": f"Bearer {METER}"}, json={
        "podUid": uid, "namespace": namespace, "pod": pod, "gpuShare": 0.5, "seq": 1, "gpuSeconds": gpu_seconds})
    assert answer.status_code == 200


def test_through_the_service_proxy_with_a_token_of_the_budget_admin_service_account(
    cluster: FakeKube, capsys: pytest.CaptureFixture[str], app: Flask
) -> None:
    code, out, err = plugin(capsys, "budget", "set", "team-a", "--gpu-minutes", "60")
    assert (code, err) == (0, "") and out.splitlines()[1].split()[:2] == ["team-a", "60.0"]
    # The timekeeper got the minted token in its own header; the caller's credentials stayed with the API server.
    (minted,) = cluster.token_requests
    assert (minted["namespace"], minted["name"], minted["audiences"]) == (*BUDGET_ADMIN, ["gpusharing-timekeeper"])
    assert minted["expirationSeconds"] <= 3600
    assert cluster.proxied and all(h == {**h, "X-Timekeeper-Authorization": f"Bearer {ADMIN}"} for h in cluster.proxied)
    assert all("Authorization" not in headers for headers in cluster.proxied)
    changes = (
        app.test_client().get("/api/v1/budgets/team-a/changes", headers={"Authorization": f"Bearer {READER}"}).json
    )
    assert changes["items"][0]["actor"] == "alice"  # the admin token's name, recorded as who set it


def test_output_formats_and_namespaces(cluster: FakeKube, capsys: pytest.CaptureFixture[str]) -> None:
    for namespace, minutes in (("team-a", "60"), ("team-b", "30")):
        assert plugin(capsys, "budget", "set", namespace, "--gpu-minutes", minutes)[0] == 0
    code, out, _ = plugin(capsys, "budget", "ls", "-o", "json")
    listing = json.loads(out)
    assert (
        code == 0 and [item["namespace"] for item in listing["items"]] == ["team-a", "team-b"] and "default" in listing
    )
    code, out, _ = plugin(capsys, "-n", "team-b", "budget", "ls", "-o", "yaml")
    assert code == 0 and [item["namespace"] for item in yaml.safe_load(out)["items"]] == ["team-b"]
    code, out, _ = plugin(capsys, "budget", "ls", "-n", "team-b", "-A")  # -A wins, as with kubectl
    assert code == 0 and [line.split()[0] for line in out.splitlines()[1:3]] == ["team-a", "team-b"]
    code, out, _ = plugin(capsys, "budget", "get", "team-a", "-o", "wide")
    header, row = out.splitlines()
    assert code == 0 and header.endswith("TOP-UPS  ADMISSION  ON SHORTFALL  COMMITTED  UNCOMMITTED")
    assert row.split()[-4:] == ["open", "demote", "-", "-"]
    code, out, _ = plugin(capsys, "pods", "-o", "wide", "-n", "team-a")
    assert code == 0 and out.split()[-6:] == ["UID", "REPORTS", "FIRST", "REPORT", "IDLE", "SINCE"]


def test_exit_statuses_and_one_line_errors(cluster: FakeKube, capsys: pytest.CaptureFixture[str]) -> None:
    assert plugin(capsys, "budget", "rm", "nobody")[:2] == (3, "")  # what was named does not exist
    code, out, err = plugin(capsys, "budget", "ls", "-o", "xml")
    assert (code, out) == (2, "") and "argument -o/--output: invalid choice: 'xml'" in err
    cluster.services.clear()
    code, out, err = plugin(capsys, "budget", "ls")
    assert (code, out) == (1, "")
    assert err == ('gpusharing: the API server did not reach the timekeeper (503): no endpoints available for service '
                   '"http:gpusharing-timekeeper:8080": is kube-gpusharing installed in namespace gpusharing-system '
                   "(--system-namespace) and its timekeeper running?\n")


def test_without_a_token_of_the_budget_admin_it_says_how_to_give_one(
    cluster: FakeKube, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.service_account_tokens.clear()
    code, _, err = plugin(capsys, "budget", "ls")
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("gpusharing: the timekeeper refused (401): ")
    assert err.rstrip().endswith(
        "give a token with --token or TIMEKEEPER_TOKEN (no token of ServiceAccount "
        "gpusharing-system/gpusharing-budget-admin "
        '(403: serviceaccounts "gpusharing-budget-admin" is forbidden: User "someone" cannot create resource '
        '"serviceaccounts/token"))'
    )
    assert plugin(capsys, "budget", "ls", "--token", READER)[0] == 0
    cluster.caller_token = "revoked"  # the API server no longer takes the kubeconfig's credentials
    code, _, err = plugin(capsys, "budget", "ls", "--token", READER)
    assert code == 1 and err.startswith(f"gpusharing: the API server {cluster.url} refused the credentials of context "
                                        "fake-user (401 Unauthorized): log in again") and err.count("\n") == 1


def test_a_url_is_used_as_given_and_a_missing_kubeconfig_is_one_line(
    cluster: FakeKube, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = cluster.services.pop(SERVICE)
    assert plugin(capsys, "budget", "ls", "--timekeeper", url)[0] == 0
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    code, out, err = plugin(capsys, "budget", "ls")
    assert (code, out) == (2, "") and err.startswith("gpusharing: no kubeconfig at ") and err.count("\n") == 1
    code, _, err = plugin(capsys, "budget", "ls", "--kubeconfig", os.environ["KUBECONFIG"] + "-too", "--context", "x")
    assert code == 2 and err.count("\n") == 1


def test_explain_says_why_a_pod_got_its_share_class_and_state(
    cluster: FakeKube, capsys: pytest.CaptureFixture[str], app: Flask
) -> None:
    assert plugin(capsys, "budget", "set", "team-a", "--gpu-minutes", "1")[0] == 0
    pod = cluster.add_pod("team-a", "train-0", share="0.5", priority_class="gpusharing-over-budget", memory_mib="40960")
    pod["metadata"]["annotations"].update(
        {"gpusharing.io/dialect": "hami", "gpusharing.io/budget-state": "over-budget"}
    )
    pod["spec"]["priority"] = -1000
    pod["spec"]["initContainers"] = [{"name": "gpusharing-meter", "image": "gpusharing", "restartPolicy": "Always"}]
    report(app, "team-a", "train-0", pod["metadata"]["uid"], 150)

    code, out, err = plugin(capsys, "explain", "pod/train-0")  # the context's namespace
    assert (code, err) == (0, "")
    fields = dict(line.split(":", 1) for line in out.splitlines())
    assert fields["Pod"].strip() == "team-a/train-0 (Running)"
    assert fields["Dialect"].strip() == "hami" and fields["GPU share"].strip().startswith("0.5 of a GPU")
    assert fields["Admitted"].strip().startswith("over-budget: its namespace was over budget: demoted")
    assert fields["Priority class"].strip() == "gpusharing-over-budget (priority -1000)"
    assert fields["Meter"].strip() == "native sidecar"
    assert fields["Namespace now"].strip().startswith("over-budget: 2.5 of 1.0 GPU-minutes used this monthly period")
    assert fields["Metered"].strip().startswith("2.5 GPU-minutes, last report ")
    # Off a cluster's record (this fake has no watch), the meter's report is all the bill there is.
    assert fields["Billed"].strip().startswith("2.5 GPU-minutes, from the API server's record; the meter reported more")

    code, out, _ = plugin(capsys, "explain", "train-0", "-n", "team-a", "-o", "json")
    explained = json.loads(out)
    assert (
        code == 0
        and explained["pod"]["record"]["gpu-share"] == "0.5"
        and explained["namespace"]["state"] == "over-budget"
    )
    assert explained["metering"]["podUid"] == pod["metadata"]["uid"]

    # A pod that safe admission demoted: its namespace was in budget, but not with room for its deadline.
    short = cluster.add_pod(
        "team-a", "train-1", share="0.5", priority_class="gpusharing-over-budget", memory_mib="40960"
    )
    short["metadata"]["annotations"].update(
        {"gpusharing.io/budget-state": "in-budget", "gpusharing.io/safe-admission": "demoted"}
    )
    code, out, _ = plugin(capsys, "explain", "pod/train-1")
    fields = dict(line.split(":", 1) for line in out.splitlines())
    assert code == 0 and fields["Safe admission"].strip() == (
        "demoted: what is left uncommitted did not cover the pod to its deadline: demoted to the over-budget class")

    cluster.add_pod("team-a", "web", share=None)
    code, out, _ = plugin(capsys, "explain", "pods/web")
    assert code == 0 and "Governed:" in out and "no gpusharing.io/ record" in out
    assert plugin(capsys, "explain", "pod/absent")[:2] == (3, "")
    code, _, err = plugin(capsys, "explain", "deployment/train")
    assert code == 2 and "'deployment/train' is not a pod: give pod/NAME" in err


def test_kubectl_runs_the_installed_plugin(cluster: FakeKube, tmp_path: Path) -> None:
    """kubectl finds `kubectl-gpusharing` on PATH (the console script `pip install` puts beside the interpreter)."""
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "kubectl-gpusharing").exists()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    listed = subprocess.run([KUBECTL, "plugin", "list"], capture_output=True, text=True, env=env)
    assert str(bin_dir / "kubectl-gpusharing") in listed.stdout
    ran = subprocess.run(
        [KUBECTL, "gpusharing", "budget", "ls", "-o", "json"], capture_output=True, text=True, env=env, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["items"] == []
