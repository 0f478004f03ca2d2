"""GPUBudget and ClusterGPUBudget resources: what their specs mean for the ledger, what their status says, and the
list+watch that keeps them in memory. The mapping is plain functions over the objects' JSON.

A GPUBudget (namespaced, one per namespace, named `budget`: the CRD's CEL rule) holds its namespace's budget; a
ClusterGPUBudget holds a group's (a team, a department), named as the group (`team.vision`). Their spec is what
`PUT /api/v1/budgets/{name}` takes. The database stays the source of truth for use.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import watch

from gpusharing.contract import BudgetState, Period
from gpusharing.kube.watching import WATCH_SECONDS, backoff_seconds
from gpusharing.names import InvalidName, check_budget_name, is_group
from timekeeper.budgets.periods import iso_utc
from timekeeper.budgets.requests import BUDGET_FIELDS, BudgetRequestError, budget_from_json
from timekeeper.budgets.status import Budget, BudgetStatus
from timekeeper.cluster.kube import CustomResource, KubeApi, KubeUnavailable, ObjectRef

log = logging.getLogger(__name__)

GROUP, VERSION = "gpusharing.io", "v1alpha1"
GPU_BUDGETS = CustomResource(GROUP, VERSION, "gpubudgets", namespaced=True)
CLUSTER_GPU_BUDGETS = CustomResource(GROUP, VERSION, "clustergpubudgets", namespaced=False)
KINDS = {GPU_BUDGETS: "GPUBudget", CLUSTER_GPU_BUDGETS: "ClusterGPUBudget"}
GPU_BUDGET_NAME = "budget"  # the one GPUBudget a namespace may have (CEL in the CRD)


def owner(obj: Mapping[str, Any]) -> str:
    """How the ledger names the resource that owns a budget: `GPUBudget ns/budget`, `ClusterGPUBudget team.vision`."""
    metadata = obj["metadata"]
    if metadata.get("namespace"):
        return f"GPUBudget {metadata['namespace']}/{metadata['name']}"
    return f"ClusterGPUBudget {metadata['name']}"


def budget_name(obj: Mapping[str, Any]) -> str:
    """The ledger's name of the budget the resource holds: its namespace, or (cluster-scoped) its own name."""
    metadata = obj["metadata"]
    return str(metadata.get("namespace") or metadata["name"])


def budget_from_resource(obj: Mapping[str, Any]) -> Budget:
    """The budget the resource's spec asks for; BudgetRequestError saying why when it cannot be one (the API server's
    schema and CEL rules refuse such specs, unless the CRD installed is not ours)."""
    metadata, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    name = budget_name(obj)
    try:
        check_budget_name(name)
    except InvalidName as exc:
        raise BudgetRequestError(str(exc)) from None
    if metadata.get("namespace") and metadata.get("name") != GPU_BUDGET_NAME:
        raise BudgetRequestError(f"a namespace's GPUBudget is named {GPU_BUDGET_NAME!r}")
    if not metadata.get("namespace") and not is_group(name):
        raise BudgetRequestError(f"a ClusterGPUBudget is named as its group, with a dot (e.g. team.vision), not {name!r}")
    if not isinstance(spec, dict):
        raise BudgetRequestError("spec must be an object")
    unlimited = spec.get("unlimited") is True
    if unlimited == ("gpuMinutes" in spec):
        raise BudgetRequestError("set either spec.gpuMinutes or spec.unlimited: true")
    body = {key: spec[key] for key in BUDGET_FIELDS if key in spec}
    body["gpuMinutes"] = None if unlimited else spec["gpuMinutes"]
    return budget_from_json(name, body, Period.MONTHLY)


def event_target(obj: Mapping[str, Any]) -> ObjectRef:
    metadata = obj["metadata"]
    kind = "GPUBudget" if metadata.get("namespace") else "ClusterGPUBudget"
    return ObjectRef(f"{GROUP}/{VERSION}", kind, metadata["name"], metadata.get("uid", ""), metadata.get("namespace"))


@dataclass(frozen=True)
class Problem:
    """Why a resource's budget is not (or not wholly) in the ledger: a Ready condition's reason and message."""

    reason: str
    message: str


def resource_status(
    obj: Mapping[str, Any],
    status: BudgetStatus | None,
    problem: Problem | None,
    children: list[str],
    now: dt.datetime,
) -> dict[str, Any]:
    """The status subresource: the budget in its current period, and conditions Ready, Exhausted and Warning, each
    keeping its lastTransitionTime while its status stays."""
    generation = (obj.get("metadata") or {}).get("generation")
    result: dict[str, Any] = {"observedGeneration": generation}
    if status is not None:
        allowance, remaining, percent = status.allowance_gpu_minutes, status.remaining_gpu_minutes, status.percent_used
        result.update({
            "budgetGpuMinutes": None if allowance is None else round(allowance, 2),
            "topUpGpuMinutes": round(status.top_up_gpu_minutes, 2),
            "usedGpuMinutes": round(status.used_gpu_minutes, 2),
            "remainingGpuMinutes": None if remaining is None else round(remaining, 2),
            "percentUsed": None if percent is None else round(percent, 1),
            "periodStart": iso_utc(status.window.start),
            "periodEnd": iso_utc(status.window.end) if status.window.end else None,
            "state": str(status.state),
            "ownState": str(status.own_state),
            "limitedBy": status.limited_by,
            "ancestors": [ancestor.namespace for ancestor in status.ancestors],
        })
        if is_group(status.namespace):
            result["children"] = children
    state = status.state if status is not None else BudgetState.UNKNOWN
    limited_elsewhere = status is not None and status.limited_by not in (None, status.namespace)
    wanted = [
        ("Ready", problem is None, problem.reason if problem else "Reconciled",
         problem.message if problem else "the budget is in the timekeeper's ledger"),
        ("Exhausted", state is BudgetState.OVER_BUDGET,
         ("AncestorExhausted" if limited_elsewhere else "BudgetExhausted") if state is BudgetState.OVER_BUDGET else "WithinBudget",
         _state_message(status)),
        ("Warning", state is BudgetState.WARNING,
         ("AncestorThresholdReached" if limited_elsewhere else "ThresholdReached") if state is BudgetState.WARNING else "BelowThresholds",
         _state_message(status)),
    ]
    previous = {c.get("type"): c for c in ((obj.get("status") or {}).get("conditions") or []) if isinstance(c, dict)}
    conditions = []
    for kind, true, reason, message in wanted:
        value = "True" if true else "False"
        before = previous.get(kind) or {}
        since = before.get("lastTransitionTime") if before.get("status") == value else None
        conditions.append({"type": kind, "status": value, "reason": reason, "message": message,
                           "observedGeneration": generation, "lastTransitionTime": since or iso_utc(now)})
    result["conditions"] = conditions
    return {key: value for key, value in result.items() if value is not None}


def _state_message(status: BudgetStatus | None) -> str:
    if status is None:
        return "not in the ledger"
    if status.state is BudgetState.UNLIMITED:
        return "no limit here or above"
    limiting = next(s for s in (status, *status.ancestors) if s.namespace == status.limited_by)
    percent = limiting.percent_used or 0.0
    return (f"{limiting.namespace} has used {limiting.used_gpu_minutes:.1f} of {limiting.allowance_gpu_minutes:g} "
            f"GPU-minutes ({percent:.0f} %) in its {limiting.period} period")


def status_differs(current: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    """Whether writing `wanted` would change what the object shows."""
    return dict(current or {}) != dict(wanted)


class ResourceWatch:
    """The objects of one custom resource, kept by list+watch in a thread; `wake` is called on every change.

    `objects` is only trusted once `synced` (a list succeeded since the last start): the controller removes budgets
    whose resource is gone only then. When the API does not serve the resource (no CRD), `served` is False and
    the list is tried again after a while.
    """

    def __init__(self, kube: KubeApi, resource: CustomResource, wake: Callable[[], None], retry_seconds: float = 10.0):
        self.kube = kube
        self.resource = resource
        self.wake = wake
        self.retry_seconds = retry_seconds
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.synced = False
        self.served = True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: watch.Watch | None = None

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"watch-{self.resource.plural}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.synced = False
        if self._watch is not None:
            self._watch.stop()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self._list()
                if version is not None and self._follow(version):
                    failures = 0  # the watch delivered: recovered
                    continue
            except Exception as exc:  # the API server went away, a watch expired (410): list again
                log.info("watch of %s ended (%s); listing again", self.resource.plural, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            failures += 1
            self._stop.wait(self.retry_seconds if not self.served else backoff_seconds(failures))

    def _list(self) -> str | None:
        try:
            listing = self.kube.list_custom(self.resource)
        except KubeUnavailable as exc:
            log.warning("%s; will try again", exc)
            self.synced = False
            return None
        if listing is None:
            if self.served:
                log.info("the API serves no %s (its CRD is not installed): budgets come from the REST API only",
                         self.resource.plural)
            self.served = self.synced = False
            return None
        self.served = True
        self.objects = {_key(obj): obj for obj in listing.get("items") or []}
        self.synced = True
        self.wake()
        return str((listing.get("metadata") or {}).get("resourceVersion") or "")

    def _follow(self, version: str) -> bool:
        """Applies the watch's events until it ends; whether it delivered any."""
        self._watch = watch.Watch()
        stream = self._watch.stream(
            self.kube.custom.list_cluster_custom_object, self.resource.group, self.resource.version,
            self.resource.plural, resource_version=version, timeout_seconds=WATCH_SECONDS, allow_watch_bookmarks=True,
            _request_timeout=WATCH_SECONDS + 30,
        )
        delivered = False
        for event in stream:
            if self._stop.is_set():
                return delivered
            kind, obj = event.get("type"), event.get("object")
            if kind == "ERROR" or not isinstance(obj, dict):
                return delivered  # e.g. 410 Gone: the version is too old, list again
            delivered = True
            if kind == "BOOKMARK":
                continue
            if kind == "DELETED":
                self.objects.pop(_key(obj), None)
            else:
                self.objects[_key(obj)] = obj
            self.wake()
        return delivered


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
