"""The tables the admin commands print: budgets' statuses (flat or as a tree), their audit log, pods' meter reports
and usage reports, amounts in GPU-minutes. They take the API's objects as they came (what -o json prints) and read a
budget's status through the listing's contract (gpusharing.listing), which refuses a malformed answer with
ListingError."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpusharing.contract import AdmissionMode
from gpusharing.listing import BudgetListing, ListedBudget


def read_status(raw: Mapping[str, Any] | None) -> ListedBudget | None:
    """A budget's status read from its JSON (None for none): the admin command line reads statuses only so."""
    return None if raw is None else ListedBudget.from_json(raw)


def format_usage(report: dict[str, Any]) -> str:
    """The report's groups and a total line, in GPU-minutes."""
    fields = report["fields"]
    rows = [[*("-" if item[field] is None else str(item[field]) for field in fields), *_usage_amounts(item)]
            for item in report["items"]]
    rows.append(["TOTAL", *[""] * (len(fields) - 1), *_usage_amounts(report["total"])])
    return format_table([*(field.upper() for field in fields), "GPU-MINUTES", "BILLED GPU-MINUTES", "IDLE GPU-MINUTES",
                         "IDLE BILLED GPU-MINUTES"], rows)


def _usage_amounts(amounts: dict[str, Any]) -> list[str]:
    idle, cost = amounts["idleGpuMinutes"], amounts.get("idleBilledGpuMinutes")
    return [
        format_minutes(amounts["gpuMinutes"]),
        format_minutes(amounts["billedGpuMinutes"]),
        "-" if idle is None else format_minutes(idle),
        "-" if cost is None else format_minutes(cost),
    ]


STATUS_COLUMNS = ["NAMESPACE", "BUDGET", "USED", "REMAINING", "STATE", "PERIOD", "EVICT", "PERIOD END"]


def format_statuses(items: Sequence[Mapping[str, Any]], wide: bool = False) -> str:
    """One row per namespace, in GPU-minutes; the budget includes this period's top-ups (wide: shown apart too)."""
    return _status_table([ListedBudget.from_json(item) for item in items], wide)


def _status_table(items: Sequence[ListedBudget], wide: bool) -> str:
    rows = []
    for item in items:
        row = [item.namespace, format_budget(allowance(item)), format_amount(item.used_gpu_minutes),
               format_amount(item.remaining_gpu_minutes), str(item.state), format_word(item.period),
               "yes" if item.evict_on_exhaustion else "no", item.period_end or "never"]
        uncommitted = item.uncommitted
        rows.append(row + ([item.period_start or "-", format_minutes(item.top_up_gpu_minutes or 0),
                            format_word(item.admission), format_word(item.on_shortfall),
                            format_amount(item.committed_gpu_minutes),
                            "-" if uncommitted is None else format_minutes(uncommitted.gpu_minutes)] if wide else []))
    wide_columns = ["PERIOD START", "TOP-UPS", "ADMISSION", "ON SHORTFALL", "COMMITTED", "UNCOMMITTED"]
    return format_table(STATUS_COLUMNS + (wide_columns if wide else []), rows)


TREE_COLUMNS = ["BUDGET", "GPU-MINUTES", "USED", "PERCENT", "STATE", "OWN STATE", "PERIOD", "MANAGED BY"]


def format_listing(listing: Mapping[str, Any], wide: bool = False) -> str:
    """`budget ls`: the statuses, then what any other namespace has (the default budget)."""
    read = BudgetListing.from_json(listing)
    lines = [_status_table(read.items, wide)]
    default = read.default
    if default is not None:
        lines.append(f"\nany other namespace: {format_budget(default.gpu_minutes)} {default.period} ({default.state})")
    return "\n".join(lines)


def format_changes(changes: Sequence[dict[str, Any]]) -> str:
    rows = [
        [change["changedAt"], change["action"], change["actor"], _before(change), _after(change)] for change in changes
    ]
    return format_table(["CHANGED AT", "ACTION", "BY", "BEFORE", "AFTER"], rows)


def format_pods(pods: Sequence[dict[str, Any]], wide: bool = False) -> str:
    rows = []
    for pod in pods:
        row = [f"{pod['namespace']}/{pod['pod']}", f"{pod['gpuShare']:g}", format_minutes(pod["gpuSeconds"] / 60),
               _mib(pod["gpuMemoryUsedMiB"]), _mib(pod["gpuMemoryRequestedMiB"]), _mib(pod["gpuMemoryOverRequestMiB"]),
               "-" if pod["gpuUtilizationPercent"] is None else f"{pod['gpuUtilizationPercent']:g}%",
               pod["lastReportAt"], "yes" if pod["final"] else "no"]
        rows.append(
            row + ([pod["podUid"], str(pod["seq"]), pod["firstReportAt"], pod.get("idleSince") or "-"] if wide else [])
        )
    columns = ["POD", "SHARE", "GPU-MINUTES", "MEMORY USED", "REQUESTED", "OVER", "GPU UTIL", "LAST REPORT", "ENDED"]
    return format_table(columns + (["UID", "REPORTS", "FIRST REPORT", "IDLE SINCE"] if wide else []), rows)


def format_tree(listing: Mapping[str, Any]) -> str:
    """The listing's budgets as a tree: each group above the budgets that name it as parent; a budget whose parent is
    not listed (it has no budget) is a root, marked so."""
    items = BudgetListing.from_json(listing).items
    names = {item.namespace for item in items}
    children: dict[str | None, list[ListedBudget]] = {}
    for item in items:
        children.setdefault(item.parent if item.parent in names else None, []).append(item)
    rows: list[list[str]] = []

    def walk(item: ListedBudget, prefix: str, branch: str, seen: frozenset[str]) -> None:
        percent = item.percent_used
        missing = f" (parent {item.parent}: no budget)" if item.parent and item.parent not in names else ""
        rows.append([f"{prefix}{branch}{item.namespace}{missing}", format_budget(allowance(item)),
                     format_amount(item.used_gpu_minutes), "-" if percent is None else f"{percent:.0f} %",
                     str(item.state), str(item.own_state or item.state), format_word(item.period),
                     item.managed_by or "-"])
        below = sorted(children.get(item.namespace, []), key=lambda child: child.namespace)
        inner = prefix + ("" if not branch else "│  " if branch == "├─ " else "   ")
        for index, child in enumerate(below):
            if child.namespace not in seen:  # never a loop, whatever the listing says
                walk(child, inner, "└─ " if index == len(below) - 1 else "├─ ", seen | {child.namespace})

    for root in sorted(children.get(None, []), key=lambda item: item.namespace):
        walk(root, "", "", frozenset({root.namespace}))
    return format_table(TREE_COLUMNS, rows)


def format_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    table = [list(columns), *[list(row) for row in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in table)


def format_budget(gpu_minutes: float | None) -> str:
    return "unlimited" if gpu_minutes is None else format_minutes(gpu_minutes)


def allowance(status: ListedBudget) -> float | None:
    """The budget plus this period's top-ups, what the tables show; None when unlimited."""
    return None if status.gpu_minutes is None else status.gpu_minutes + (status.top_up_gpu_minutes or 0)


def format_amount(value: float | None) -> str:
    """GPU-minutes, or '-' where there are none to tell (unlimited, not known)."""
    return "-" if value is None else format_minutes(value)


def format_word(value: object) -> str:
    """A setting's word (a period, an admission mode), or '-' where the status does not say."""
    return "-" if value is None else str(value)


def format_minutes(value: float) -> str:
    return f"{value:,.1f}"


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} MiB"


def _terms(status: ListedBudget | None) -> str:
    """A budget's terms in the audit log (its record of the budget is a status, read as one)."""
    if status is None:
        return "-"
    evict = ", evict" if status.evict_on_exhaustion else ""
    admission = status.admission or AdmissionMode.OPEN
    safe = f", {admission} admission ({status.on_shortfall} on shortfall)" if admission != AdmissionMode.OPEN else ""
    return f"{format_budget(status.gpu_minutes)} {status.period}{evict}{safe}"


def _before(change: dict[str, Any]) -> str:
    if change["before"] is None and change["action"] == "set":
        return "(default)"
    return _terms(read_status(change["before"]))


def _after(change: dict[str, Any]) -> str:
    after = change["after"]
    if change["action"] == "top-up" and after is not None:
        return f"+{format_minutes(after['gpuMinutes'])}: {after.get('reason', '')}"
    return "(default)" if after is None else _terms(read_status(after))
