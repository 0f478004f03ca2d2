"""The ``gpusharing`` command: one entry point whose subcommands run every role."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpusharing.env import ConfigError

# Each role's module has register(subparsers); its parsers set `run` to a function taking the parsed args.
_ROLES = ("webhook.cli", "timekeeper.cli", "sidecar.cli", "gpusharing.certs")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpusharing", description="Governance for shared GPUs on Kubernetes.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _ROLES:
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except ConfigError as exc:
        print(f"gpusharing: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
