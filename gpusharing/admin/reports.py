"""`gpusharing report utilization|accounts|focus`: chargeback's reports from the timekeeper's API, as Slurm's sreport
gives them (docs/chargeback.md, "Reports"): the GPU capacity's use, the budget hierarchy's GPU-hours and costs, and
the FOCUS 1.2 export, written as the API answers it."""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpusharing.admin.client import BadArguments, TimekeeperClient
from gpusharing.admin.output import emit, timekeeper_command
from gpusharing.admin.tables import format_table
from gpusharing.settings.arguments import budget_name
from gpusharing.usage_report import UsageRequestError, report_days

EXAMPLES = """from is the first UTC day counted, to the first day not counted. GPU-hours are share x time.

examples:
  gpusharing report utilization --from 2026-11-01 --to 2026-12-01           # the cluster and each GPU model
  gpusharing report accounts --from 2026-11-01 --to 2026-12-01 -o csv       # the budget tree, GPU-hours and cost
  gpusharing report accounts --from 2026-11-01 --to 2026-12-01 --budget team.vision
  gpusharing report focus --from 2026-11-01 --to 2026-12-01 > november-focus.csv
  gpusharing report focus --from 2026-11-01 --to 2026-12-01 -n ml-team > ml-team.csv
"""
# How long a report may take: a month of a large cluster's export is minutes of the timekeeper's work
# (docs/operations.md, "Sizing chargeback").
REPORT_TIMEOUT_SECONDS = 1800.0
FIGURES = ("capacity", "allocated", "idle", "unallocated", "down", "over")
UTILIZATION_COLUMNS = ["SCOPE", *(f"{figure.upper()} GPU-H" for figure in FIGURES), "ALLOCATED %", "IDLE %",
                       "UNALLOCATED %", "DOWN %"]
ACCOUNT_COLUMNS = ["ACCOUNT", "OWN GPU-H", "GPU-H", "CORRECTIONS GPU-H", "OWN COST", "COST"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], **sub: Any) -> None:
    report = subparsers.add_parser("report", help="chargeback: GPU capacity's use, accounts' GPU-hours and costs, "
                                   "the FOCUS export", epilog=EXAMPLES, **sub)
    kinds = report.add_subparsers(dest="report_command", required=True, metavar="REPORT")
    for name, run, what in (("utilization", _utilization, "the cluster's and each GPU model's GPU capacity: "
                             "allocated, idle, unallocated, down"),
                            ("accounts", _accounts, "the budget hierarchy's GPU-hours and costs"),
                            ("focus", _focus, "the FOCUS 1.2 cost and usage dataset, as CSV on stdout")):
        kind = kinds.add_parser(name, help=what, epilog=EXAMPLES, **sub)
        kind.add_argument("--from", dest="start", required=True, metavar="YYYY-MM-DD", help="the first UTC day")
        kind.add_argument("--to", dest="end", required=True, metavar="YYYY-MM-DD", help="the first UTC day not counted")
        if name == "accounts":
            kind.add_argument("--budget", type=budget_name, metavar="NAME",
                              help="only this namespace's or group's subtree")
        kind.set_defaults(run=run)


def _window(args: argparse.Namespace) -> dict[str, str]:
    try:
        report_days(args.start, args.end)  # refused here, before any request, when malformed
    except UsageRequestError as exc:
        raise BadArguments(str(exc)) from None
    return {"from": args.start, "to": args.end}


@timekeeper_command
def _utilization(api: TimekeeperClient, args: argparse.Namespace) -> None:
    _print(args, api.call("GET", "utilization", query=_window(args), timeout=REPORT_TIMEOUT_SECONDS),
           format_utilization)


@timekeeper_command
def _accounts(api: TimekeeperClient, args: argparse.Namespace) -> None:
    query = {**_window(args), **({"budget": args.budget} if args.budget else {})}
    _print(args, api.call("GET", "accounts", query=query, timeout=REPORT_TIMEOUT_SECONDS), format_accounts)


def _print(args: argparse.Namespace, report: Mapping[str, Any], table: Callable[[Mapping[str, Any]], str]) -> None:
    """The report's items as CSV with -o csv; else as -o asks, its table by default."""
    if getattr(args, "output", None) == "csv":
        print(_csv(report["items"]), end="")
    else:
        emit(args, report, lambda wide: table(report))


@timekeeper_command
def _focus(api: TimekeeperClient, args: argparse.Namespace) -> None:
    namespace = getattr(args, "selected_namespace", None)
    if getattr(args, "output", None) not in (None, "csv"):
        raise BadArguments("gpusharing report focus writes the FOCUS CSV: -o csv or nothing")
    query = {**_window(args), **({"namespace": namespace} if namespace else {})}
    sys.stdout.buffer.write(api.download("focus", query=query, timeout=REPORT_TIMEOUT_SECONDS))
    sys.stdout.flush()


def format_utilization(report: Mapping[str, Any]) -> str:
    """The cluster's line, then each model's: GPU-hours of each figure, and its part of the capacity."""
    rows = []
    for item in report["items"]:
        rows.append([item["model"] or "cluster", *(f"{item[figure + 'GpuHours']:.3f}" for figure in FIGURES),
                     *(_percent(item[figure + "Percent"]) for figure in ("allocated", "idle", "unallocated", "down"))])
    return format_table(UTILIZATION_COLUMNS, rows)


def format_accounts(report: Mapping[str, Any]) -> str:
    """The tree, indented by depth, with each level's own and subtree's GPU-hours and cost, and the subtree's
    corrections."""
    currency = report.get("currency") or ""
    rows = [["  " * item["depth"] + item["name"], f"{item['ownGpuHours']:.3f}", f"{item['gpuHours']:.3f}",
             f"{item['correctionGpuHours']:.3f}", _money(item["ownCost"], currency), _money(item["cost"], currency)]
            for item in report["items"]]
    return format_table(ACCOUNT_COLUMNS, rows)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _money(value: str | None, currency: str) -> str:
    return "-" if value is None else f"{value} {currency}"


def _csv(items: Sequence[Mapping[str, Any]]) -> str:
    """The JSON's items as CSV, their field names as the header."""
    out = io.StringIO()
    columns = list(items[0]) if items else []
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for item in items:
        writer.writerow(["" if item[column] is None else item[column] for column in columns])
    return out.getvalue()
