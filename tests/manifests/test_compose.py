"""docker-compose.yml: valid, and wired the way the documentation says (the Dockerfile: tests/release)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import compose_spec
import pytest
import requests
import yaml

from demo.kubeapi import SERVICE_ACCOUNT_TOKEN
from demo.processes import free_port
from gpusharing.cli import _ROLES, build_parser
from timekeeper.auth import Role, load_static_tokens

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # resolves the YAML merge keys


def test_compose_file_is_valid_by_the_compose_specification(compose: dict[str, Any]) -> None:
    parsed = compose_spec.PyCompose.from_json(json.dumps(compose))
    parsed.validate()
    assert set(parsed.service_names()) == {
        "postgres",
        "migrate",
        "timekeeper",
        "kube-api",
        "controller",
        "webhook",
        "meter",
    }


def test_services_wait_for_what_they_need(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"
    assert services["timekeeper"]["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
    assert services["controller"]["depends_on"] == {"migrate": {"condition": "service_completed_successfully"},
                                                    "kube-api": {"condition": "service_started"}}
    assert services["migrate"]["command"] == ["db", "upgrade"]


def test_ports_healthchecks_and_volumes(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["timekeeper"]["ports"] == ["127.0.0.1:8080:8080"]
    assert services["webhook"]["ports"] == ["127.0.0.1:8443:8443"]
    assert "https://127.0.0.1:8443/readyz" in " ".join(services["webhook"]["healthcheck"]["test"])
    assert "http://127.0.0.1:8080/readyz" in " ".join(services["timekeeper"]["healthcheck"]["test"])
    named = set(compose["volumes"])
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
            else:
                assert source in named, source
    assert "meter-state:/var/lib/gpusharing-meter" in services["meter"]["volumes"]


def test_the_controller_runs_beside_the_timekeeper_on_its_image_and_database(compose: dict[str, Any]) -> None:
    timekeeper, controller = compose["services"]["timekeeper"], compose["services"]["controller"]
    assert controller["command"] == ["timekeeper", "controller"]
    assert (controller["image"], controller["build"]) == (timekeeper["image"], timekeeper["build"])
    shared = {
        k: v
        for k, v in timekeeper["environment"].items()
        if k.startswith("TIMEKEEPER_") and "AUTH" not in k and "TOKENS" not in k
    }
    assert shared.items() <= controller["environment"].items()
    assert "http://127.0.0.1:8081/livez" in " ".join(controller["healthcheck"]["test"])
    assert "ports" not in controller  # it serves no API


def test_the_controller_works_against_the_stand_in_api_its_kubeconfig_names(compose: dict[str, Any]) -> None:
    services = compose["services"]
    mounted = {volume.split(":")[1]: volume.split(":")[0] for volume in services["controller"]["volumes"]}
    kubeconfig = yaml.safe_load(
        (ROOT / mounted[services["controller"]["environment"]["TIMEKEEPER_KUBECONFIG"]]).read_text()
    )
    (cluster,) = kubeconfig["clusters"]
    assert cluster["cluster"]["server"] == f"http://kube-api:{services['kube-api']['command'][-1]}"
    (user,) = kubeconfig["users"]
    assert user["user"]["token"] == SERVICE_ACCOUNT_TOKEN  # the token the stand-in API accepts
    assert services["kube-api"]["entrypoint"] == ["python", "-m", "demo.kubeapi"]


def test_the_stand_in_api_runs_from_the_repository_beside_the_product_image(compose: dict[str, Any]) -> None:
    """The image holds the product alone (tests/release/test_dockerfile.py): kube-api runs it with the repository's
    demo/, and nothing else of the repository, mounted read-only into its working directory, which `python -m` imports
    from first."""
    services = compose["services"]
    kube_api, timekeeper = services["kube-api"], services["timekeeper"]
    assert (kube_api["image"], kube_api["build"]) == (timekeeper["image"], timekeeper["build"])
    assert kube_api["volumes"] == [f"./demo:{kube_api['working_dir']}/demo:ro"]
    assert (ROOT / "demo" / "kubeapi.py").is_file()


def test_the_stand_in_api_needs_only_demo_beside_the_installed_package(compose: dict[str, Any], tmp_path: Path) -> None:
    """kube-api's command run as the container runs it: from a working directory holding demo/ alone, the rest
    (gpusharing, the Kubernetes client) from the installed package, none of the repository on the path."""
    kube_api = compose["services"]["kube-api"]
    (tmp_path / "demo").symlink_to(ROOT / "demo")
    port = free_port()
    python, *module = kube_api["entrypoint"]
    command = [*module, *kube_api["command"]]
    command[command.index("--host") + 1], command[command.index("--port") + 1] = "127.0.0.1", str(port)
    assert python == "python" and module == ["-m", "demo.kubeapi"]
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    with subprocess.Popen([sys.executable, *command], cwd=tmp_path, env=environment, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == f"stand-in Kubernetes API on http://127.0.0.1:{port}"
            url = f"http://127.0.0.1:{port}/api/v1/namespaces/demo/pods"
            answer = requests.get(url, headers={"Authorization": f"Bearer {SERVICE_ACCOUNT_TOKEN}"}, timeout=10)
            assert (answer.status_code, answer.json()["kind"]) == (200, "PodList")
            assert requests.get(url, timeout=10).status_code == 401
        finally:
            process.terminate()
        assert process.wait(timeout=20) == 0, process.stdout.read() if process.stdout else ""


def test_static_tokens_match_the_token_files(compose: dict[str, Any]) -> None:
    tokens = load_static_tokens(str(ROOT / "compose/static-tokens"))
    callers = {
        role: tokens.caller((ROOT / f"compose/{role}-token").read_text().strip())
        for role in ("meter", "reader", "admin")
    }
    assert {role: caller and caller.role for role, caller in callers.items()} == {r: Role(r) for r in callers}
    meter = compose["services"]["meter"]["environment"]["GPUSHARING_NAMESPACE"]
    # the meter token reports for its namespace only
    assert callers["meter"] is not None and callers["meter"].namespaces == {meter}
    assert compose["services"]["timekeeper"]["environment"]["TIMEKEEPER_AUTH"] == "static"


def documented_commands(text: str) -> list[list[str]]:
    """The concrete `gpusharing …` commands in a text (code blocks, inline code, comments), as argument lists."""
    commands = []
    for match in re.finditer(
        r"(?:^|[`\s(])gpusharing ((?:budget|pods|explain|certs|db|timekeeper|webhook|--)[^`\n]*)", text, re.M
    ):
        line = match.group(1).split(" # ")[0].split(" && ")[0].split(" &")[0].strip().rstrip("`)")
        if any(mark in line for mark in ("[", "…", "|", "COMMAND")):
            continue  # a synopsis, not a command
        args = shlex.split(re.sub(r'"\$\([^)]*\)"|"\$\w+"|\$\w+', "token", line))
        if not any(re.fullmatch(r"[A-Z]+", arg) for arg in args):  # NS, N, URL: a synopsis, not a command
            commands.append(args)
    return commands


DOCUMENTATION = ["README.md", *sorted(str(page.relative_to(ROOT)) for page in (ROOT / "docs").rglob("*.md"))]


def test_the_documentation_shows_commands() -> None:
    """The README and docs/ together show the commands, so that the test below checks something."""
    assert sum(len(documented_commands((ROOT / document).read_text())) for document in DOCUMENTATION) >= 10
    assert len(documented_commands((ROOT / "docker-compose.yml").read_text())) >= 2


@pytest.mark.parametrize("document", [*DOCUMENTATION, "docker-compose.yml"])
def test_every_documented_command_parses(document: str) -> None:
    """What a new user copies from the documentation must at least be understood by the command."""
    commands = documented_commands((ROOT / document).read_text())
    for args in commands:
        try:
            build_parser(next((a for a in args if a in _ROLES), None)).parse_args(args)
        except SystemExit as exited:  # --version, --help: 0
            assert exited.code == 0, f"{document}: `gpusharing {' '.join(args)}` is refused"
