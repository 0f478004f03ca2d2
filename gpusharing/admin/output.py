"""What the commands print: tables (wide with -o wide), a pod's explanation, usage reports, or the API's objects as
JSON or YAML."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from gpusharing.contract import ANNOTATION_PREFIX, IDLE_EXEMPT_LABEL, AdmissionMode
from gpusharing.decoded import instant
from gpusharing.idle.policy import PolicyInForce, idle_policy_from_json
from gpusharing.idle.verdict import PodFacts, Reading, Streak, outlook, verdict
from gpusharing.kube.owners import controller_of
from gpusharing.listing import BudgetListing, FairShareLevel, IdleHold, IdleInForce, ListedBudget
from gpusharing.utilisation import UtilisationSource


def emit(args: argparse.Namespace, data: Any, table: Callable[[bool], str]) -> None:
    """The API's objects as -o json or yaml, else the table (wide with -o wide). The tables below take the API's
    objects as they came (what -o json prints) and read a budget's status through the listing's contract
    (gpusharing.listing), which refuses an answer that is none with ListingError."""
    output = getattr(args, "output", None) or "table"  # never csv here: refused for every command but usage
    if output == "json":
        print(json.dumps(data, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    else:
        print(table(output == "wide"))


def pod_record(pod: dict[str, Any]) -> dict[str, Any]:
    """What governs a pod, from the API server's copy: the webhook's record, the priority it got, its meter."""
    metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    record = {
        k[len(ANNOTATION_PREFIX) :]: v
        for k, v in (metadata.get("annotations") or {}).items()
        if k.startswith(ANNOTATION_PREFIX)
    }
    meters = [("native sidecar", c) for c in spec.get("initContainers") or [] if c.get("name") == "gpusharing-meter"]
    meters += [("container", c) for c in spec.get("containers") or [] if c.get("name") == "gpusharing-meter"]
    owner = controller_of(pod)
    return {
        "namespace": metadata.get("namespace"), "name": metadata.get("name"), "uid": metadata.get("uid"),
        "phase": (pod.get("status") or {}).get("phase"), "governed": bool(record), "record": record,
        "priorityClassName": spec.get("priorityClassName"), "priority": spec.get("priority"),
        "meter": meters[0][0] if meters else None,
        "startTime": (pod.get("status") or {}).get("startTime"),
        "owner": None if owner is None else {"kind": owner.kind, "name": owner.name, "uid": owner.uid},
        "idleExempt": (metadata.get("labels") or {}).get(IDLE_EXEMPT_LABEL) == "true",
    }


def idle_of(
    pod: dict[str, Any], status: Mapping[str, Any] | None, ledger: dict[str, Any] | None, now: dt.datetime,
) -> dict[str, Any]:
    """What the idle policy in force says of the pod (gpusharing.idle.verdict, as the timekeeper's leader judges it),
    from its record, its namespace's budget (its status's JSON) and its ledger: its state, when it is warned and acted
    on, and why."""
    ledger, listed = ledger or {}, _status(status)
    in_force = None if listed is None else listed.idle_in_force
    rule = None if in_force is None else idle_policy_from_json(in_force.rule().to_json())
    policy = None if rule is None or in_force is None else PolicyInForce(rule, in_force.source or "")
    streak = Streak(
        instant(ledger.get("idleSince")), instant(ledger.get("idleWarnedAt")), instant(ledger.get("idleActedAt"))
    )
    source = UtilisationSource(ledger.get("utilisationSource") or UtilisationSource.METER)
    # A meter's silence is the leader's to judge, by the meters' interval it knows: a meter it flagged is silent, else
    # fresh; the node's (or Prometheus's) reading says until when it is fresh.
    node_word = source is not UtilisationSource.METER
    reading = Reading(
        ledger.get("gpuUtilizationPercent"),
        instant(ledger.get("utilisationAt") or ledger.get("lastReportAt")),
        source,
        instant(ledger.get("utilisationFreshUntil")) if node_word else None,
    )
    fresh = 0.0 if ledger.get("meterSilentSince") and not node_word else float("inf")
    judged = verdict(
        streak, reading, policy, PodFacts(instant(pod.get("startTime")), pod.get("idleExempt", False)), now, fresh
    )
    owner = pod.get("owner") or {}
    holds = () if listed is None else listed.idle_holds
    held = next((hold for hold in holds if hold.uid == owner.get("uid")), None)
    return {"state": str(judged.state), "idleSeconds": judged.idle_seconds, "why": judged.why,
            "policy": None if in_force is None else in_force.to_json(), "warnAt": _iso(judged.warn_at),
            "actAt": _iso(judged.act_at), "outlook": outlook(judged, streak),
            "ownerHeld": None if held is None else held.to_json()}


def _status(raw: Mapping[str, Any] | None) -> ListedBudget | None:
    """A budget's status read from its JSON (None for none): the admin command line reads statuses only so."""
    return None if raw is None else ListedBudget.from_json(raw)


def _iso(at: dt.datetime | None) -> str | None:
    return None if at is None else at.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _idle(explanation: dict[str, Any]) -> list[tuple[str, str]]:
    """The pod's idle streak, the policy in force and what it will do, and an owner held out of budget."""
    idle, record = explanation.get("idle"), explanation["pod"]["record"]
    if idle is None:
        return []
    policy = IdleInForce.read(idle["policy"])
    if policy is None:
        rule = "none: no budget up its namespace's chain sets one, nor the default budget (TIMEKEEPER_IDLE_*)"
    else:
        whose = f"the budget of {policy.source}" if policy.source else "the default budget (TIMEKEEPER_IDLE_*)"
        rule = (f"{policy.action} after {policy.after} idle (under {policy.utilisation_percent:g} % utilisation)"
                + (f", warned {policy.warn_before} before" if policy.warn_before not in ("0s", "0") else "")
                + (f", pods older than {policy.min_age}" if policy.min_age not in ("0s", "0") else "") + f": {whose}")
    lines = [("Idle", idle["why"]), ("Idle policy", rule)]
    if idle["outlook"]:
        lines.append(("Idle outlook", idle["outlook"]))
    if "idle-hold" in record:
        lines.append(("Out of budget", f"admitted so because its owner {record['idle-hold']} was held: an idle pod of "
                                        "its was evicted (its priority class stays for its life)"))
    hold = IdleHold.read(idle["ownerHeld"])
    if hold is not None:
        lines.append(("Owner held", f"{hold.kind} {hold.name} since {hold.held_at} (its pod {hold.pod} was "
                                     "evicted idle): its new pods are admitted out of budget until one uses its GPU"))
    return lines


def format_explanation(explanation: dict[str, Any]) -> str:
    pod, status, metering = explanation["pod"], _status(explanation["namespace"]), explanation["metering"]
    lines = [("Pod", f"{pod['namespace']}/{pod['name']} ({pod['phase'] or 'no phase'})")]
    if not pod["governed"]:
        lines.append(("Governed", "no: the pod carries no gpusharing.io/ record, so it asked for no GPU when it was "
                                  "admitted (or the webhook was not in its path)"))
        return _fields(lines)
    record = pod["record"]
    priority = pod["priorityClassName"] or "none"
    if pod["priority"] is not None:
        priority += f" (priority {pod['priority']})"
    lines += [
        ("Dialect", record.get("dialect", "-")),
        ("GPU share", f"{record.get('gpu-share', '-')} of a GPU, billed per second the pod runs"),
        ("GPU memory", f"{record.get('gpu-memory-mib', '-')} MiB asked for"),
        ("Admitted", f"{record.get('budget-state', 'unknown')}: {_admission_reason(record.get('budget-state'))}"),
        *([("Safe admission", f"{record['safe-admission']}: {_safe_admission_reason(record['safe-admission'])}")]
          if "safe-admission" in record else []),
        ("Priority class", priority),
        ("Meter", pod["meter"] or "none (the pod runs unmetered)"),
    ]
    if status is not None:
        allowance, ends = _budget(_allowance(status)), status.period_end or "never"
        lines.append(("Namespace now", f"{status.state}: {_amount(status.used_gpu_minutes)} of {allowance} GPU-minutes "
                                       f"used this {_word(status.period)} period (ends {ends})"))
        lines.append(("New GPU pods", _new_pods(status.state)))
    if status is not None:
        lines += _billing(metering)
    lines += _idle(explanation)
    lines += _fair_share(record, status)
    text = _fields(lines)
    path = _path(status)
    if path:  # the namespace's path down the budget tree, as Slurm's `sshare -l` shows it
        text += "\n\n" + _path_table(path)
    preempted = explanation.get("preemptedFor")
    if preempted:
        text += "\n\n" + _compared(pod["namespace"], path, preempted)
    return text


def _path(status: ListedBudget | None) -> list[FairShareLevel]:
    """A namespace's path down the budget tree, as its status read alone carries it; none when not ranked."""
    band = None if status is None else status.fair_share
    return [] if band is None else list(band.path or ())


def _path_table(path: list[FairShareLevel]) -> str:
    rows = [[str(level.level), level.node, f"{level.share:.3f}", f"{level.usage:.3f}", f"{level.ratio:.2f}",
             f"{level.rank}/{level.siblings}"] for level in path]
    return format_table(["LEVEL", "NODE", "SHARE", "USAGE", "RATIO", "RANK"], rows)


# kube-scheduler's message names the preemptor's UID
PREEMPTED_BY = re.compile(r"Preempted by pod ([0-9A-Za-z-]{1,64}) ")


@dataclass(frozen=True)
class Preemptor:
    """Whom a pod was last preempted or evicted for: a namespace (the controller's GPUFairShare Event names the one
    whose pods waited), or a pod's UID (kube-scheduler's Preempted Event names only that)."""

    namespace: str | None = None
    pod_uid: str | None = None


def preemptor(events: list[dict[str, Any]]) -> Preemptor | None:
    """From a pod's Events, the last that says whom it was preempted or evicted for; None: none does."""
    def when(event: dict[str, Any]) -> str:
        return str(
            event.get("lastTimestamp")
            or event.get("eventTime")
            or (event.get("metadata") or {}).get("creationTimestamp")
            or ""
        )

    for event in sorted(events, key=when, reverse=True):
        related = event.get("related") or {}
        if (
            event.get("reason") == "GPUFairShare"
            and related.get("kind") == "Namespace"
            and isinstance(related.get("name"), str)
        ):
            return Preemptor(namespace=related["name"])
        if event.get("reason") == "Preempted":
            named = PREEMPTED_BY.match(str(event.get("message") or ""))
            namespace = related.get("namespace") if related.get("kind", "Pod") == "Pod" else None
            if named or namespace:
                return Preemptor(namespace if isinstance(namespace, str) else None, named.group(1) if named else None)
    return None


def _compared(namespace: str, path: list[FairShareLevel], preempted: dict[str, Any]) -> str:
    """The preempting namespace's path beside the pod's, and the level where they part (`sshare -l` of both)."""
    other = preempted.get("namespace")
    if other is None:
        return _fields(
            [
                (
                    "Preempted for",
                    f"pod {preempted.get('podUid')}, of a namespace whose figures are not yours to read "
                    "(or of none the timekeeper accounts)",
                )
            ]
        )
    theirs = _path(_status(preempted.get("status")))
    if not theirs:
        why = ("its figures are not yours to read" if preempted.get("status") is None else "it is not ranked")
        return _fields([("Preempted for", f"pods of namespace {other}: {why}")])
    text = _fields([("Preempted for", f"pods of namespace {other}, whose path is:")]) + "\n" + _path_table(theirs)
    for mine, its in zip(path, theirs):
        if mine.node != its.node:
            among = f", among the children of {path[mine.level - 2].node}" if mine.level > 1 else ""
            where = f"level {mine.level}{among}"
            text += "\n" + _fields([("Where they part", (
                f"{where}: {mine.node} at {mine.ratio:.2f}x its share, rank {mine.rank}/{mine.siblings}; "
                f"{its.node} at {its.ratio:.2f}x, rank {its.rank}/{its.siblings} (lower ratio first)"))])
            break
    return text


def _fair_share(record: dict[str, Any], status: ListedBudget | None) -> list[tuple[str, str]]:
    """The band the pod was admitted in and why, its namespace's band now, and when that would rise at zero use."""
    lines = []
    if "fair-share-band" in record:
        lines.append(("Fair-share band", f"{record['fair-share-band']}: {record.get('fair-share-reason', '')}"))
    band = None if status is None else status.fair_share
    if band is not None:
        hours = (band.usage_gpu_seconds or 0.0) / 3600
        lines.append(("Namespace's band", f"{band.band} since {band.since} (rank {band.rank}, {hours:.2f} decayed "
                                          f"GPU-hours as of {band.as_of}; beyond {band.share_gpus:g} GPUs held, "
                                          f"new pods get {band.burst_class})"))
        change = band.zero_use_change
        lines.append(("At zero use", f"its band would rise at {change}" if change else "its band would not rise"))
    return lines


def _billing(ledger: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The pod's bill and where it comes from: the API server's record, and the meter's reports beside it."""
    if ledger is None:
        return [("Billed", "nothing yet: the pod has not started, or the timekeeper has not observed it yet")]
    observed, metered = ledger.get("observedGpuSeconds") or 0.0, ledger.get("meteredGpuSeconds") or 0.0
    source = ("from the API server's record" + (f" since {ledger['startedAt']}" if ledger.get("startedAt") else "")
              + (f", ended {ledger['endedAt']}" if ledger.get("endedAt") else ""))
    if metered > observed:
        source += "; the meter reported more, which counts"
    meter = (
        "no report yet"
        if ledger.get("lastReportAt") is None
        else f"{_minutes(metered / 60)} GPU-minutes, last report {ledger['lastReportAt']}"
        + (" (final)" if ledger.get("final") else "")
    )
    if ledger.get("meterSilentSince"):
        meter += (f"; SILENT since {ledger['meterSilentSince']}: billed from the record all the same, its utilisation "
                  "and memory unknown")
    return [("Billed", f"{_minutes(ledger['gpuSeconds'] / 60)} GPU-minutes, {source}"), ("Metered", meter),
            ("Utilisation", utilisation_source(ledger))]


_READ_BY = {"node": "the node agent, on the node (outranks the meter's while fresh)",
            "prometheus": "Prometheus (DCGM's per-pod series; outranks the meter's while fresh)",
            "meter": "its meter, inside the pod (counted only where no node agent or Prometheus reports)"}


def utilisation_source(ledger: dict[str, Any]) -> str:
    """Whose word the pod's GPU utilisation is (node, prometheus, meter, none), what it read and when."""
    source = ledger.get("utilisationSource")
    if source is None:
        return "none: nothing has read the pod's GPU utilisation yet"
    value = ledger.get("gpuUtilizationPercent")
    read = "unknown" if value is None else f"{value:g} %"
    at = ledger.get("utilisationAt") or ledger.get("lastReportAt")
    fresh = f", fresh until {ledger['utilisationFreshUntil']}" if ledger.get("utilisationFreshUntil") else ""
    return f"{source}: {read}, read at {at}{fresh}, by {_READ_BY.get(source, source)}"


def _admission_reason(state: str | None) -> str:
    return {
        "in-budget": "its namespace was within budget: the in-budget class unless the pod named its own",
        "over-budget": "its namespace was over budget: demoted to the over-budget class (preempted first, preempts no one)",
        "unlimited": "its namespace had no limit: the in-budget class unless the pod named its own",
        "unknown": "the webhook had not heard from the timekeeper yet: treated as in budget",
    }.get(state or "", "the webhook recorded no budget state")


def _safe_admission_reason(verdict: str) -> str:
    return {
        "reserved": "what is left uncommitted of its namespace's budget covered the pod to its deadline",
        "demoted": "what is left uncommitted did not cover the pod to its deadline: demoted to the over-budget class",
        "no-deadline": "the pod has no deadline: admitted by its namespace's state alone",
        "unchecked": "what the namespace's budgets had left uncommitted could not be counted: admitted by its state alone",
    }.get(verdict, "a verdict this version does not know")


def _new_pods(state: str) -> str:
    if state == "over-budget":
        return "get the over-budget class until a top-up, a raised budget or the next period"
    return "get the in-budget class unless they name their own"


def _fields(lines: list[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in lines) + 2
    return "\n".join(f"{name + ':':<{width}}{value}" for name, value in lines)


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
        _minutes(amounts["gpuMinutes"]),
        _minutes(amounts["billedGpuMinutes"]),
        "-" if idle is None else _minutes(idle),
        "-" if cost is None else _minutes(cost),
    ]


STATUS_COLUMNS = ["NAMESPACE", "BUDGET", "USED", "REMAINING", "STATE", "PERIOD", "EVICT", "PERIOD END"]


def format_statuses(items: Sequence[Mapping[str, Any]], wide: bool = False) -> str:
    """One row per namespace, in GPU-minutes; the budget includes this period's top-ups (wide: shown apart too)."""
    return _status_table([ListedBudget.from_json(item) for item in items], wide)


def _status_table(items: Sequence[ListedBudget], wide: bool) -> str:
    rows = []
    for item in items:
        row = [item.namespace, _budget(_allowance(item)), _amount(item.used_gpu_minutes),
               _amount(item.remaining_gpu_minutes), str(item.state), _word(item.period),
               "yes" if item.evict_on_exhaustion else "no", item.period_end or "never"]
        uncommitted = item.uncommitted
        rows.append(row + ([item.period_start or "-", _minutes(item.top_up_gpu_minutes or 0), _word(item.admission),
                            _word(item.on_shortfall), _amount(item.committed_gpu_minutes),
                            "-" if uncommitted is None else _minutes(uncommitted.gpu_minutes)] if wide else []))
    wide_columns = ["PERIOD START", "TOP-UPS", "ADMISSION", "ON SHORTFALL", "COMMITTED", "UNCOMMITTED"]
    return format_table(STATUS_COLUMNS + (wide_columns if wide else []), rows)


TREE_COLUMNS = ["BUDGET", "GPU-MINUTES", "USED", "PERCENT", "STATE", "OWN STATE", "PERIOD", "MANAGED BY"]


def format_listing(listing: Mapping[str, Any], wide: bool = False) -> str:
    """`budget ls`: the statuses, then what any other namespace has (the default budget)."""
    read = BudgetListing.from_json(listing)
    lines = [_status_table(read.items, wide)]
    default = read.default
    if default is not None:
        lines.append(f"\nany other namespace: {_budget(default.gpu_minutes)} {default.period} ({default.state})")
    return "\n".join(lines)


def format_changes(changes: Sequence[dict[str, Any]]) -> str:
    rows = [
        [change["changedAt"], change["action"], change["actor"], _before(change), _after(change)] for change in changes
    ]
    return format_table(["CHANGED AT", "ACTION", "BY", "BEFORE", "AFTER"], rows)


def format_pods(pods: Sequence[dict[str, Any]], wide: bool = False) -> str:
    rows = []
    for pod in pods:
        row = [f"{pod['namespace']}/{pod['pod']}", f"{pod['gpuShare']:g}", _minutes(pod["gpuSeconds"] / 60),
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
        rows.append([f"{prefix}{branch}{item.namespace}{missing}", _budget(_allowance(item)),
                     _amount(item.used_gpu_minutes), "-" if percent is None else f"{percent:.0f} %", str(item.state),
                     str(item.own_state or item.state), _word(item.period), item.managed_by or "-"])
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


def _budget(gpu_minutes: float | None) -> str:
    return "unlimited" if gpu_minutes is None else _minutes(gpu_minutes)


def _allowance(status: ListedBudget) -> float | None:
    """The budget plus this period's top-ups, what the tables show; None when unlimited."""
    return None if status.gpu_minutes is None else status.gpu_minutes + (status.top_up_gpu_minutes or 0)


def _amount(value: float | None) -> str:
    """GPU-minutes, or '-' where there are none to tell (unlimited, not known)."""
    return "-" if value is None else _minutes(value)


def _word(value: object) -> str:
    """A setting's word (a period, an admission mode), or '-' where the status does not say."""
    return "-" if value is None else str(value)


def _minutes(value: float) -> str:
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
    return f"{_budget(status.gpu_minutes)} {status.period}{evict}{safe}"


def _before(change: dict[str, Any]) -> str:
    return "(default)" if change["before"] is None and change["action"] == "set" else _terms(_status(change["before"]))


def _after(change: dict[str, Any]) -> str:
    after = change["after"]
    if change["action"] == "top-up" and after is not None:
        return f"+{_minutes(after['gpuMinutes'])}: {after.get('reason', '')}"
    return "(default)" if after is None else _terms(_status(after))
