"""`gpusharing budget …`, `gpusharing pods` and `gpusharing explain`: the timekeeper's API (and a pod's record) from
the command line, also as the kubectl plugin `kubectl gpusharing`.

Where the timekeeper is: --timekeeper or TIMEKEEPER_URL; else, as a kubectl plugin (or with --kubeconfig or
--context), through the API server's service proxy of the kubeconfig's context; else http://127.0.0.1:8080.
Global options are accepted before the command or anywhere after it, as kubectl takes its global flags.
Output is a table (-o wide: more columns) or the API's objects (-o json, -o yaml). Exit status: 0 done; 1 a server
refused or could not be reached; 2 bad arguments or settings; 3 what was named does not exist. Every failure is
one line on stderr that says what to do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import yaml

from gpusharing.arguments import budget_name, gpu_minutes, group_name, http_url, namespace, percents, whole_number
from gpusharing.contract import ANNOTATION_PREFIX, AdmissionMode, Shortfall
from gpusharing.env import env_url
from gpusharing.jsonhttp import Answer, JsonClient, Unreachable
from timekeeper.budget import Period
from timekeeper.cluster import BUDGET_ADMIN, SYSTEM_NAMESPACE, Cluster, status_message
from timekeeper.usage import UsageRequestError, usage_csv, usage_request

DEFAULT_URL = "http://127.0.0.1:8080"
URL_ENV, TOKEN_ENV = "TIMEKEEPER_URL", "TIMEKEEPER_TOKEN"
PERIODS = tuple(period.value for period in Period)
ADMISSION_MODES = tuple(mode.value for mode in AdmissionMode)
SHORTFALLS = tuple(shortfall.value for shortfall in Shortfall)
MAX_PODS = 10_000
OUTPUTS = ("table", "wide", "json", "yaml", "csv")  # csv: usage reports only
BAD_ARGUMENTS = 2  # the exit status of arguments or settings that cannot be used (argparse's own)
NOT_FOUND = 3  # the exit status when what was named does not exist

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
  gpusharing budget set ml-team --admission safe --on-shortfall refuse   # README, Safe admission
  gpusharing budget set team.vision --gpu-minutes 20000            # a group's budget: a name with a dot
""",
    "pods": """examples:
  gpusharing pods --over-memory               # running pods using more GPU memory than they asked for
  gpusharing pods -n ml-team --limit 20 -o wide
""",
    "explain": """Reads the pod's record (its gpusharing.io/ annotations, priority class and meter) through the API server of
the kubeconfig's context, and its namespace's budget and the pod's metered use from the timekeeper.

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
    set_.add_argument("--admission", choices=ADMISSION_MODES,
                      help="how GPU pods are admitted (README, Safe admission): open (the default), safe or strict")
    set_.add_argument("--on-shortfall", choices=SHORTFALLS,
                      help="what safe admission does with a pod the budget cannot cover: demote (the default) or refuse")
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
    pods.add_argument("--over-memory", action="store_true", help="only running pods using more GPU memory than they asked for")
    pods.add_argument("--limit", type=whole_number(1, MAX_PODS), default=500, help=f"at most this many (1 to {MAX_PODS:,}, default 500)")
    pods.set_defaults(run=_pods)

    explain = subparsers.add_parser("explain", help="why a pod got its GPU share, priority class and budget state",
                                    epilog=EXAMPLES["explain"], **sub)
    explain.add_argument("pod", type=pod_name, metavar="pod/NAME")
    explain.set_defaults(run=_explain)
    usage = subparsers.add_parser("usage", help="GPU usage between two days, grouped, as a table, CSV or JSON", epilog=EXAMPLES["usage"], **sub)
    usage.add_argument("--from", dest="start", required=True, metavar="YYYY-MM-DD", help="the first UTC day counted")
    usage.add_argument("--to", dest="end", required=True, metavar="YYYY-MM-DD", help="the first UTC day not counted")
    usage.add_argument("--by", default="namespace", metavar="KEYS",
                       help="comma-separated: namespace, day, model, pod, label:KEY (default namespace)")
    usage.set_defaults(run=_usage)


def _connection_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--timekeeper", type=http_url, default=default, metavar="URL",
                        help=f"the timekeeper's URL ({URL_ENV}; else, as a kubectl plugin or with --kubeconfig or "
                        f"--context, the API server's service proxy; else {DEFAULT_URL})")
    parser.add_argument("--token", default=default, help=f"bearer token for the timekeeper ({TOKEN_ENV}; else, through a "
                        f"kubeconfig, a token of ServiceAccount {SYSTEM_NAMESPACE}/{BUDGET_ADMIN} when the context may make one)")
    parser.add_argument("--kubeconfig", default=default, metavar="FILE", help="kubeconfig file (KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--context", default=default, help="the kubeconfig's context (default: its current one)")
    parser.add_argument("--system-namespace", type=namespace, default=default, metavar="NS",
                        help=f"where kube-gpusharing is installed (default {SYSTEM_NAMESPACE})")
    parser.add_argument("-n", "--namespace", dest="selected_namespace", type=namespace, default=default, metavar="NS",
                        help="only this namespace (explain: the pod's; default the context's)")
    parser.add_argument("-A", "--all-namespaces", action="store_true", default=default, help="every namespace (the default of ls and pods)")
    parser.add_argument("-o", "--output", choices=OUTPUTS, default=default, help="table (default), wide, json, yaml, or csv (usage)")


def pod_name(raw: str) -> str:
    """`pod/NAME`, `pods/NAME`, `po/NAME` or `NAME`, as kubectl takes a pod."""
    kind, _, name = raw.rpartition("/")
    if kind not in ("", "pod", "pods", "po"):
        raise argparse.ArgumentTypeError(f"{raw!r} is not a pod: give pod/NAME")
    if not name or len(name) > 253 or not all(c.isalnum() and c.lower() == c or c in "-." for c in name):
        raise argparse.ArgumentTypeError(f"{name!r} is not a pod name: lower-case letters, digits, '-' and '.'")
    return name


class _Refused(Exception):
    """A server could not be reached or refused the request; the message is a sentence for the user."""

    exit_status = 1


class _NotFound(_Refused):
    exit_status = NOT_FOUND


class _BadArguments(_Refused):
    exit_status = BAD_ARGUMENTS


class _Timekeeper:
    """The API as the options and the environment say where it is and who asks; the cluster of the kubeconfig's
    context when a kubectl plugin runs, or --kubeconfig or --context is given."""

    def __init__(self, args: argparse.Namespace, cluster_needed: bool = False) -> None:
        option = lambda name: getattr(args, name, None)  # noqa: E731 (options absent from a parser read as not given)
        self.system_namespace = option("system_namespace") or SYSTEM_NAMESPACE
        self.cluster: Cluster | None = None
        if cluster_needed or option("plugin") or option("kubeconfig") or option("context"):
            kubeconfig = option("kubeconfig") or os.environ.get("KUBECONFIG") or "~/.kube/config"
            self.cluster = Cluster.from_kubeconfig(os.path.expanduser(kubeconfig), option("context"))
        url = option("timekeeper") or env_url(URL_ENV)
        if url or self.cluster is None:
            self.url = str(url or DEFAULT_URL)
            self._http = JsonClient(self.url)
        else:
            self.url = f"the service proxy of {self.cluster.server} (context {self.cluster.context})"
            self._http = self.cluster.timekeeper(self.system_namespace)
        self.token = option("token") or os.environ.get(TOKEN_ENV, "").strip() or None
        self._no_token = ""
        if self.token is None and self.cluster is not None:
            self.token, self._no_token = self._cluster_token(self.cluster)

    def _cluster_token(self, cluster: Cluster) -> tuple[str | None, str]:
        try:
            return cluster.timekeeper_token(self.system_namespace)
        except Unreachable as exc:
            raise _Refused(f"cannot reach the API server {cluster.server}: {exc}") from None

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, query: dict[str, str] | None = None) -> Any:
        try:
            answer = self._http.request(method, f"/api/v1/{path}", body, self.token, query=query)
        except Unreachable as exc:
            raise _Refused(f"cannot reach the timekeeper at {self.url}: {exc}{self._where_hint(exc)}") from None
        if _is_kubernetes_status(answer):  # the API server's answer, not the timekeeper's
            raise _Refused(f"the API server did not reach the timekeeper ({answer.status}): {status_message(answer)}"
                           f"{self._proxy_hint(answer)}")
        if answer.status == 401:
            if self.token is None:
                hint = "give a token with --token or TIMEKEEPER_TOKEN" + (f" ({self._no_token})" if self._no_token else "")
            else:
                hint = "the token given (--token or TIMEKEEPER_TOKEN) was not accepted"
            raise _Refused(f"the timekeeper refused (401): {answer.message}: {hint}")
        if answer.status == 404:
            raise _NotFound(f"the timekeeper refused (404): {answer.message or answer.reason}")
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
            return (f" (give its URL with --timekeeper or {URL_ENV}; on a cluster, use `kubectl gpusharing`, which "
                    "reaches it through the API server, or `kubectl -n gpusharing-system port-forward "
                    "svc/gpusharing-timekeeper 8080`)")
        return ""

    def _proxy_hint(self, answer: Answer) -> str:
        if answer.status in (404, 503):
            return (f": is kube-gpusharing installed in namespace {self.system_namespace} (--system-namespace) and its "
                    "timekeeper running?")
        return ""

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        """The pod as the API server of the kubeconfig's context has it."""
        assert self.cluster is not None
        try:
            answer = self.cluster.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except Unreachable as exc:
            raise _Refused(f"cannot reach the API server {self.cluster.server}: {exc}") from None
        if answer.status == 404:
            raise _NotFound(f"pod {name} not found in namespace {namespace}")
        if answer.status >= 400:
            raise _Refused(f"the API server refused ({answer.status}): {status_message(answer)}")
        return dict(answer.json())


def _is_kubernetes_status(answer: Answer) -> bool:
    body = answer.json()
    return answer.status >= 400 and isinstance(body, dict) and body.get("kind") == "Status"


def _command(run: Callable[[_Timekeeper, argparse.Namespace], None], cluster_needed: bool = False) -> Callable[[argparse.Namespace], int]:
    """Runs a command against the timekeeper; a refusal is one line on stderr and its exit status."""

    def wrapped(args: argparse.Namespace) -> int:
        try:
            run(_Timekeeper(args, cluster_needed), args)
        except _Refused as exc:
            print(f"gpusharing: {exc}", file=sys.stderr)
            return exc.exit_status
        return 0

    return wrapped


def _emit(args: argparse.Namespace, data: Any, table: Callable[[bool], str]) -> None:
    """The API's objects as -o json or yaml, else the table (wide with -o wide)."""
    output = getattr(args, "output", None) or "table"
    if output == "csv":
        raise _BadArguments("-o csv is for usage reports (gpusharing usage): use -o json or yaml")
    if output == "json":
        print(json.dumps(data, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    else:
        print(table(output == "wide"))


def _namespace_filter(args: argparse.Namespace) -> str | None:
    return None if getattr(args, "all_namespaces", None) else getattr(args, "selected_namespace", None)


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
    if args.admission is not None:
        changes["admission"] = args.admission
    if args.on_shortfall is not None:
        changes["onShortfall"] = args.on_shortfall
    if not changes:
        raise _Refused("nothing to set: give --gpu-minutes N, --unlimited, --period, --[no-]evict-on-exhaustion, "
                       "--parent, --no-parent, --warning-thresholds, --admission or --on-shortfall")
    status = api.call("PATCH", f"budgets/{args.namespace}", changes)
    _emit(args, status, lambda wide: format_statuses([status], wide))


@_command
def _budget_get(api: _Timekeeper, args: argparse.Namespace) -> None:
    status = api.call("GET", f"budgets/{args.namespace}")
    _emit(args, status, lambda wide: format_statuses([status], wide))


@_command
def _budget_ls(api: _Timekeeper, args: argparse.Namespace) -> None:
    listing = api.call("GET", "budgets")
    only = _namespace_filter(args)
    if only:
        listing["items"] = [item for item in listing["items"] if item.get("namespace") == only]

    def table(wide: bool) -> str:
        lines = [format_statuses(listing["items"], wide)]
        default = listing.get("default")
        if isinstance(default, dict):
            lines.append(f"\nany other namespace: {_budget(default.get('gpuMinutes'))} {default.get('period')} ({default.get('state')})")
        return "\n".join(lines)

    _emit(args, listing, table)


@_command
def _budget_top_up(api: _Timekeeper, args: argparse.Namespace) -> None:
    body = {"gpuMinutes": args.gpu_minutes, "reason": args.reason}
    status = api.call("POST", f"budgets/{args.namespace}/top-ups", body)
    _emit(args, status, lambda wide: format_statuses([status], wide))


@_command
def _budget_tree(api: _Timekeeper, args: argparse.Namespace) -> None:
    listing = api.call("GET", "budgets")
    _emit(args, listing, lambda _wide: format_tree(listing["items"]))


@_command
def _budget_rm(api: _Timekeeper, args: argparse.Namespace) -> None:
    status = api.call("DELETE", f"budgets/{args.namespace}")
    if status is None:
        _emit(args, {"removed": args.namespace}, lambda _wide: f"removed the group budget {args.namespace}")
        return
    _emit(args, status, lambda wide: f"removed the budget of {args.namespace}; it now has the default:\n{format_statuses([status], wide)}")


@_command
def _budget_changes(api: _Timekeeper, args: argparse.Namespace) -> None:
    changes = api.call("GET", f"budgets/{args.namespace}/changes")
    rows = [[change["changedAt"], change["action"], change["actor"], _before(change), _after(change)] for change in changes["items"]]
    _emit(args, changes, lambda wide: format_table(["CHANGED AT", "ACTION", "BY", "BEFORE", "AFTER"], rows))


@_command
def _pods(api: _Timekeeper, args: argparse.Namespace) -> None:
    query = {"limit": str(args.limit), "overMemory": "true" if args.over_memory else "false"}
    only = _namespace_filter(args)
    if only:
        query["namespace"] = only
    listing = api.call("GET", "pods", query=query)

    def table(wide: bool) -> str:
        rows = []
        for pod in listing["items"]:
            row = [f"{pod['namespace']}/{pod['pod']}", f"{pod['gpuShare']:g}", _minutes(pod["gpuSeconds"] / 60),
                   _mib(pod["gpuMemoryUsedMiB"]), _mib(pod["gpuMemoryRequestedMiB"]), _mib(pod["gpuMemoryOverRequestMiB"]),
                   "-" if pod["gpuUtilizationPercent"] is None else f"{pod['gpuUtilizationPercent']:g}%",
                   pod["lastReportAt"], "yes" if pod["final"] else "no"]
            rows.append(row + ([pod["podUid"], str(pod["seq"]), pod["firstReportAt"]] if wide else []))
        columns = ["POD", "SHARE", "GPU-MINUTES", "MEMORY USED", "REQUESTED", "OVER", "GPU UTIL", "LAST REPORT", "ENDED"]
        return format_table(columns + (["UID", "REPORTS", "FIRST REPORT"] if wide else []), rows)

    _emit(args, listing, table)


def _explain_pod(api: _Timekeeper, args: argparse.Namespace) -> None:
    assert api.cluster is not None
    namespace = getattr(args, "selected_namespace", None) or api.cluster.namespace
    pod = api.pod(namespace, args.pod)
    explanation: dict[str, Any] = {"pod": pod_record(pod), "namespace": None, "metering": None}
    problem = None
    if explanation["pod"]["governed"]:
        try:
            explanation["namespace"] = api.call("GET", f"budgets/{namespace}")
            uid = explanation["pod"]["uid"]
            metered = api.call("GET", "pods", query={"namespace": namespace, "limit": str(MAX_PODS)})["items"]
            explanation["metering"] = next((p for p in metered if p.get("podUid") == uid), None)
        except _Refused as exc:
            problem = exc
    _emit(args, explanation, lambda wide: format_explanation(explanation))
    if problem is not None:
        raise problem


_explain = _command(_explain_pod, cluster_needed=True)


def pod_record(pod: dict[str, Any]) -> dict[str, Any]:
    """What governs a pod, from the API server's copy: the webhook's record, the priority it got, its meter."""
    metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    record = {k[len(ANNOTATION_PREFIX):]: v for k, v in (metadata.get("annotations") or {}).items() if k.startswith(ANNOTATION_PREFIX)}
    meters = [("native sidecar", c) for c in spec.get("initContainers") or [] if c.get("name") == "gpusharing-meter"]
    meters += [("container", c) for c in spec.get("containers") or [] if c.get("name") == "gpusharing-meter"]
    return {
        "namespace": metadata.get("namespace"), "name": metadata.get("name"), "uid": metadata.get("uid"),
        "phase": (pod.get("status") or {}).get("phase"), "governed": bool(record), "record": record,
        "priorityClassName": spec.get("priorityClassName"), "priority": spec.get("priority"),
        "meter": meters[0][0] if meters else None,
    }


def format_explanation(explanation: dict[str, Any]) -> str:
    pod, status, metering = explanation["pod"], explanation["namespace"], explanation["metering"]
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
        allowance = "unlimited" if status.get("gpuMinutes") is None else _minutes(status["gpuMinutes"] + (status.get("topUpGpuMinutes") or 0))
        lines.append(("Namespace now", f"{status['state']}: {_minutes(status['usedGpuMinutes'])} of {allowance} GPU-minutes "
                                       f"used this {status['period']} period (ends {status.get('periodEnd') or 'never'})"))
        lines.append(("New GPU pods", _new_pods(status["state"])))
    if status is not None:
        lines.append(("Metered", "no report yet" if metering is None else
                      f"{_minutes(metering['gpuSeconds'] / 60)} GPU-minutes, last report {metering['lastReportAt']}"
                      + (" (final)" if metering.get("final") else "")))
    return _fields(lines)


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
        "unchecked": "the webhook did not know what the namespace's pods had committed: admitted by its state alone",
    }.get(verdict, "a verdict this version does not know")


def _new_pods(state: str) -> str:
    if state == "over-budget":
        return "get the over-budget class until a top-up, a raised budget or the next period"
    return "get the in-budget class unless they name their own"


def _fields(lines: list[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in lines) + 2
    return "\n".join(f"{name + ':':<{width}}{value}" for name, value in lines)


@_command
def _usage(api: _Timekeeper, args: argparse.Namespace) -> None:
    namespace = _namespace_filter(args)
    try:
        usage_request(args.start, args.end, args.by, namespace)  # refused here, before any request, when malformed
    except UsageRequestError as exc:
        raise _Refused(str(exc)) from None
    query = {"from": args.start, "to": args.end, "groupBy": args.by, **({"namespace": namespace} if namespace else {})}
    report = api.call("GET", "usage", query=query)
    if getattr(args, "output", None) == "csv":
        print(usage_csv(report["fields"], report["items"]), end="")
    else:
        _emit(args, report, lambda wide: format_usage(report))


def format_usage(report: dict[str, Any]) -> str:
    """The report's groups and a total line, in GPU-minutes."""
    fields = report["fields"]
    rows = [[*("-" if item[field] is None else str(item[field]) for field in fields), *_usage_amounts(item)]
            for item in report["items"]]
    rows.append(["TOTAL", *[""] * (len(fields) - 1), *_usage_amounts(report["total"])])
    return format_table([*(field.upper() for field in fields), "GPU-MINUTES", "BILLED GPU-MINUTES", "IDLE GPU-MINUTES"], rows)


def _usage_amounts(amounts: dict[str, Any]) -> list[str]:
    idle = amounts["idleGpuMinutes"]
    return [_minutes(amounts["gpuMinutes"]), _minutes(amounts["billedGpuMinutes"]), "-" if idle is None else _minutes(idle)]


STATUS_COLUMNS = ["NAMESPACE", "BUDGET", "USED", "REMAINING", "STATE", "PERIOD", "EVICT", "PERIOD END"]


def format_statuses(items: Sequence[dict[str, Any]], wide: bool = False) -> str:
    """One row per namespace, in GPU-minutes; the budget includes this period's top-ups (wide: shown apart too)."""
    rows = []
    for item in items:
        allowance = None if item.get("gpuMinutes") is None else item["gpuMinutes"] + (item.get("topUpGpuMinutes") or 0)
        remaining = item.get("remainingGpuMinutes")
        row = [item["namespace"], _budget(allowance), _minutes(item["usedGpuMinutes"]),
               "-" if remaining is None else _minutes(remaining), item["state"], item["period"],
               "yes" if item.get("evictOnExhaustion") else "no", item.get("periodEnd") or "never"]
        committed, uncommitted = item.get("committedGpuMinutes"), item.get("uncommitted")
        rows.append(row + ([item.get("periodStart") or "-", _minutes(item.get("topUpGpuMinutes") or 0),
                            item.get("admission") or "-", item.get("onShortfall") or "-",
                            "-" if committed is None else _minutes(committed),
                            "-" if not uncommitted else _minutes(uncommitted["gpuMinutes"])] if wide else []))
    wide_columns = ["PERIOD START", "TOP-UPS", "ADMISSION", "ON SHORTFALL", "COMMITTED", "UNCOMMITTED"]
    return format_table(STATUS_COLUMNS + (wide_columns if wide else []), rows)


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
    admission = status.get("admission") or AdmissionMode.OPEN
    safe = f", {admission} admission ({status.get('onShortfall')} on shortfall)" if admission != AdmissionMode.OPEN else ""
    return f"{_budget(status.get('gpuMinutes'))} {status.get('period')}{evict}{safe}"


def _before(change: dict[str, Any]) -> str:
    return "(default)" if change["before"] is None and change["action"] == "set" else _terms(change["before"])


def _after(change: dict[str, Any]) -> str:
    after = change["after"]
    if change["action"] == "top-up" and after is not None:
        return f"+{_minutes(after['gpuMinutes'])}: {after.get('reason', '')}"
    return "(default)" if after is None else _terms(after)
