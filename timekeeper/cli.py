"""`gpusharing timekeeper serve`, `gpusharing db upgrade` and `gpusharing budget …`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import requests

from gpusharing.env import ConfigError, load_code
from gpusharing.serving import ServerOptions, serve
from timekeeper.budget import Period


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    timekeeper = subparsers.add_parser("timekeeper", help="the budget service")
    commands = timekeeper.add_subparsers(dest="timekeeper_command", required=True, metavar="COMMAND")
    run = commands.add_parser("serve", help="serve the timekeeper API under gunicorn (settings: TIMEKEEPER_*)")
    run.add_argument("--host", help="address to listen on (TIMEKEEPER_HOST, default 0.0.0.0)")
    run.add_argument("--port", type=int, help="port (TIMEKEEPER_PORT, default 8080)")
    run.add_argument("--workers", type=int, help="gunicorn worker processes (TIMEKEEPER_WORKERS, default 2)")
    run.add_argument("--threads", type=int, help="threads per worker (TIMEKEEPER_THREADS, default 32)")
    run.set_defaults(run=_serve)

    db = subparsers.add_parser("db", help="the timekeeper's database")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    upgrade = db_commands.add_parser("upgrade", help="migrate the database (TIMEKEEPER_DATABASE_URL) to this version")
    upgrade.add_argument("--database-url", help="default: TIMEKEEPER_DATABASE_URL")
    upgrade.add_argument("--revision", default="head", help="target revision (default: head)")
    upgrade.set_defaults(run=_upgrade)

    budget = subparsers.add_parser("budget", help="namespaces' GPU-minute budgets, through the timekeeper's API")
    budget.add_argument("--timekeeper", default=os.environ.get("TIMEKEEPER_URL", "http://127.0.0.1:8080"),
                        help="the timekeeper's URL (TIMEKEEPER_URL, default http://127.0.0.1:8080)")
    budget.add_argument("--token", default=os.environ.get("TIMEKEEPER_TOKEN"), help="bearer token (TIMEKEEPER_TOKEN)")
    actions = budget.add_subparsers(dest="budget_command", required=True, metavar="COMMAND")
    set_ = actions.add_parser("set", help="set a namespace's budget")
    set_.add_argument("namespace")
    limit = set_.add_mutually_exclusive_group(required=True)
    limit.add_argument("--gpu-minutes", type=float, help="GPU-minutes per period")
    limit.add_argument("--unlimited", action="store_true", help="no limit (exempt from the default budget)")
    set_.add_argument("--period", choices=tuple(Period), default="monthly")
    set_.add_argument("--evict-on-exhaustion", action="store_true", help="evict running GPU pods once over budget")
    set_.set_defaults(run=_budget_set)
    get = actions.add_parser("get", help="show a namespace's status")
    get.add_argument("namespace")
    get.set_defaults(run=_budget_get)
    ls = actions.add_parser("ls", help="list every namespace's status")
    ls.set_defaults(run=_budget_ls)
    top_up = actions.add_parser("top-up", help="add GPU-minutes to a namespace's current period")
    top_up.add_argument("namespace")
    top_up.add_argument("gpu_minutes", type=float, metavar="GPU_MINUTES")
    top_up.add_argument("--reason", required=True)
    top_up.set_defaults(run=_budget_top_up)
    rm = actions.add_parser("rm", help="remove a namespace's budget (the default applies again)")
    rm.add_argument("namespace")
    rm.set_defaults(run=_budget_rm)


def _serve(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from timekeeper.app import NO_AUTH_WARNING
    from timekeeper.auth import load_static_tokens
    from timekeeper.config import TimekeeperConfig
    from timekeeper.db import Database
    from timekeeper.schema import schema_problem

    config = TimekeeperConfig.from_env()
    overrides = {key: getattr(args, key) for key in ("host", "port", "workers", "threads") if getattr(args, key) is not None}
    config = replace(config, **overrides)
    # Fail at start, in one line, rather than in every worker.
    if config.static_tokens_file:
        load_static_tokens(config.static_tokens_file)
    load_code("TIMEKEEPER_CLOCK", config.clock)
    database = Database.from_config(config)
    problem = schema_problem(database.engine)
    database.dispose()
    if problem:
        raise ConfigError(f"not serving: {problem}")
    if config.auth == "none":
        print(f"WARNING: {NO_AUTH_WARNING}", file=sys.stderr)
    serve(
        "timekeeper.app:create_app",
        ServerOptions(host=config.host, port=config.port, workers=config.workers, threads=config.threads),
    )
    return 0


def _upgrade(args: argparse.Namespace) -> int:
    from timekeeper.config import TimekeeperConfig
    from timekeeper.schema import upgrade

    url = args.database_url or TimekeeperConfig.from_env().database_url
    upgrade(url, args.revision)
    print(f"database migrated to {args.revision}")
    return 0


class _Refused(Exception):
    """The timekeeper could not be reached or refused the request; the message is a sentence for the user."""


def _call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    url = f"{args.timekeeper.rstrip('/')}/api/v1/{path}"
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    try:
        response = requests.request(method, url, json=body, headers=headers, timeout=10)
    except requests.RequestException as exc:
        raise _Refused(f"cannot reach the timekeeper at {args.timekeeper}: {type(exc).__name__}") from None
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if response.status_code >= 400:
        message = answer.get("error") if isinstance(answer, dict) else None
        raise _Refused(f"the timekeeper refused ({response.status_code}): {message or response.reason}")
    return answer


def _report(run: Any) -> Any:
    """Runs a budget command, turning a refusal into one line on stderr and exit status 1."""

    def wrapped(args: argparse.Namespace) -> int:
        try:
            run(args)
        except _Refused as exc:
            print(f"gpusharing: {exc}", file=sys.stderr)
            return 1
        return 0

    return wrapped


@_report
def _budget_set(args: argparse.Namespace) -> None:
    body = {"gpuMinutes": None if args.unlimited else args.gpu_minutes, "period": args.period,
            "evictOnExhaustion": args.evict_on_exhaustion}
    _print_status(_call(args, "PUT", f"budgets/{args.namespace}", body))


@_report
def _budget_get(args: argparse.Namespace) -> None:
    _print_status(_call(args, "GET", f"budgets/{args.namespace}"))


@_report
def _budget_ls(args: argparse.Namespace) -> None:
    print(format_table(_call(args, "GET", "budgets")["items"]))


@_report
def _budget_top_up(args: argparse.Namespace) -> None:
    _print_status(_call(args, "POST", f"budgets/{args.namespace}/top-ups", {"gpuMinutes": args.gpu_minutes, "reason": args.reason}))


@_report
def _budget_rm(args: argparse.Namespace) -> None:
    status = _call(args, "DELETE", f"budgets/{args.namespace}")
    print(f"removed the budget of {args.namespace}; it now has the default:")
    _print_status(status)


COLUMNS = (("NAMESPACE", "namespace"), ("BUDGET", "budget"), ("USED", "usedGpuMinutes"),
           ("REMAINING", "remainingGpuMinutes"), ("STATE", "state"), ("PERIOD END", "periodEnd"))


def format_table(items: list[dict[str, Any]]) -> str:
    """`budget ls`: one row per namespace, GPU-minutes; the budget includes this period's top-ups."""
    rows = [[title for title, _ in COLUMNS]]
    for item in items:
        rows.append([_cell(item, key) for _, key in COLUMNS])
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def _cell(item: dict[str, Any], key: str) -> str:
    if key == "budget":
        if item.get("gpuMinutes") is None:
            return "unlimited"
        return _minutes(item["gpuMinutes"] + (item.get("topUpGpuMinutes") or 0))
    value = item.get(key)
    if value is None:
        return "-"
    return _minutes(value) if isinstance(value, (int, float)) else str(value)


def _minutes(value: float) -> str:
    return f"{value:,.1f}"


def _print_status(item: dict[str, Any]) -> None:
    print(format_table([item]))
