"""`gpusharing budget …`, `pods`, `explain`, `usage` and `report` (gpusharing.admin.reports): the timekeeper's API
(and a pod's record) from the command line, also as the kubectl plugin `kubectl gpusharing`.

Where the timekeeper is: --timekeeper or TIMEKEEPER_URL; else, as a kubectl plugin (or with --kubeconfig or
--context), through the API server's service proxy of the kubeconfig's context; else http://127.0.0.1:8080.
Global options are accepted before the command or anywhere after it, as kubectl takes its global flags. Every
failure is one line on stderr that says what to do, with the exit status docs/reference/cli.md lists (0 done, 1 a
server refused or could not be reached, 2 bad arguments or settings, 3 not found, 130 interrupted).
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from gpusharing.admin import reports
from gpusharing.admin.client import DEFAULT_URL, TOKEN_ENV, URL_ENV, BadArguments, Refused, TimekeeperClient
from gpusharing.admin.cluster import BUDGET_ADMIN, SYSTEM_NAMESPACE
from gpusharing.admin.explain import format_explanation, idle_of, pod_record, preemptor
from gpusharing.admin.output import emit, timekeeper_command
from gpusharing.admin.tables import (
    format_changes,
    format_listing,
    format_pods,
    format_statuses,
    format_tree,
    format_usage,
)
from gpusharing.contract import AdmissionMode, Period, Shortfall
from gpusharing.listing import listing_of
from gpusharing.settings.arguments import (
    budget_name,
    gpu_minutes,
    group_name,
    http_url,
    namespace,
    percents,
    whole_number,
)
from gpusharing.usage_report import UsageRequestError, usage_csv, usage_request

PERIODS = tuple(period.value for period in Period)
ADMISSION_MODES = tuple(mode.value for mode in AdmissionMode)
SHORTFALLS = tuple(shortfall.value for shortfall in Shortfall)
MAX_PODS = 10_000
OUTPUTS = ("table", "wide", "json", "yaml", "csv")  # csv: usage reports only

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
  gpusharing budget set ml-team --admission safe --on-shortfall refuse   # docs/safe-admission.md
  gpusharing budget set team.vision --gpu-minutes 20000            # a group's budget: a name with a dot
""",
    "pods": """examples:
  gpusharing pods --over-memory               # running pods using more GPU memory than they asked for
  gpusharing pods -n ml-team --limit 20 -o wide
""",
    "explain": """Reads the pod's record (its gpusharing.io/ annotations, priority class and meter) through the
API server of the kubeconfig's context, and its namespace's budget and the pod's metered use from the timekeeper:
why it got its share, class and state, what it is billed, and its idle streak (when the idle policy warns of it and
acts on it).

examples:
  kubectl gpusharing explain pod/train-0 -n ml-team
  kubectl gpusharing explain train-0 -o yaml
""",
    "usage": """from is the first UTC day counted, to the first day not counted. GPU-minutes are share x time; billed
GPU-minutes are weighted by the GPU models' billing weights (what budgets count). Idle GPU-minutes (paid for while
the GPU was idle) are shown where the meter reads utilisation; they are never billed.

examples:
  gpusharing usage --from 2026-11-01 --to 2026-12-01                     # per namespace, as a table
  gpusharing usage --from 2026-11-01 --to 2026-12-01 --by namespace,model -o csv > november.csv
  gpusharing usage --from 2026-11-01 --to 2026-12-01 --by label:team,pod --namespace ml-team -o json
""",
}


def global_options(parser: argparse.ArgumentParser) -> None:
    """--timekeeper and --token before the command (`gpusharing --token T budget ls`)."""
    _connection_options(parser, argparse.SUPPRESS)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    connection = argparse.ArgumentParser(add_help=False)
    _connection_options(connection, argparse.SUPPRESS)
    sub: dict[str, Any] = {"parents": [connection], "formatter_class": argparse.RawDescriptionHelpFormatter}

    budget = subparsers.add_parser(
        "budget", help="namespaces' GPU-minute budgets, through the timekeeper's API", epilog=EXAMPLES["budget"], **sub
    )
    actions = budget.add_subparsers(dest="budget_command", required=True, metavar="COMMAND")

    set_ = actions.add_parser(
        "set", help="change a namespace's or a group's budget: only what is named", epilog=EXAMPLES["set"], **sub
    )
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
    set_.add_argument("--admission", choices=ADMISSION_MODES,
                      help="how GPU pods are admitted (docs/safe-admission.md): open (the default), safe or strict")
    set_.add_argument(
        "--on-shortfall",
        choices=SHORTFALLS,
        help="what safe admission does with a pod the budget cannot cover: demote (the default) or refuse",
    )
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

    changes = actions.add_parser(
        "changes", help="the audit log of a namespace's budget: every set, top-up and removal", **sub
    )
    changes.add_argument("namespace", type=budget_name, metavar="NAME")
    changes.set_defaults(run=_budget_changes)

    pods = subparsers.add_parser(
        "pods", help="GPU pods as the meters report them: share, GPU time, memory", epilog=EXAMPLES["pods"], **sub
    )
    pods.add_argument(
        "--over-memory", action="store_true", help="only running pods using more GPU memory than they asked for"
    )
    pods.add_argument(
        "--limit",
        type=whole_number(1, MAX_PODS),
        default=500,
        help=f"at most this many (1 to {MAX_PODS:,}, default 500)",
    )
    pods.set_defaults(run=_pods)

    explain = subparsers.add_parser("explain", help="why a pod got its GPU share, priority class and budget state",
                                    epilog=EXAMPLES["explain"], **sub)
    explain.add_argument("pod", type=pod_name, metavar="pod/NAME")
    explain.set_defaults(run=_explain)
    usage = subparsers.add_parser(
        "usage", help="GPU usage between two days, grouped, as a table, CSV or JSON", epilog=EXAMPLES["usage"], **sub
    )
    usage.add_argument("--from", dest="start", required=True, metavar="YYYY-MM-DD", help="the first UTC day counted")
    usage.add_argument("--to", dest="end", required=True, metavar="YYYY-MM-DD", help="the first UTC day not counted")
    usage.add_argument("--by", default="namespace", metavar="KEYS",
                       help="comma-separated: namespace, day, model, pod, label:KEY (default namespace)")
    usage.set_defaults(run=_usage)
    reports.register(subparsers, **sub)


def _connection_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--timekeeper", type=http_url, default=default, metavar="URL",
                        help=f"the timekeeper's URL ({URL_ENV}; else, as a kubectl plugin or with --kubeconfig or "
                        f"--context, the API server's service proxy; else {DEFAULT_URL})")
    parser.add_argument(
        "--token",
        default=default,
        help=f"bearer token for the timekeeper ({TOKEN_ENV}; else, through a "
        f"kubeconfig, a token of ServiceAccount {SYSTEM_NAMESPACE}/{BUDGET_ADMIN} when the context may make one)",
    )
    parser.add_argument(
        "--kubeconfig", default=default, metavar="FILE", help="kubeconfig file (KUBECONFIG, else ~/.kube/config)"
    )
    parser.add_argument("--context", default=default, help="the kubeconfig's context (default: its current one)")
    parser.add_argument("--system-namespace", type=namespace, default=default, metavar="NS",
                        help=f"where kube-gpusharing is installed (default {SYSTEM_NAMESPACE})")
    parser.add_argument("-n", "--namespace", dest="selected_namespace", type=namespace, default=default, metavar="NS",
                        help="only this namespace (explain: the pod's; default the context's)")
    parser.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        default=default,
        help="every namespace (the default of ls and pods)",
    )
    parser.add_argument(
        "-o", "--output", choices=OUTPUTS, default=default, help="table (default), wide, json, yaml, or csv (usage)"
    )


def pod_name(raw: str) -> str:
    """`pod/NAME`, `pods/NAME`, `po/NAME` or `NAME`, as kubectl takes a pod."""
    kind, _, name = raw.rpartition("/")
    if kind not in ("", "pod", "pods", "po"):
        raise argparse.ArgumentTypeError(f"{raw!r} is not a pod: give pod/NAME")
    if not name or len(name) > 253 or not all(c.isalnum() and c.lower() == c or c in "-." for c in name):
        raise argparse.ArgumentTypeError(f"{name!r} is not a pod name: lower-case letters, digits, '-' and '.'")
    return name


def _namespace_filter(args: argparse.Namespace) -> str | None:
    return None if getattr(args, "all_namespaces", None) else getattr(args, "selected_namespace", None)


@timekeeper_command
def _budget_set(api: TimekeeperClient, args: argparse.Namespace) -> None:
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
    if args.admission is not None:
        changes["admission"] = args.admission
    if args.on_shortfall is not None:
        changes["onShortfall"] = args.on_shortfall
    if not changes:
        raise BadArguments("nothing to set: give --gpu-minutes N, --unlimited, --period, --[no-]evict-on-exhaustion, "
                       "--parent, --no-parent, --warning-thresholds, --admission or --on-shortfall")
    status = api.call("PATCH", f"budgets/{args.namespace}", changes)
    emit(args, status, lambda wide: format_statuses([status], wide))


@timekeeper_command
def _budget_get(api: TimekeeperClient, args: argparse.Namespace) -> None:
    status = api.call("GET", f"budgets/{args.namespace}")
    emit(args, status, lambda wide: format_statuses([status], wide))


@timekeeper_command
def _budget_ls(api: TimekeeperClient, args: argparse.Namespace) -> None:
    listing = api.call("GET", "budgets")
    only = _namespace_filter(args)
    if only:
        listing = listing_of(listing, only)
    emit(args, listing, lambda wide: format_listing(listing, wide))


@timekeeper_command
def _budget_top_up(api: TimekeeperClient, args: argparse.Namespace) -> None:
    body = {"gpuMinutes": args.gpu_minutes, "reason": args.reason}
    status = api.call("POST", f"budgets/{args.namespace}/top-ups", body)
    emit(args, status, lambda wide: format_statuses([status], wide))


@timekeeper_command
def _budget_tree(api: TimekeeperClient, args: argparse.Namespace) -> None:
    listing = api.call("GET", "budgets")
    emit(args, listing, lambda _wide: format_tree(listing))


@timekeeper_command
def _budget_rm(api: TimekeeperClient, args: argparse.Namespace) -> None:
    status = api.call("DELETE", f"budgets/{args.namespace}")
    if status is None:
        emit(args, {"removed": args.namespace}, lambda _wide: f"removed the group budget {args.namespace}")
        return
    emit(
        args,
        status,
        lambda wide: (
            f"removed the budget of {args.namespace}; it now has the default:\n{format_statuses([status], wide)}"
        ),
    )


@timekeeper_command
def _budget_changes(api: TimekeeperClient, args: argparse.Namespace) -> None:
    changes = api.call("GET", f"budgets/{args.namespace}/changes")
    emit(args, changes, lambda _wide: format_changes(changes["items"]))


@timekeeper_command
def _pods(api: TimekeeperClient, args: argparse.Namespace) -> None:
    query = {"limit": str(args.limit), "overMemory": "true" if args.over_memory else "false"}
    only = _namespace_filter(args)
    if only:
        query["namespace"] = only
    listing = api.call("GET", "pods", query=query)
    emit(args, listing, lambda wide: format_pods(listing["items"], wide))


def _explain_pod(api: TimekeeperClient, args: argparse.Namespace) -> None:
    assert api.cluster is not None
    namespace = getattr(args, "selected_namespace", None) or api.cluster.namespace
    pod = api.pod(namespace, args.pod)
    explanation: dict[str, Any] = {
        "pod": pod_record(pod),
        "namespace": None,
        "metering": None,
        "idle": None,
        "preemptedFor": None,
    }
    problem = None
    if explanation["pod"]["governed"]:
        try:
            explanation["namespace"] = api.call("GET", f"budgets/{namespace}")
            uid = explanation["pod"]["uid"]
            metered = api.call("GET", "pods", query={"namespace": namespace, "limit": str(MAX_PODS)})["items"]
            explanation["metering"] = next((p for p in metered if p.get("podUid") == uid), None)
            explanation["idle"] = idle_of(explanation["pod"], explanation["namespace"], explanation["metering"],
                                          dt.datetime.now(dt.timezone.utc))
            explanation["preemptedFor"] = _preempted_for(api, namespace, uid)
        except Refused as exc:
            problem = exc
    emit(args, explanation, lambda wide: format_explanation(explanation))
    if problem is not None:
        raise problem


def _preempted_for(api: TimekeeperClient, namespace: str, uid: str) -> dict[str, Any] | None:
    """Whom this pod was last preempted or evicted for, from its Events, and that namespace's standing where the
    caller may read it: a preemptor known by its UID alone is looked up in the ledger, which only a cluster-wide
    reader may search; a tenant learns its UID, and no more of another namespace's."""
    found = preemptor(api.pod_events(namespace, uid))
    if found is None:
        return None
    other = found.namespace
    try:
        if other is None and found.pod_uid is not None:
            pods = api.call("GET", "pods", query={"uid": found.pod_uid, "limit": "1"})["items"]
            other = pods[0]["namespace"] if pods else None
        if other is None or other == namespace:
            return None if other == namespace else {"namespace": None, "podUid": found.pod_uid, "status": None}
        return {"namespace": other, "podUid": found.pod_uid, "status": api.call("GET", f"budgets/{other}")}
    except Refused:
        return {"namespace": other, "podUid": found.pod_uid, "status": None}


_explain = timekeeper_command(_explain_pod, cluster_needed=True)


@timekeeper_command
def _usage(api: TimekeeperClient, args: argparse.Namespace) -> None:
    namespace = _namespace_filter(args)
    try:
        usage_request(args.start, args.end, args.by, namespace)  # refused here, before any request, when malformed
    except UsageRequestError as exc:
        raise BadArguments(str(exc)) from None
    query = {"from": args.start, "to": args.end, "groupBy": args.by, **({"namespace": namespace} if namespace else {})}
    report = api.call("GET", "usage", query=query)
    if getattr(args, "output", None) == "csv":
        print(usage_csv(report["fields"], report["items"]), end="")
    else:
        emit(args, report, lambda wide: format_usage(report))


