"""`gpusharing budget …` and `gpusharing pods` against a timekeeper on loopback: what a new user types, and every way
it can go wrong said in one line."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest
from flask import Flask

from demo.processes import free_port, run_command
from gpusharing.cli import main
from gpusharing.contract import Period
from tests.timekeeper.conftest import ADMIN, METER, READER, AppFactory, served


@pytest.fixture(autouse=True)
def quiet_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timekeeper these tests talk to runs in this process: its info lines would mix with the command's output."""
    monkeypatch.setenv("GPUSHARING_LOG_LEVEL", "warning")
    monkeypatch.delenv("TIMEKEEPER_URL", raising=False)
    monkeypatch.delenv("TIMEKEEPER_TOKEN", raising=False)


@pytest.fixture
def url(app: Flask) -> Iterator[str]:
    with served(app) as base:
        yield base


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as exited:  # argparse's usage errors
        code = int(exited.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def report(app: Flask, namespace: str, gpu_seconds: float, pod: str = "p", **extra: object) -> None:
    answer = app.test_client().post("/api/v1/reports", headers={"Authorization": f"Bearer {METER}"}, json={
        "podUid": f"uid-{namespace}-{pod}", "namespace": namespace, "pod": pod, "gpuShare": 1, "seq": 1,
        "gpuSeconds": gpu_seconds, **extra})
    assert answer.status_code == 200


def test_set_top_up_ls_get_and_rm(url: str, capsys: pytest.CaptureFixture[str], app: Flask) -> None:
    admin = ("--timekeeper", url, "--token", ADMIN)
    assert (
        run(
            capsys,
            "budget",
            "set",
            "team-a",
            "--gpu-minutes",
            "6000",
            "--period",
            "weekly",
            "--evict-on-exhaustion",
            *admin,
        )[0]
        == 0
    )
    assert run(capsys, "budget", "set", "team-b", "--gpu-minutes", "1", *admin)[0] == 0
    assert run(capsys, "budget", "set", "ops", "--unlimited", *admin)[0] == 0
    report(app, "team-b", 90)
    code, out, _ = run(capsys, "budget", "top-up", "team-a", "120", "--reason", "paper deadline", *admin)
    assert code == 0 and "6,120.0" in out
    code, out, _ = run(capsys, "budget", "ls", "--timekeeper", url, "--token", READER)
    assert code == 0
    assert out.splitlines() == [
        "NAMESPACE  BUDGET     USED  REMAINING  STATE        PERIOD   EVICT  PERIOD END",
        "ops        unlimited  0.0   -          unlimited    monthly  no     2028-03-01T00:00:00Z",
        "team-a     6,120.0    0.0   6,120.0    in-budget    weekly   yes    2028-03-06T00:00:00Z",
        "team-b     1.0        1.5   0.0        over-budget  monthly  no     2028-03-01T00:00:00Z",
        "",
        "any other namespace: unlimited monthly (unlimited)",
    ]
    code, out, _ = run(capsys, "budget", "get", "team-b", *admin)
    assert code == 0 and out.splitlines()[1].split()[:7] == [
        "team-b",
        "1.0",
        "1.5",
        "0.0",
        "over-budget",
        "monthly",
        "no",
    ]
    code, out, _ = run(capsys, "budget", "rm", "team-b", *admin)
    assert code == 0 and out.startswith("removed the budget of team-b") and "unlimited" in out


@pytest.mark.parametrize(
    "args",
    [
        ["--timekeeper", "{url}", "--token", ADMIN, "budget", "ls"],
        ["budget", "--timekeeper", "{url}", "--token", ADMIN, "ls"],
        ["budget", "ls", "--timekeeper", "{url}", "--token", ADMIN],
        ["--token", ADMIN, "budget", "ls", "--timekeeper", "{url}"],
    ],
)
def test_the_connection_options_are_taken_before_or_after_the_command(
    url: str, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    code, out, err = run(capsys, *(a.format(url=url) for a in args))
    assert (code, err) == (0, "") and out.startswith("NAMESPACE")


def test_set_changes_only_what_it_names_and_a_new_budget_takes_the_servers_default_period(
    make_app: AppFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    with served(make_app(default_gpu_minutes=600.0, default_period=Period.DAILY)) as url:
        capsys.readouterr()  # what the app said as it started, in this process
        admin = ("--timekeeper", url, "--token", ADMIN)

        def row(*args: str) -> list[str]:
            code, out, err = run(capsys, "budget", "set", "team-a", *args, *admin)
            assert (code, err) == (0, "")
            return out.splitlines()[1].split()[:7]

        assert row("--gpu-minutes", "10") == ["team-a", "10.0", "0.0", "10.0", "in-budget", "daily", "no"]
        assert row("--period", "weekly", "--evict-on-exhaustion") == [
            "team-a",
            "10.0",
            "0.0",
            "10.0",
            "in-budget",
            "weekly",
            "yes",
        ]
        assert row("--gpu-minutes", "20") == ["team-a", "20.0", "0.0", "20.0", "in-budget", "weekly", "yes"]
        assert row("--no-evict-on-exhaustion") == ["team-a", "20.0", "0.0", "20.0", "in-budget", "weekly", "no"]
        assert row("--unlimited") == ["team-a", "unlimited", "0.0", "-", "unlimited", "weekly", "no"]
        code, _, err = run(capsys, "budget", "set", "team-a", *admin)
        assert code == 2
        assert err == (
            "gpusharing: nothing to set: give --gpu-minutes N, --unlimited, --period, --[no-]evict-on-exhaustion, "
            "--parent, --no-parent, --warning-thresholds, --admission or --on-shortfall\n"
        )
        code, out, _ = run(capsys, "budget", "ls", *admin)
        assert out.splitlines()[-1] == "any other namespace: 600.0 daily (in-budget)"


def test_set_takes_safe_admissions_settings_and_wide_and_the_audit_log_show_them(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = ("--timekeeper", url, "--token", ADMIN)

    def wide(*args: str) -> list[str]:
        code, out, err = run(capsys, "budget", "set", "team-a", *args, *admin, "-o", "wide")
        assert (code, err) == (0, "")
        header, row = out.splitlines()
        assert header.split()[-5:] == ["ADMISSION", "ON", "SHORTFALL", "COMMITTED", "UNCOMMITTED"]
        assert row.split()[-2:] == ["-", "-"]  # this timekeeper follows no cluster's pods: commitments unknown
        return row.split()[-4:-2]

    assert wide("--gpu-minutes", "60", "--admission", "safe") == ["safe", "demote"]
    assert wide("--on-shortfall", "refuse") == ["safe", "refuse"]
    assert wide("--admission", "strict", "--on-shortfall", "demote") == ["strict", "demote"]
    assert wide("--admission", "open") == ["open", "demote"]
    code, out, _ = run(capsys, "budget", "get", "team-a", "-o", "json", *admin)
    assert code == 0 and '"admission": "open"' in out and '"onShortfall": "demote"' in out
    code, out, _ = run(capsys, "budget", "changes", "team-a", *admin)
    assert code == 0
    assert [re.split(r"\s{2,}", line)[3:] for line in out.splitlines()[1:]] == [
        ["(default)", "60.0 monthly, safe admission (demote on shortfall)"],
        ["60.0 monthly, safe admission (demote on shortfall)", "60.0 monthly, safe admission (refuse on shortfall)"],
        ["60.0 monthly, safe admission (refuse on shortfall)", "60.0 monthly, strict admission (demote on shortfall)"],
        ["60.0 monthly, strict admission (demote on shortfall)", "60.0 monthly"],
    ]


def test_the_audit_log_and_the_pods_are_reachable(url: str, capsys: pytest.CaptureFixture[str], app: Flask) -> None:
    admin = ("--timekeeper", url, "--token", ADMIN)
    run(capsys, "budget", "set", "team-a", "--gpu-minutes", "60", *admin)
    run(capsys, "budget", "set", "team-a", "--period", "daily", "--evict-on-exhaustion", *admin)
    run(capsys, "budget", "top-up", "team-a", "5", "--reason", "demo day", *admin)
    run(capsys, "budget", "rm", "team-a", *admin)
    code, out, _ = run(capsys, "budget", "changes", "team-a", *admin)
    assert code == 0
    assert [line.split(None, 1)[1] for line in out.splitlines()[1:]] == [
        "set     alice  (default)          60.0 monthly",
        "set     alice  60.0 monthly       60.0 daily, evict",
        "top-up  alice  60.0 daily, evict  +5.0: demo day",
        "remove  alice  60.0 daily, evict  (default)",
    ]
    report(
        app, "team-a", 600, pod="hungry", gpuMemoryUsedMiB=9000, gpuMemoryRequestedMiB=8192, gpuUtilizationPercent=97
    )
    report(app, "team-a", 60, pod="modest", gpuMemoryUsedMiB=1000, gpuMemoryRequestedMiB=8192)
    code, out, _ = run(capsys, "pods", "--over-memory", *admin)
    assert code == 0 and [line.split()[:7] for line in out.splitlines()] == [
        ["POD", "SHARE", "GPU-MINUTES", "MEMORY", "USED", "REQUESTED", "OVER"],
        ["team-a/hungry", "1", "10.0", "9,000", "MiB", "8,192", "MiB"],
    ]
    code, out, _ = run(capsys, "pods", "--namespace", "team-a", *admin)
    assert code == 0 and [line.split()[0] for line in out.splitlines()[1:]] == ["team-a/hungry", "team-a/modest"]


def test_server_refusals_are_sentences_that_say_what_to_do(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "budget", "--timekeeper", url, "--token", READER, "set", "team-a", "--gpu-minutes", "5"
    )
    assert (code, out) == (1, "")
    assert err == (
        "gpusharing: the timekeeper refused (403): static-reader-line-3 may not change budgets: an admin needs verb "
        "'update' on resource 'budgets' in API group 'gpusharing.io'\n"
    )
    code, _, err = run(capsys, "budget", "rm", "nobody", "--timekeeper", url, "--token", ADMIN)
    assert (code, err) == (3, "gpusharing: the timekeeper refused (404): namespace nobody has no budget of its own\n")
    code, _, err = run(capsys, "budget", "ls", "--timekeeper", url)
    assert (code, err) == (
        1,
        "gpusharing: the timekeeper refused (401): a bearer token is required (Authorization: Bearer "
        "TOKEN): give a token with --token or TIMEKEEPER_TOKEN\n",
    )
    code, _, err = run(capsys, "budget", "ls", "--timekeeper", url, "--token", "wrong")
    assert (code, err) == (
        1,
        "gpusharing: the timekeeper refused (401): the bearer token is not known to the timekeeper: the "
        "token given (--token or TIMEKEEPER_TOKEN) was not accepted\n",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["set", "team-a", "--gpu-minutes", "nan"],
            "argument --gpu-minutes: 'nan' is not a number of GPU-minutes: give a finite number, 0 or more",
        ),
        (["set", "team-a", "--gpu-minutes", "-3"], "argument --gpu-minutes: '-3' is not a number of GPU-minutes"),
        (
            ["set", "team-a", "--period", "yearly"],
            "argument --period: invalid choice: 'yearly' (choose from 'daily', 'weekly', 'monthly', 'none')",
        ),
        (
            ["set", "team-a", "--gpu-minutes", "5", "--unlimited"],
            "argument --unlimited: not allowed with argument --gpu-minutes",
        ),
        (
            ["set", "team-a", "--admission", "unsafe"],
            "argument --admission: invalid choice: 'unsafe' (choose from 'open', 'safe', 'strict')",
        ),
        (
            ["set", "team-a", "--on-shortfall", "evict"],
            "argument --on-shortfall: invalid choice: 'evict' (choose from 'demote', 'refuse')",
        ),
        (["set", "Team_A", "--unlimited"], "argument NAME: 'Team_A' is not a namespace name"),
        (["top-up", "team-a", "inf", "--reason", "x"], "argument GPU_MINUTES: 'inf' is not a number of GPU-minutes"),
        (
            ["ls", "--timekeeper", "127.0.0.1:8080"],
            "argument --timekeeper: '127.0.0.1:8080' must be an http:// or https:// URL, e.g. http://127.0.0.1:8080",
        ),
    ],
)
def test_bad_arguments_are_one_usage_line(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = run(capsys, "budget", *args)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1].split(": error: ", 1)[1].startswith(message)
    assert "Period." not in err and "AdmissionMode." not in err and "Shortfall." not in err


def test_an_unreachable_timekeeper_is_told_apart_from_an_unknown_host(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    code, _, err = run(capsys, "budget", "ls", "--timekeeper", f"http://127.0.0.1:{port}")
    assert (code, err) == (
        1,
        f"gpusharing: cannot reach the timekeeper at http://127.0.0.1:{port}: connection refused by "
        f"127.0.0.1:{port}: is the server running there?\n",
    )

    def no_such_name(*args: object, **kwargs: object) -> None:  # no DNS query leaves the machine
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    code, _, err = run(capsys, "budget", "ls", "--timekeeper", "http://timekeeper.example:8080")
    assert (code, err) == (
        1,
        "gpusharing: cannot reach the timekeeper at http://timekeeper.example:8080: the host name "
        "'timekeeper.example' does not resolve: check the URL http://timekeeper.example:8080\n",
    )


def test_url_and_token_come_from_the_environment(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIMEKEEPER_URL", url)
    monkeypatch.setenv("TIMEKEEPER_TOKEN", ADMIN)
    code, out, _ = run(capsys, "budget", "set", "team-a", "--gpu-minutes", "5")
    assert code == 0 and "team-a" in out
    monkeypatch.setenv("TIMEKEEPER_URL", "timekeeper:8080")
    code, _, err = run(capsys, "budget", "ls")
    assert (code, err) == (2, "gpusharing: TIMEKEEPER_URL='timekeeper:8080' must be an http:// or https:// URL, "
                              "e.g. http://timekeeper:8080\n")


def test_the_default_url_refused_says_how_to_reach_a_cluster(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpusharing.admin.client.DEFAULT_URL", f"http://127.0.0.1:{free_port()}")
    code, _, err = run(capsys, "budget", "ls")
    assert code == 1 and err.rstrip().endswith(
        "(give its URL with --timekeeper or TIMEKEEPER_URL; on a cluster, use `kubectl gpusharing`, which reaches it "
        "through the API server, or `kubectl -n gpusharing-system port-forward svc/gpusharing-timekeeper 8080`)")


def test_version_and_help_with_examples() -> None:
    version = run_command("--version")
    assert version.returncode == 0 and version.stdout.startswith("gpusharing 0.")
    for command in ([], ["budget"], ["budget", "set"], ["pods"], ["explain"], ["certs"], ["timekeeper", "serve"],
                    ["db", "upgrade"], ["webhook", "serve"]):
        helped = run_command(*command, "--help")
        assert helped.returncode == 0 and "example" in helped.stdout, command


def test_groups_parents_thresholds_and_the_tree(url: str, capsys: pytest.CaptureFixture[str], app: Flask) -> None:
    admin = ("--timekeeper", url, "--token", ADMIN)
    assert run(capsys, "budget", "set", "org.acme", "--gpu-minutes", "1000", *admin)[0] == 0
    assert run(capsys, "budget", "set", "team.vision", "--gpu-minutes", "100", "--parent", "org.acme", *admin)[0] == 0
    assert run(capsys, "budget", "set", "ml-team", "--gpu-minutes", "10", "--parent", "team.vision",
               "--warning-thresholds", "50,90", *admin)[0] == 0
    assert run(capsys, "budget", "set", "cv-team", "--gpu-minutes", "10", "--parent", "team.vision", *admin)[0] == 0
    assert run(capsys, "budget", "set", "solo", "--gpu-minutes", "10", *admin)[0] == 0
    report(app, "ml-team", 6 * 60)
    code, out, _ = run(capsys, "budget", "tree", *admin)
    assert code == 0
    assert [line.split()[:1] + line.split()[-4:-2] for line in out.splitlines()[1:]] == [
        ["org.acme", "in-budget", "in-budget"],
        ["└─", "in-budget", "in-budget"],  # team.vision: 6 of 100
        ["├─", "in-budget", "in-budget"],  # cv-team
        ["└─", "warning", "warning"],  # ml-team: 60 % of its 10, its 50 % threshold
        ["solo", "in-budget", "in-budget"],
    ]
    assert "\n└─ team.vision" in out and "\n   ├─ cv-team" in out and "\n   └─ ml-team" in out
    code, _, err = run(capsys, "budget", "set", "ml-team", "--warning-thresholds", "90,50", *admin)
    assert code == 2 and "strictly increasing" in err
    code, _, err = run(capsys, "budget", "set", "ml-team", "--parent", "vision", *admin)
    assert code == 2 and "is not a group budget name" in err
    code, _, err = run(capsys, "budget", "rm", "team.vision", *admin)
    assert code == 1 and "team.vision is the parent of cv-team, ml-team: give them another parent first" in err
    assert run(capsys, "budget", "set", "ml-team", "--no-parent", *admin)[0] == 0
    assert run(capsys, "budget", "set", "cv-team", "--no-parent", *admin)[0] == 0
    code, out, _ = run(capsys, "budget", "rm", "team.vision", *admin)
    assert code == 0 and out.strip() == "removed the group budget team.vision"


def test_explain_shows_the_bill_from_the_record_and_a_silent_meter() -> None:
    from gpusharing.admin.explain import format_explanation

    pod = {"namespace": "ml", "name": "train-0", "phase": "Running", "governed": True, "record": {"gpu-share": "0.5"},
           "priorityClassName": "gpusharing-in-budget", "priority": None, "meter": "native sidecar"}
    namespace = {"state": "in-budget", "gpuMinutes": None, "usedGpuMinutes": 3.0, "period": "monthly"}
    ledger = {
        "gpuSeconds": 180.0,
        "observedGpuSeconds": 180.0,
        "meteredGpuSeconds": 0.0,
        "startedAt": "2026-11-25T10:00:00Z",
        "endedAt": None,
        "lastReportAt": None,
        "final": False,
        "meterSilentSince": "2026-11-25T10:01:00Z",
    }
    fields = dict(
        line.split(":", 1)
        for line in format_explanation({"pod": pod, "namespace": namespace, "metering": ledger}).splitlines()
    )
    assert fields["Billed"].strip() == "3.0 GPU-minutes, from the API server's record since 2026-11-25T10:00:00Z"
    assert (
        fields["Metered"].strip().startswith("no report yet; SILENT since 2026-11-25T10:01:00Z: billed from the record")
    )


def test_explain_shows_the_model_and_share_as_admitted_and_as_billed_and_why_they_differ() -> None:
    from gpusharing.admin.explain import format_explanation

    pod = {"namespace": "ml", "name": "infer", "phase": "Running", "governed": True, "node": "t4-1",
           "record": {"gpu-share": "0.0625", "gpu-model": "NVIDIA A100-SXM4-80GB"},
           "priorityClassName": "gpusharing-in-budget", "priority": None, "meter": "native sidecar"}
    namespace = {"state": "in-budget", "gpuMinutes": None, "usedGpuMinutes": 3.0, "period": "monthly"}
    ledger = {"gpuSeconds": 20.0, "observedGpuSeconds": 20.0, "meteredGpuSeconds": 0.0, "gpuShare": 1 / 3,
              "gpuModel": "Tesla T4", "meterGpuModel": "NVIDIA H200", "startedAt": "2026-11-25T10:00:00Z"}

    def model_line(metering: dict[str, object] | None) -> str:
        explained = format_explanation({"pod": pod, "namespace": namespace, "metering": metering})
        return dict(line.split(":", 1) for line in explained.splitlines())["GPU model"].strip()

    assert model_line(ledger) == (
        "billed on Tesla T4 (share 0.333333), the GPUs of node t4-1; admitted on NVIDIA A100-SXM4-80GB (share "
        "0.0625), the model it names or else the catalogue's default: a pod is billed for the GPU it got, never below "
        "what was admitted; its meter names NVIDIA H200, evidence only "
        "(gpusharing_timekeeper_meter_model_disagreements)")
    same = {**ledger, "gpuShare": 0.0625, "gpuModel": "NVIDIA A100-SXM4-80GB", "meterGpuModel": None}
    assert model_line(same) == "billed on NVIDIA A100-SXM4-80GB (share 0.0625), the GPUs of node t4-1, as admitted"
    assert model_line(None).startswith("admitted on NVIDIA A100-SXM4-80GB (share 0.0625)")
