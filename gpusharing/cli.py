"""The ``gpusharing`` command: one entry point whose subcommands run every role."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpusharing.env import ConfigError
from gpusharing.logs import configure_logging

# Each role's module has register(subparsers); its parsers set `run` to a function taking the parsed args.
# Keyed by the commands each one registers, so that a command loads only its own role: the meter runs in every
# GPU pod under a small memory limit and must not carry the servers' libraries.
_ROLES = {
    "webhook": "webhook.cli",
    "timekeeper": "timekeeper.cli",
    "db": "timekeeper.cli",
    "budget": "timekeeper.cli",
    "meter": "sidecar.cli",
    "certs": "gpusharing.certs",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of `command`'s role alone when it is a known command, else of every role (for help and errors)."""
    parser = argparse.ArgumentParser(prog="gpusharing", description="Governance for shared GPUs on Kubernetes.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = [_ROLES[command]] if command in _ROLES else dict.fromkeys(_ROLES.values())
    for module in modules:
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        configure_logging()
        return int(args.run(args) or 0)
    except ConfigError as exc:
        print(f"gpusharing: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
