"""The ``gpusharing`` command: one entry point whose subcommands run every role."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Each role's module has register(subparsers); its parsers set `run` to a function taking the parsed args. A module
# may also have global_options(parser): options taken before the command too, as kubectl takes its global flags;
# and prepare(): what must happen before anything else is loaded (the meter blocks its stop signals), which is why
# this module imports nothing more at its top.
# Keyed by the commands each one registers, so that a command loads only its own role: the meter runs in every
# GPU pod under a small memory limit and must not carry the servers' libraries.
_ROLES = {
    "webhook": "webhook.cli",
    "timekeeper": "timekeeper.cli",
    "db": "timekeeper.cli",
    "budget": "gpusharing.admin.commands",
    "pods": "gpusharing.admin.commands",
    "explain": "gpusharing.admin.commands",
    "usage": "gpusharing.admin.commands",
    "report": "gpusharing.admin.commands",
    "meter": "sidecar.cli",
    "node-agent": "nodeagent.cli",
    "certs": "gpusharing.serving.certcommand",
    "statements": "timekeeper.audit",
    "verify": "timekeeper.audit",
}

EXAMPLES = """examples:
  gpusharing db upgrade && TIMEKEEPER_AUTH=none gpusharing timekeeper serve    # a timekeeper on a laptop
  gpusharing budget set ml-team --gpu-minutes 6000 --timekeeper http://127.0.0.1:8080 --token "$TOKEN"
  gpusharing budget ls
  gpusharing pods --over-memory
  gpusharing usage --from 2026-11-01 --to 2026-12-01 --by namespace,day -o csv
  gpusharing report focus --from 2026-11-01 --to 2026-12-01 > november-focus.csv     # FOCUS 1.2, for finance
  gpusharing verify --keys published.pub     # the signed statements of closed periods, and every row they sign
  gpusharing COMMAND --help
"""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # a few tens of milliseconds: see _ROLES

    try:
        return version("kube-gpusharing")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def build_parser(command: str | None = None, prog: str = "gpusharing") -> argparse.ArgumentParser:
    """The parser of `command`'s role alone when it is a known command, else of every role (for help and errors)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Governance for shared GPUs on Kubernetes: the admission webhook, the timekeeper (GPU-minute "
        "budgets), the metering sidecar, and the commands to run and administer them.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = [_ROLES[command]] if command in _ROLES else dict.fromkeys(_ROLES.values())
    for name in modules:
        module = importlib.import_module(name)
        module.register(subparsers)
        if hasattr(module, "global_options"):
            module.global_options(parser)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "gpusharing", plugin: bool = False) -> int:
    """`plugin`: run as `kubectl gpusharing`, which finds the timekeeper through the kubeconfig when given no URL."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((word for word in argv if word in _ROLES), None)  # global options may come before it
    if command is not None:
        getattr(importlib.import_module(_ROLES[command]), "prepare", lambda: None)()
    from gpusharing.serving.logs import configure_logging  # after the role's preparation: see _ROLES
    from gpusharing.settings.env import ConfigError

    try:
        args = build_parser(command, prog).parse_args(argv)
        args.plugin = plugin
        configure_logging()
        return int(args.run(args) or 0)
    except ConfigError as exc:
        print(f"gpusharing: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def kubectl_plugin() -> int:
    """The `kubectl-gpusharing` command, which kubectl runs as `kubectl gpusharing`."""
    return main(prog="kubectl gpusharing", plugin=True)


if __name__ == "__main__":
    sys.exit(main())
