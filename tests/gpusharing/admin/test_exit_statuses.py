"""The exit statuses docs/reference/cli.md documents for `gpusharing budget|pods|explain|usage` and `kubectl
gpusharing`, one test each: 0 done; 1 a server refused or could not be reached; 2 bad arguments or settings,
refused before any request; 3 what was named does not exist; 130 interrupted. Every failure is one line on stderr.

The timekeeper is a stand-in on loopback answering as the real one does for what each case needs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from flask import Flask

from demo.kubeapi import FakeKube
from gpusharing.cli import main
from tests.timekeeper.conftest import served

LISTING = {"items": [], "default": {"state": "in-budget"}}
GPUSHARING = str(Path(sys.executable).parent / "gpusharing")


class StandIn:
    def __init__(self) -> None:
        self.asked = threading.Event()  # a request reached /api/v1/usage, which answers once `release` is set
        self.release = threading.Event()
        self.requests = 0
        app = Flask("stand-in")

        @app.before_request
        def count() -> None:
            self.requests += 1

        app.add_url_rule("/api/v1/budgets", "ls", lambda: LISTING)
        app.add_url_rule("/api/v1/budgets/<name>", "get", lambda name: [name])  # no budget's status: a list
        app.add_url_rule(
            "/api/v1/budgets/<name>",
            "rm",
            lambda name: ({"error": f"{name} has no budget of its own"}, 404),
            methods=["DELETE"],
        )
        app.add_url_rule("/api/v1/budgets/<name>", "set", lambda name: ({"error": "bob may not change budgets"}, 403),
                         methods=["PATCH"])
        app.add_url_rule("/api/v1/pods", "pods", lambda: ("<html>a proxy's error page</html>", 502))

        @app.get("/api/v1/usage")
        def usage() -> dict[str, object]:
            self.asked.set()
            self.release.wait(60)
            return {"fields": [], "items": []}

        self.app = app


@pytest.fixture
def stand_in() -> Iterator[tuple[StandIn, str]]:
    timekeeper = StandIn()
    with served(timekeeper.app) as url:
        yield timekeeper, url
        timekeeper.release.set()


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("TIMEKEEPER_URL", "TIMEKEEPER_TOKEN", "KUBECONFIG"):
        monkeypatch.delenv(variable, raising=False)


def run(capsys: pytest.CaptureFixture[str], *args: str, plugin: bool = False) -> tuple[int, str, str]:
    try:
        code = main(list(args), prog="kubectl gpusharing" if plugin else "gpusharing", plugin=plugin)
    except SystemExit as exited:  # argparse's usage errors
        code = int(exited.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_0_done(stand_in: tuple[StandIn, str], capsys: pytest.CaptureFixture[str]) -> None:
    _, url = stand_in
    code, out, err = run(capsys, "budget", "ls", "--timekeeper", url, "-o", "yaml")
    assert (code, yaml.safe_load(out), err) == (0, LISTING, "")


def test_1_a_server_refused_or_could_not_be_reached(
    stand_in: tuple[StandIn, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = stand_in
    at = ("--timekeeper", url)
    assert run(capsys, "budget", "set", "team-a", "--gpu-minutes", "1", *at) == (
        1, "", "gpusharing: the timekeeper refused (403): bob may not change budgets\n")
    assert run(capsys, "pods", *at) == (
        1,
        "",
        "gpusharing: the timekeeper refused (502): <html>a proxy's error page</html>\n",
    )
    assert run(capsys, "budget", "ls", "--timekeeper", "http://127.0.0.1:1") == (
        1,
        "",
        "gpusharing: cannot reach the timekeeper at http://127.0.0.1:1: connection refused by 127.0.0.1:1: is the "
        "server running there?\n",
    )


def test_1_an_answer_that_is_no_budget_status_is_one_line(
    stand_in: tuple[StandIn, str], capsys: pytest.CaptureFixture[str],
) -> None:
    """Read through the listing's contract (gpusharing.listing), which says what is wrong, rather than a traceback."""
    _, url = stand_in
    assert run(capsys, "budget", "get", "team-a", "--timekeeper", url) == (
        1, "", "gpusharing: the timekeeper's answer is not one this version reads: the budget's status must be a JSON "
        "object\n")


def test_2_bad_arguments_or_settings_are_refused_before_any_request(
    stand_in: tuple[StandIn, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    timekeeper, url = stand_in
    at = ("--timekeeper", url)
    code, out, err = run(capsys, "budget", "set", "team-a", "--gpu-minutes", "nan", *at)  # argparse's
    assert (code, out) == (2, "") and err.splitlines()[-1].endswith(
        "'nan' is not a number of GPU-minutes: give a finite number, 0 or more"
    )
    code, out, err = run(capsys, "budget", "set", "team-a", *at)
    assert (
        (code, out) == (2, "")
        and err.startswith("gpusharing: nothing to set: give --gpu-minutes N")
        and err.count("\n") == 1
    )
    code, out, err = run(capsys, "usage", "--from", "2026-11-02", "--to", "2026-11-01", *at)
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert run(capsys, "budget", "ls", "-o", "csv", *at) == (
        2, "", "gpusharing: -o csv is for reports (gpusharing usage, gpusharing report): use -o json or yaml\n")
    assert timekeeper.requests == 0
    monkeypatch.setenv("TIMEKEEPER_URL", "127.0.0.1:8080")
    code, out, err = run(capsys, "budget", "ls")
    assert (code, out) == (2, "") and err.startswith("gpusharing: TIMEKEEPER_URL=") and err.count("\n") == 1
    monkeypatch.delenv("TIMEKEEPER_URL")
    code, out, err = run(capsys, "budget", "ls", "--kubeconfig", str(tmp_path / "absent"), plugin=True)
    assert (code, out) == (2, "") and err.startswith("gpusharing: no kubeconfig at ") and err.count("\n") == 1
    # As a kubectl plugin too, arguments are refused before the API server is asked for anything (it is down here).
    down = kubeconfig(tmp_path / "down", "http://127.0.0.1:1")
    code, out, err = run(capsys, "budget", "set", "team-a", "--kubeconfig", str(down), plugin=True)
    assert (code, out) == (2, "") and err.startswith("gpusharing: nothing to set: ")


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "user",
        "clusters": [{"name": "cluster", "cluster": {"server": server}}],
        "users": [{"name": "someone", "user": {"token": "kubectl-user"}}],
        "contexts": [{"name": "user", "context": {"cluster": "cluster", "user": "someone", "namespace": "team-a"}}],
    }))
    return path


def test_3_what_was_named_does_not_exist(
    stand_in: tuple[StandIn, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, url = stand_in
    assert run(capsys, "budget", "rm", "nobody", "--timekeeper", url) == (
        3, "", "gpusharing: the timekeeper refused (404): nobody has no budget of its own\n")
    kube = FakeKube()
    try:
        assert run(
            capsys,
            "explain",
            "pod/absent",
            "--kubeconfig",
            str(kubeconfig(tmp_path / "up", kube.url)),
            "--timekeeper",
            url,
        ) == (3, "", "gpusharing: pod absent not found in namespace team-a\n")
    finally:
        kube.close()


def test_130_interrupted(stand_in: tuple[StandIn, str]) -> None:
    timekeeper, url = stand_in
    env = {key: value for key, value in os.environ.items() if key not in ("TIMEKEEPER_URL", "TIMEKEEPER_TOKEN")}
    command = subprocess.Popen([GPUSHARING, "usage", "--from", "2026-11-01", "--to", "2026-12-01", "--timekeeper", url],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               # Ctrl-C as a terminal sends it: a suite run in the background (nohup, `&`) ignores
                               # SIGINT, and Python would not raise KeyboardInterrupt in a child that inherits that.
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert timekeeper.asked.wait(60), "the command never asked the timekeeper"
        command.send_signal(signal.SIGINT)  # Ctrl-C while it waits for the answer
        out, err = command.communicate(timeout=60)
    finally:
        command.kill()
    assert (command.returncode, out, err) == (130, "", "")
