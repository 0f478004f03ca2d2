"""The `gpusharing` command: each command loads only the role that registers it, and help lists them all."""

import argparse
import subprocess
import sys

import pytest

from gpusharing.cli import _ROLES, build_parser

SERVER_LIBRARIES = (
    "flask",
    "gunicorn",
    "sqlalchemy",
    "alembic",
    "kubernetes",
    "cryptography",
    "prometheus_client",
    "requests",
)


def registered_commands(parser: argparse.ArgumentParser) -> set[str]:
    [commands] = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return set(commands.choices)


@pytest.mark.parametrize(("command", "module"), sorted(_ROLES.items()))
def test_a_command_loads_its_role_which_registers_exactly_the_commands_mapped_to_it(command: str, module: str) -> None:
    assert registered_commands(build_parser(command)) == {name for name, owner in _ROLES.items() if owner == module}


def test_without_a_known_command_every_role_is_loaded_for_help() -> None:
    assert registered_commands(build_parser()) == set(_ROLES)
    assert registered_commands(build_parser("no-such-command")) == set(_ROLES)


@pytest.mark.parametrize(("command", "runs"), [("meter", "sidecar.meter"), ("node-agent", "nodeagent.agent")])
def test_the_meter_and_the_node_agent_load_none_of_the_servers_libraries(command: str, runs: str) -> None:
    code = (f"import sys; from gpusharing.cli import build_parser; build_parser({command!r}); import {runs}; "
            f"print([m for m in {SERVER_LIBRARIES!r} if m in sys.modules])")
    assert subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout == "[]\n"


def test_no_other_command_loads_grpc() -> None:
    code = "import sys; from gpusharing.cli import build_parser; build_parser(); print('grpc' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout == "False\n"
