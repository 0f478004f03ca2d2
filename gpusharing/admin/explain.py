"""`gpusharing explain POD`: what governs a pod and why, in lines a person reads: its record, its namespace's
budget, its bill and meter, the idle policy's verdict, its fair-share band and whom it was preempted for."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpusharing.admin.tables import (
    allowance,
    format_amount,
    format_budget,
    format_minutes,
    format_table,
    format_word,
    read_status,
)
from gpusharing.contract import ANNOTATION_PREFIX, FAIR_SHARE_GATE, IDLE_EXEMPT_LABEL
from gpusharing.decoded import instant
from gpusharing.fairshare import fair_share_gate
from gpusharing.idle.policy import PolicyInForce, idle_policy_from_json
from gpusharing.idle.verdict import PodFacts, Reading, Streak, outlook, verdict
from gpusharing.kube.owners import controller_of
from gpusharing.listing import FairShareLevel, IdleHold, IdleInForce, ListedBudget
from gpusharing.utilisation import UtilisationSource


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
        "queued": fair_share_gate(spec) is not None,
        "node": spec.get("nodeName"),
    }


def idle_of(
    pod: dict[str, Any], status: Mapping[str, Any] | None, ledger: dict[str, Any] | None, now: dt.datetime,
) -> dict[str, Any]:
    """What the idle policy in force says of the pod (gpusharing.idle.verdict, as the timekeeper's leader judges it),
    from its record, its namespace's budget (its status's JSON) and its ledger: its state, when it is warned and acted
    on, and why."""
    ledger, listed = ledger or {}, read_status(status)
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
    pod, status, metering = explanation["pod"], read_status(explanation["namespace"]), explanation["metering"]
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
        ("GPU share", f"{record.get('gpu-share', '-')} of a GPU as admitted, billed per second the pod runs"),
        ("GPU model", _gpu_model(record, pod.get("node"), metering)),
        ("GPU memory", f"{record.get('gpu-memory-mib', '-')} MiB asked for"),
        ("Admitted", f"{record.get('budget-state', 'unknown')}: {_admission_reason(record.get('budget-state'))}"),
        *([("Safe admission", f"{record['safe-admission']}: {_safe_admission_reason(record['safe-admission'])}")]
          if "safe-admission" in record else []),
        ("Priority class", priority),
        ("Meter", pod["meter"] or "none (the pod runs unmetered)"),
    ]
    if status is not None:
        budget, ends = format_budget(allowance(status)), status.period_end or "never"
        used = format_amount(status.used_gpu_minutes)
        lines.append(("Namespace now", f"{status.state}: {used} of {budget} GPU-minutes used this "
                                       f"{format_word(status.period)} period (ends {ends})"))
        lines.append(("New GPU pods", _new_pods(status.state)))
    if status is not None:
        lines += _billing(metering)
    lines += _idle(explanation)
    lines += _fair_share(record, status)
    if pod.get("queued"):
        lines.append(("Fair-share queue", f"waiting behind the gate {FAIR_SHARE_GATE}: the controller releases it to "
                                          "kube-scheduler when GPUs come free, the lightest namespace's pods first"))
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
    theirs = _path(read_status(preempted.get("status")))
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


def _gpu_model(record: dict[str, Any], node: str | None, ledger: dict[str, Any] | None) -> str:
    """The model (and share) the pod was admitted on beside the one it is billed on, and why they differ: admission
    reads the models a pod names, else the catalogue's default; once bound, it is billed for its node's GPU."""
    admitted = f"{record.get('gpu-model') or 'the default model'} (share {record.get('gpu-share', '-')})"
    billed, share = (ledger or {}).get("gpuModel"), (ledger or {}).get("gpuShare")
    if billed is None:
        where = f"once billed, node {node}'s model" if node else "once bound and billed, its node's model"
        return f"admitted on {admitted}, the model it names or else the catalogue's default; billed on {where}"
    text = f"billed on {billed} (share {share:g})" + (f", the GPUs of node {node}" if node else "")
    if billed == record.get("gpu-model") and f"{share:g}" == f"{float(record.get('gpu-share') or 0):g}":
        text += ", as admitted"
    else:
        text += (f"; admitted on {admitted}, the model it names or else the catalogue's default: a pod is billed "
                 "for the GPU it got, never below what was admitted")
    for who, key in (("its node agent reads", "deviceGpuModel"), ("its meter names", "meterGpuModel")):
        said = ledger.get(key) if ledger else None
        if said and said != billed:
            text += f"; {who} {said}, evidence only (gpusharing_timekeeper_meter_model_disagreements)"
    return text


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
        else f"{format_minutes(metered / 60)} GPU-minutes, last report {ledger['lastReportAt']}"
        + (" (final)" if ledger.get("final") else "")
    )
    if ledger.get("meterSilentSince"):
        meter += (f"; SILENT since {ledger['meterSilentSince']}: billed from the record all the same, its utilisation "
                  "and memory unknown")
    return [("Billed", f"{format_minutes(ledger['gpuSeconds'] / 60)} GPU-minutes, {source}"), ("Metered", meter),
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
        "over-budget": "its namespace was over budget: demoted to the over-budget class (preempted first, preempts "
                       "no one)",
        "unlimited": "its namespace had no limit: the in-budget class unless the pod named its own",
        "unknown": "the webhook had not heard from the timekeeper yet: treated as in budget",
    }.get(state or "", "the webhook recorded no budget state")


def _safe_admission_reason(verdict: str) -> str:
    return {
        "reserved": "what is left uncommitted of its namespace's budget covered the pod to its deadline",
        "demoted": "what is left uncommitted did not cover the pod to its deadline: demoted to the over-budget class",
        "no-deadline": "the pod has no deadline: admitted by its namespace's state alone",
        "unchecked": "what the namespace's budgets had left uncommitted could not be counted: admitted by its state "
                     "alone",
    }.get(verdict, "a verdict this version does not know")


def _new_pods(state: str) -> str:
    if state == "over-budget":
        return "get the over-budget class until a top-up, a raised budget or the next period"
    return "get the in-budget class unless they name their own"


def _fields(lines: list[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in lines) + 2
    return "\n".join(f"{name + ':':<{width}}{value}" for name, value in lines)
