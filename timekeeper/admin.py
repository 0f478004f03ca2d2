"""`gpusharing budget …` and `gpusharing pods`: the timekeeper's API from the command line.

--timekeeper and --token are accepted before the command or anywhere after it, as kubectl takes its global flags.
Every failure is one line on stderr that says what to do, and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gpusharing.arguments import budget_name, gpu_minutes, group_name, http_url, namespace, percents, whole_number
from gpusharing.env import env_url
from gpusharing.jsonhttp import JsonClient, Unreachable
from timekeeper.budget import Period

DEFAULT_URL = "http://127.0.0.1:8080"
URL_ENV, TOKEN_ENV = "TIMEKEEPER_URL", "TIMEKEEPER_TOKEN"
PERIODS = tuple(period.value for period in Period)
MAX_PODS = 10_000

EXAMPLES = {
    "budget": """examples:
  gpusharing budget ls
  gpusharing budget set ml-team --gpu-minutes 6000 --period monthly --evict-on-exhaustion
  gpusharing budget top-up ml-team 120 --reason "paper deadline"
  gpusharing budget changes ml-team
  gpusharing budget set team.vision --gpu-minutes 20000           # a group budget (a name with a dot)
  gpusharing budget set ml-team --parent team.vision              # ml-team rolls up to it
  gpusharing budget tree
  gpusharing budget ls --timekeeper http://127.0.0.1:8080 --token "$TOKEN"
""",
    "set": """Changes only what it names; the rest stays as it was (for a namespace without a budget of its own: as the
default budget has it, TIMEKEEPER_DEFAULT_GPU_MINUTES and TIMEKEEPER_DEFAULT_PERIOD).

examples:
  gpusharing budget set ml-team --gpu-minutes 6000                 # a monthly budget, or the period it had
  gpusharing budget set ml-team --period weekly --evict-on-exhaustion
  gpusharing budget set ml-team --no-evict-on-exhaustion
  gpusharing budget set ops --unlimited                            # exempt from the default budget
  gpusharing budget set ml-team --parent team.vision --warning-thresholds 75,90
  gpusharing budget set team.vision --gpu-minutes 20000            # a group's budget: a name with a dot
""",
    "pods": """examples:
  gpusharing pods --over-memory               # running pods using more GPU memory than they asked for
  gpusharing pods --namespace ml-team --limit 20
""",
}


def global_options(parser: argparse.ArgumentParser) -> None:
    """--timekeeper and --token before the command (`gpusharing --token T budget ls`)."""
    _connection_options(parser, argparse.SUPPRESS)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    connection = argparse.ArgumentParser(add_help=False)
    _connection_options(connection, argparse.SUPPRESS)
    sub = {"parents": [connection], "formatter_class": argparse.RawDescriptionHelpFormatter}

    budget = subparsers.add_parser(
        "budget", help="namespaces' GPU-minute budgets, through the timekeeper's API", epilog=EXAMPLES["budget"], **sub
    )
    actions = budget.add_subparsers(dest="budget_command", required=True, metavar="COMMAND")

    set_ = actions.add_parser("set", help="change a namespace's or a group's budget: only what is named", epilog=EXAMPLES["set"], **sub)
    set_.add_argument("namespace", type=budget_name, metavar="NAME", help="a namespace, or a group (team.vision)")
    limit = set_.add_mutually_exclusive_group()
    limit.add_argument("--gpu-minutes", type=gpu_minutes, help="GPU-minutes per period (0 allows nothing)")
    limit.add_argument("--unlimited", action="store_true", help="no limit (exempt from the default budget)")
    set_.add_argument("--period", choices=PERIODS, help="when the budget renews (UTC): daily, weekly, monthly or none")
    set_.add_argument("--evict-on-exhaustion", action=argparse.BooleanOptionalAction,
                      help="evict the namespace's running GPU pods once it is over budget (or not)")
    parent = set_.add_mutually_exclusive_group()
    parent.add_argument("--parent", type=group_name, help="the group budget this one rolls up to (e.g. team.vision)")
    parent.add_argument("--no-parent", action="store_true", help="roll up to no group")
    set_.add_argument("--warning-thresholds", type=percents, metavar="P,P",
                      help="percents of the budget that warn, once per period (default 80,95; '' for none)")
    set_.set_defaults(run=_budget_set)

    get = actions.add_parser("get", help="show a namespace's or a group's status", **sub)
    get.add_argument("namespace", type=budget_name, metavar="NAME")
    get.set_defaults(run=_budget_get)

    ls = actions.add_parser("ls", help="list every budget (namespaces' and groups') and the default budget", **sub)
    ls.set_defaults(run=_budget_ls)

    tree = actions.add_parser("tree", help="the budgets as their hierarchy: groups above their namespaces", **sub)
    tree.set_defaults(run=_budget_tree)

    top_up = actions.add_parser("top-up", help="add GPU-minutes to a namespace's or a group's current period", **sub)
    top_up.add_argument("namespace", type=budget_name, metavar="NAME")
    top_up.add_argument("gpu_minutes", type=gpu_minutes, metavar="GPU_MINUTES")
    top_up.add_argument("--reason", required=True, help="why: recorded in the audit log")
    top_up.set_defaults(run=_budget_top_up)

    rm = actions.add_parser("rm", help="remove a namespace's budget (the default applies again) or a group's", **sub)
    rm.add_argument("namespace", type=budget_name, metavar="NAME")
    rm.set_defaults(run=_budget_rm)

    changes = actions.add_parser("changes", help="the audit log of a namespace's budget: every set, top-up and removal", **sub)
    changes.add_argument("namespace", type=budget_name, metavar="NAME")
    changes.set_defaults(run=_budget_changes)

    pods = subparsers.add_parser("pods", help="GPU pods as the meters report them: share, GPU time, memory", epilog=EXAMPLES["pods"], **sub)
    pods.add_argument("--namespace", type=namespace, help="only this namespace's pods")
    pods.add_argument("--over-memory", action="store_true", help="only running pods using more GPU memory than they asked for")
    pods.add_argument("--limit", type=whole_number(1, MAX_PODS), default=500, help=f"at most this many (1 to {MAX_PODS:,}, default 500)")
    pods.set_defaults(run=_pods)


def _connection_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--timekeeper", type=http_url, default=default, metavar="URL",
                        help=f"the timekeeper's URL ({URL_ENV}, else {DEFAULT_URL})")
    parser.add_argument("--token", default=default, help=f"bearer token ({TOKEN_ENV})")


class _Refused(Exception):
    """The timekeeper could not be reached or refused the request; the message is a sentence for the user."""


class _Timekeeper:
    """The API as the options and the environment say where it is and who asks."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.url = getattr(args, "timekeeper", None) or str(env_url(URL_ENV, DEFAULT_URL))
        self.token = getattr(args, "token", None) or os.environ.get(TOKEN_ENV, "").strip() or None
        self._http = JsonClient(self.url)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, query: dict[str, str] | None = None) -> Any:
        try:
            answer = self._http.request(method, f"/api/v1/{path}", body, self.token, query=query)
        except Unreachable as exc:
            raise _Refused(f"cannot reach the timekeeper at {self.url}: {exc}{self._where_hint(exc)}") from None
        if answer.status == 401:
            hint = ("give a token with --token or TIMEKEEPER_TOKEN" if self.token is None
                    else "the token given (--token or TIMEKEEPER_TOKEN) was not accepted")
            raise _Refused(f"the timekeeper refused (401): {answer.message}: {hint}")
        if answer.status >= 400:
            raise _Refused(f"the timekeeper refused ({answer.status}): {answer.message or answer.reason}")
        if answer.status == 204:
            return None
        body_read = answer.json()
        if body_read is None:
            raise _Refused(f"{self.url} answered {answer.status} without JSON: is it the timekeeper's URL?")
        return body_read

    def _where_hint(self, exc: Unreachable) -> str:
        if "connection refused" in str(exc) and self.url == DEFAULT_URL:
            return (f" (give its URL with --timekeeper or {URL_ENV}; on a cluster, first "
                    "`kubectl -n gpusharing-system port-forward svc/gpusharing-timekeeper 8080`)")
        return ""


def _command(run: Callable[[_Timekeeper, argparse.Namespace], None]) -> Callable[[argparse.Namespace], int]:
    """Runs a command against the timekeeper; a refusal is one line on stderr and exit status 1."""

    def wrapped(args: argparse.Namespace) -> int:
        try:
            run(_Timekeeper(args), args)
        except _Refused as exc:
            print(f"gpusharing: {exc}", file=sys.stderr)
            return 1
        return 0

    return wrapped


@_command
def _budget_set(api: _Timekeeper, args: argparse.Namespace) -> None:
    changes: dict[str, Any] = {}
    if args.unlimited or args.gpu_minutes is not None:
        changes["gpuMinutes"] = None if args.unlimited else args.gpu_minutes
    if args.period is not None:
        changes["period"] = args.period
    if args.evict_on_exhaustion is not None:
        changes["evictOnExhaustion"] = args.evict_on_exhaustion
    if args.parent or args.no_parent:
        changes["parent"] = args.parent
    if args.warning_thresholds is not None:
        changes["warningThresholds"] = list(args.warning_thresholds)
    if not changes:
        raise _Refused("nothing to set: give --gpu-minutes N, --unlimited, --period, --[no-]evict-on-exhaustion, "
                       "--parent, --no-parent or --warning-thresholds")
    print(format_statuses([api.call("PATCH", f"budgets/{args.namespace}", changes)]))


@_command
def _budget_get(api: _Timekeeper, args: argparse.Namespace) -> None:
    print(format_statuses([api.call("GET", f"budgets/{args.namespace}")]))


@_command
def _budget_ls(api: _Timekeeper, args: argparse.Namespace) -> None:
    listing = api.call("GET", "budgets")
    print(format_statuses(listing["items"]))
    default = listing.get("default")
    if isinstance(default, dict):
        print(f"\nany other namespace: {_budget(default.get('gpuMinutes'))} {default.get('period')} ({default.get('state')})")


@_command
def _budget_top_up(api: _Timekeeper, args: argparse.Namespace) -> None:
    body = {"gpuMinutes": args.gpu_minutes, "reason": args.reason}
    print(format_statuses([api.call("POST", f"budgets/{args.namespace}/top-ups", body)]))


@_command
def _budget_tree(api: _Timekeeper, args: argparse.Namespace) -> None:
    print(format_tree(api.call("GET", "budgets")["items"]))


@_command
def _budget_rm(api: _Timekeeper, args: argparse.Namespace) -> None:
    status = api.call("DELETE", f"budgets/{args.namespace}")
    if status is None:
        print(f"removed the group budget {args.namespace}")
        return
    print(f"removed the budget of {args.namespace}; it now has the default:")
    print(format_statuses([status]))


@_command
def _budget_changes(api: _Timekeeper, args: argparse.Namespace) -> None:
    rows = [[change["changedAt"], change["action"], change["actor"], _before(change), _after(change)]
            for change in api.call("GET", f"budgets/{args.namespace}/changes")["items"]]
    print(format_table(["CHANGED AT", "ACTION", "BY", "BEFORE", "AFTER"], rows))


@_command
def _pods(api: _Timekeeper, args: argparse.Namespace) -> None:
    query = {"limit": str(args.limit), "overMemory": "true" if args.over_memory else "false"}
    if args.namespace:
        query["namespace"] = args.namespace
    rows = [
        [f"{pod['namespace']}/{pod['pod']}", f"{pod['gpuShare']:g}", _minutes(pod["gpuSeconds"] / 60),
         _mib(pod["gpuMemoryUsedMiB"]), _mib(pod["gpuMemoryRequestedMiB"]), _mib(pod["gpuMemoryOverRequestMiB"]),
         "-" if pod["gpuUtilizationPercent"] is None else f"{pod['gpuUtilizationPercent']:g}%",
         pod["lastReportAt"], "yes" if pod["final"] else "no"]
        for pod in api.call("GET", "pods", query=query)["items"]
    ]
    columns = ["POD", "SHARE", "GPU-MINUTES", "MEMORY USED", "REQUESTED", "OVER", "GPU UTIL", "LAST REPORT", "ENDED"]
    print(format_table(columns, rows))


STATUS_COLUMNS = ["NAMESPACE", "BUDGET", "USED", "REMAINING", "STATE", "PERIOD", "EVICT", "PERIOD END"]


def format_statuses(items: Sequence[dict[str, Any]]) -> str:
    """One row per namespace, in GPU-minutes; the budget includes this period's top-ups."""
    rows = []
    for item in items:
        allowance = None if item.get("gpuMinutes") is None else item["gpuMinutes"] + (item.get("topUpGpuMinutes") or 0)
        remaining = item.get("remainingGpuMinutes")
        rows.append([item["namespace"], _budget(allowance), _minutes(item["usedGpuMinutes"]),
                     "-" if remaining is None else _minutes(remaining), item["state"], item["period"],
                     "yes" if item.get("evictOnExhaustion") else "no", item.get("periodEnd") or "never"])
    return format_table(STATUS_COLUMNS, rows)


TREE_COLUMNS = ["BUDGET", "GPU-MINUTES", "USED", "PERCENT", "STATE", "OWN STATE", "PERIOD", "MANAGED BY"]


def format_tree(items: Sequence[dict[str, Any]]) -> str:
    """The budgets as a tree: each group above the budgets that name it as parent; a budget whose parent is not
    listed (it has no budget) is a root, marked so."""
    names = {item["namespace"] for item in items}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for item in items:
        parent = item.get("parent")
        children.setdefault(parent if parent in names else None, []).append(item)
    rows: list[list[str]] = []

    def walk(item: dict[str, Any], prefix: str, branch: str, seen: frozenset[str]) -> None:
        allowance = None if item.get("gpuMinutes") is None else item["gpuMinutes"] + (item.get("topUpGpuMinutes") or 0)
        percent = item.get("percentUsed")
        missing = f" (parent {item['parent']}: no budget)" if item.get("parent") and item["parent"] not in names else ""
        rows.append([f"{prefix}{branch}{item['namespace']}{missing}", _budget(allowance), _minutes(item["usedGpuMinutes"]),
                     "-" if percent is None else f"{percent:.0f} %", item["state"], item.get("ownState", item["state"]),
                     item["period"], item.get("managedBy") or "-"])
        below = sorted(children.get(item["namespace"], []), key=lambda child: child["namespace"])
        inner = prefix + ("" if not branch else "│  " if branch == "├─ " else "   ")
        for index, child in enumerate(below):
            if child["namespace"] not in seen:  # never a loop, whatever the listing says
                walk(child, inner, "└─ " if index == len(below) - 1 else "├─ ", seen | {child["namespace"]})

    for root in sorted(children.get(None, []), key=lambda item: item["namespace"]):
        walk(root, "", "", frozenset({root["namespace"]}))
    return format_table(TREE_COLUMNS, rows)


def format_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    table = [list(columns), *[list(row) for row in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in table)


def _budget(gpu_minutes: float | None) -> str:
    return "unlimited" if gpu_minutes is None else _minutes(gpu_minutes)


def _minutes(value: float) -> str:
    return f"{value:,.1f}"


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} MiB"


def _terms(status: dict[str, Any] | None) -> str:
    if status is None:
        return "-"
    evict = ", evict" if status.get("evictOnExhaustion") else ""
    return f"{_budget(status.get('gpuMinutes'))} {status.get('period')}{evict}"


def _before(change: dict[str, Any]) -> str:
    return "(default)" if change["before"] is None and change["action"] == "set" else _terms(change["before"])


def _after(change: dict[str, Any]) -> str:
    after = change["after"]
    if change["action"] == "top-up" and after is not None:
        return f"+{_minutes(after['gpuMinutes'])}: {after.get('reason', '')}"
    return "(default)" if after is None else _terms(after)
