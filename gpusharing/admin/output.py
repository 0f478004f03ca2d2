"""How the admin commands run against the timekeeper (a refusal one line on stderr) and what they print, as -o asks:
the API's objects as JSON or YAML, else a table (-o wide: more columns) from gpusharing.admin.tables, or a pod's
explanation from gpusharing.admin.explain."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import yaml

from gpusharing.admin.client import BadArguments, Refused, TimekeeperClient
from gpusharing.listing import ListingError

CSV_COMMANDS = ("usage", "report")  # -o csv: reports only


def timekeeper_command(
    run: Callable[[TimekeeperClient, argparse.Namespace], None], cluster_needed: bool = False
) -> Callable[[argparse.Namespace], int]:
    """Runs a command against the timekeeper; a refusal is one line on stderr and its exit status."""

    def wrapped(args: argparse.Namespace) -> int:
        try:
            if getattr(args, "output", None) == "csv" and args.command not in CSV_COMMANDS:
                raise BadArguments("-o csv is for reports (gpusharing usage, gpusharing report): use -o json or yaml")
            run(TimekeeperClient(args, cluster_needed), args)
        except Refused as exc:
            print(f"gpusharing: {exc}", file=sys.stderr)
            return exc.exit_status
        except ListingError as exc:  # the timekeeper answered something this version cannot read as a budget's status
            print(f"gpusharing: the timekeeper's answer is not one this version reads: {exc}", file=sys.stderr)
            return Refused.exit_status
        return 0

    return wrapped


def emit(args: argparse.Namespace, data: Any, table: Callable[[bool], str]) -> None:
    """The API's objects as -o json or yaml, else the table (wide with -o wide). The tables take the API's
    objects as they came (what -o json prints) and read a budget's status through the listing's contract
    (gpusharing.listing), which refuses an answer that is none with ListingError."""
    output = getattr(args, "output", None) or "table"  # never csv here: the reports write their own
    if output == "json":
        print(json.dumps(data, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    else:
        print(table(output == "wide"))
