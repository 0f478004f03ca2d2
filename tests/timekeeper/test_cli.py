"""`gpusharing budget …` against a timekeeper on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask import Flask

from gpusharing.cli import main
from tests.timekeeper.conftest import ADMIN, METER, READER, served


@pytest.fixture(autouse=True)
def quiet_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timekeeper these tests talk to runs in this process: its info lines would mix with the command's output."""
    monkeypatch.setenv("GPUSHARING_LOG_LEVEL", "warning")


@pytest.fixture
def url(app: Flask) -> Iterator[str]:
    with served(app) as base:
        yield base


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_set_top_up_ls_get_and_rm(url: str, capsys: pytest.CaptureFixture[str], app: Flask) -> None:
    admin = ("budget", "--timekeeper", url, "--token", ADMIN)
    assert run(capsys, *admin, "set", "team-a", "--gpu-minutes", "6000", "--period", "weekly", "--evict-on-exhaustion")[0] == 0
    assert run(capsys, *admin, "set", "team-b", "--gpu-minutes", "1")[0] == 0
    assert run(capsys, *admin, "set", "ops", "--unlimited")[0] == 0
    app.test_client().post("/api/v1/reports", headers={"Authorization": f"Bearer {METER}"}, json={
        "podUid": "u", "namespace": "team-b", "pod": "p", "gpuShare": 1, "seq": 1, "gpuSeconds": 90})
    code, out, _ = run(capsys, *admin, "top-up", "team-a", "120", "--reason", "paper deadline")
    assert code == 0 and "6,120.0" in out
    code, out, _ = run(capsys, "budget", "--timekeeper", url, "--token", READER, "ls")
    assert code == 0
    assert out.splitlines() == [
        "NAMESPACE  BUDGET     USED  REMAINING  STATE        PERIOD END",
        "ops        unlimited  0.0   -          unlimited    2028-03-01T00:00:00Z",
        "team-a     6,120.0    0.0   6,120.0    in-budget    2028-03-06T00:00:00Z",
        "team-b     1.0        1.5   0.0        over-budget  2028-03-01T00:00:00Z",
    ]
    code, out, _ = run(capsys, *admin, "get", "team-b")
    assert code == 0 and out.splitlines()[1].split()[:5] == ["team-b", "1.0", "1.5", "0.0", "over-budget"]
    code, out, _ = run(capsys, *admin, "rm", "team-b")
    assert code == 0 and out.startswith("removed the budget of team-b") and "unlimited" in out


def test_server_errors_are_sentences_not_tracebacks(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "budget", "--timekeeper", url, "--token", READER, "set", "team-a", "--gpu-minutes", "5")
    assert (code, out) == (1, "")
    assert err == (
        "gpusharing: the timekeeper refused (403): static-reader-line-3 may not change budgets: an admin needs verb "
        "'update' on resource 'budgets' in API group 'gpusharing.io'\n"
    )
    code, _, err = run(capsys, "budget", "--timekeeper", url, "--token", ADMIN, "rm", "nobody")
    assert (code, err) == (1, "gpusharing: the timekeeper refused (404): namespace nobody has no budget of its own\n")
    code, _, err = run(capsys, "budget", "--timekeeper", url, "--token", ADMIN, "set", "team-a", "--gpu-minutes", "-3")
    assert code == 1 and "(400): gpuMinutes must be a finite number, at least 0" in err


def test_an_unreachable_timekeeper_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run(capsys, "budget", "--timekeeper", "http://127.0.0.1:9", "ls")
    assert code == 1 and err == "gpusharing: cannot reach the timekeeper at http://127.0.0.1:9: ConnectionError\n"


def test_url_and_token_come_from_the_environment(url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMEKEEPER_URL", url)
    monkeypatch.setenv("TIMEKEEPER_TOKEN", ADMIN)
    code, out, _ = run(capsys, "budget", "set", "team-a", "--gpu-minutes", "5")
    assert code == 0 and "team-a" in out
