"""The `budgets` and `statuses` tasks of the controller's leader: GPUBudgets into the ledger, crossings' Events and
evictions, the resources' status.

States are computed from the ledger on every read, so the webhook sees a crossing as soon as its report commits; what
goes to the Kubernetes API is done here, off the request path. Each run looks at the whole picture again, so a refused
eviction is retried on the next run and a leader that dies leaves nothing the next cannot finish. See
docs/budgets.md, "States and demotion".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpusharing.contract import BudgetState
from gpusharing.names import is_group
from timekeeper import metrics
from timekeeper.budgets.hierarchy import hierarchy_problem
from timekeeper.budgets.requests import BudgetRequestError
from timekeeper.budgets.status import Budget, BudgetStatus
from timekeeper.cluster.demotion import eviction_candidates, threshold_event, transition_event
from timekeeper.cluster.events import Event, EventQueue
from timekeeper.cluster.evictions import EvictionPath, PodRef
from timekeeper.cluster.idling import IdlePass, budget_idle
from timekeeper.cluster.informers import ClusterInformers, GovernedPod
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.objects import KubeUnavailable
from timekeeper.cluster.resources import (
    Problem,
    budget_from_resource,
    budget_name,
    event_target,
    owner,
    resource_status,
    status_differs,
)
from timekeeper.database.budgets.store import BudgetStore, HierarchyConflict, NoBudget

log = logging.getLogger(__name__)


@dataclass
class BudgetPass:
    """What one run of the `budgets` task did."""

    events: list[tuple[str, str]] = field(default_factory=list)  # (budget name, reason)
    evicted: list[str] = field(default_factory=list)  # namespace/pod
    refused: list[str] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)  # budgets written from resources
    removed: list[str] = field(default_factory=list)  # budgets whose resource is gone
    waiting: list[str] = field(default_factory=list)  # namespaces whose evictions wait for the webhooks
    problems: dict[str, Problem] = field(default_factory=dict)  # why a resource's budget is not (wholly) in the ledger


class BudgetSync:
    """The `budgets` and `statuses` tasks, on the shared caches."""

    def __init__(self, budgets: BudgetStore, kube: KubeApi, informers: ClusterInformers, evictions: EvictionPath,
                 events: EventQueue, idle: Callable[[], IdlePass | None] = lambda: None,
                 fair_share: Callable[[], Mapping[str, Mapping[str, Any]]] = dict):
        self.budgets = budgets
        self.kube = kube
        self.informers = informers
        self.evictions = evictions
        self.events = events
        self.idle = idle  # the idle task's last pass, for the statuses' idle figures
        self.fair_share = fair_share  # the fairshare task's last figures by budget name (none when fair share is off)
        self.webhooks = evictions.webhooks
        # namespaces to evict: when this process saw them over (the database's time)
        self._over_since: dict[str, float] = {}
        self.last: BudgetPass | None = None

    def sync(self) -> BudgetPass:
        """The `budgets` task. LeaseLost when the Lease is lost on the way."""
        done = BudgetPass()
        done.problems = self._apply_resources(done)
        self.last = done
        acted = self.budgets.acted_states()
        statuses = {s.namespace: s for s in self.budgets.statuses()}
        for name in acted.keys() - statuses.keys():  # no longer listed: no budget and no use this period
            try:
                statuses[name] = self.budgets.status(name)
            except NoBudget:  # a group whose budget is gone
                continue
        targets = self._resources_by_budget()
        evicting = {s.namespace for s in statuses.values()
                    if s.kind == "namespace" and s.state is BudgetState.OVER_BUDGET and s.evict_on_exhaustion}
        self._over_since = {name: self._over_since.get(name) or self.webhooks.now() for name in evicting}
        running = self._running_by_namespace(evicting)
        for status in statuses.values():
            self.evictions.keep_lease()
            self._record_transition(status, acted.get(status.namespace, BudgetState.UNKNOWN), targets, done)
            self._warn(status, targets, done)
        self._evict(running, done)
        return done

    def write_statuses(self) -> list[str]:
        """The `statuses` task: each resource's status where it differs; the budgets written. A resource whose spec
        the `budgets` task has not written into the ledger yet keeps its status until it has: its observedGeneration
        is never stamped on figures of the spec before."""
        # read before the statuses: a budget applied in between shows in both or neither
        ledger = self.budgets.budgets()
        statuses = {s.namespace: s for s in self.budgets.statuses()}
        problems = self.last.problems if self.last is not None else {}
        idle = budget_idle(statuses, self.idle())
        fair_share = self.fair_share()
        now = self.budgets.clock()
        children: dict[str, list[str]] = {}
        for status in statuses.values():
            if status.parent:
                children.setdefault(status.parent, []).append(status.namespace)
        written = []
        for resource, obj in self.informers.budget_resources():
            name = budget_name(obj)
            if name not in problems and (name not in statuses or not _applied(obj, ledger.get(name))):
                continue  # not applied yet: the `budgets` task's next run does
            wanted = resource_status(obj, statuses.get(name), problems.get(name), sorted(children.get(name, [])), now,
                                     idle.get(name), fair_share.get(name))
            if not status_differs(obj.get("status"), wanted):
                continue
            metadata = obj["metadata"]
            gone = {key: None for key in obj.get("status") or {} if key not in wanted}  # a merge patch removes by null
            try:
                self.kube.patch_custom_status(resource, metadata.get("namespace"), metadata["name"], {**wanted, **gone})
            except KubeUnavailable as exc:
                log.warning("%s; will try again", exc)
                continue
            written.append(name)
        return written

    def _running_by_namespace(self, namespaces: set[str]) -> dict[str, list[GovernedPod]]:
        if not namespaces:
            return {}
        by_namespace: dict[str, list[GovernedPod]] = {}
        for pod in list((self.informers.pods.items or {}).values()):
            if pod.record.namespace in namespaces:
                by_namespace.setdefault(pod.record.namespace, []).append(pod)
        return by_namespace

    # -- resources into the ledger ----------------------------------------------------------------------------------

    def _resources_by_budget(self) -> dict[str, dict[str, Any]]:
        return {budget_name(obj): obj for _, obj in self.informers.budget_resources()}

    def _apply_resources(self, done: BudgetPass) -> dict[str, Problem]:
        """Writes each resource's budget into the ledger where it differs; removes the budgets of resources that are
        gone (only once the list that would show them has succeeded). The problems, by budget name."""
        problems: dict[str, Problem] = {}
        ledger, managed = self.budgets.budgets(), self.budgets.managed()
        wanted = {}
        for obj in self._resources_by_budget().values():
            try:
                wanted[budget_name(obj)] = (budget_from_resource(obj), owner(obj))
            except BudgetRequestError as exc:
                problems[budget_name(obj)] = Problem("InvalidSpec", str(exc))
        desired = {name: budget for name, (budget, _) in wanted.items()}
        # Groups first, so that their children find them.
        for name, (budget, by) in sorted(wanted.items(), key=lambda item: (not is_group(item[0]), item[0])):
            if ledger.get(name) == budget and managed.get(name) == by:
                continue
            try:
                self.budgets.set_budget(budget, actor=by, owner=by)
                done.applied.append(name)
            except HierarchyConflict as exc:
                problems[name] = Problem("HierarchyConflict", str(exc))
                continue
            ledger[name] = budget
        for name, budget in desired.items():
            if name not in problems and budget.parent is not None and budget.parent not in ledger:
                problems[name] = Problem(
                    "ParentNotFound",
                    f"the parent {budget.parent} has no budget (no ClusterGPUBudget "
                    "or REST budget of that name): only this budget limits it",
                )
            elif name not in problems and (problem := hierarchy_problem(ledger, name, budget.parent, False)):
                problems[name] = Problem("HierarchyConflict", problem)
        synced = {resource.namespaced: watched.synced for resource, watched in self.informers.budgets.items()}
        for name, by in managed.items():
            if name in wanted or not synced[by.startswith("GPUBudget ")]:
                continue
            try:
                self.budgets.remove_budget(name, actor=by, owner=by)
                done.removed.append(name)
                log.info(
                    "%s: its budget was removed with its resource (%s)",
                    name,
                    by,
                    extra={"namespace": name, "actor": by},
                )
            except NoBudget:
                pass
        return problems

    # -- Events and evictions ------------------------------------------------------------------------------------

    def _record_transition(self, status: BudgetStatus, previous: BudgetState, targets: dict[str, dict[str, Any]],
                           done: BudgetPass) -> None:
        if previous is status.state:
            return
        # Claimed before the Event is sent, so that two leaders never both send it; given back when it cannot be
        # sent, so that the next pass tries again.
        claimed = self.budgets.claim_transition(status.namespace, status.state)
        if claimed is None:
            return
        fields = {"namespace": status.namespace, "state": str(status.state), "previous_state": str(claimed)}
        event = transition_event(status, claimed)
        if event is not None:
            given_back = claimed
            if self._send(status.namespace, event, targets,
                          lambda: self.budgets.release_transition(status.namespace, status.state, given_back)):
                done.events.append((status.namespace, event[0]))
                fields["event"] = event[0]
        log.info(
            "%s: %s -> %s%s", status.namespace, claimed, status.state, f" ({event[1]})" if event else "", extra=fields
        )

    def _warn(self, status: BudgetStatus, targets: dict[str, dict[str, Any]], done: BudgetPass) -> None:
        """Warns once per period of the highest warning threshold the budget's own use newly reached. Thresholds
        passed on the way to exhaustion are recorded without a warning: the exhaustion's Event says more."""
        crossed = status.crossed_thresholds
        if not crossed:
            return
        new = self.budgets.claim_warnings(status.namespace, status.window.start, crossed)
        if not new or status.own_state is BudgetState.OVER_BUDGET:
            return
        event = threshold_event(status)
        self._send(status.namespace, event, targets,
                   lambda: self.budgets.release_warnings(status.namespace, status.window.start, new))
        metrics.WARNINGS.labels(str(max(new))).inc()
        done.events.append((status.namespace, event[0]))
        log.info("%s", event[1], extra={"namespace": status.namespace, "state": str(status.state), "event": event[0]})

    def _send(self, name: str, event: tuple[str, str, bool], targets: dict[str, dict[str, Any]],
              on_failure: Callable[[], None] | None = None) -> bool:
        """Queues the Event on the namespace (not for a group) and on the resource that holds the budget, if any;
        False when there is nothing to record it on (a group without a resource). `on_failure`: when the first
        cannot be sent."""
        reason, message, warning = event
        queued = []
        if not is_group(name):
            queued.append(Event(reason, message, warning, namespace=name))
        if name in targets:
            queued.append(Event(reason, message, warning, about=event_target(targets[name])))
        for index, each in enumerate(queued):
            self.events.put(each if index else replace(each, on_failure=on_failure))
        return bool(queued)

    def _evict(self, running: dict[str, list[GovernedPod]], done: BudgetPass) -> None:
        """Evicts the candidates of every namespace to evict whose over-budget state every webhook holds, in one call
        of the eviction path: its requests in flight at once, whatever namespace they are of, so that one
        namespace's PodDisruptionBudget holds no other namespace's evictions back."""
        candidates: list[PodRef] = []
        acknowledged = 0.0
        for namespace, since in sorted(self._over_since.items()):
            behind = self.webhooks.behind(since)
            if behind:
                done.waiting.append(namespace)
                log.info("%s: evictions wait for %d webhook process(es) to hold its over-budget state", namespace,
                         behind, extra={"namespace": namespace})
                continue
            candidates += [
                PodRef(namespace, pod.record.name, pod.record.uid, pod.record.owner.uid if pod.record.owner else "")
                for pod in eviction_candidates(running.get(namespace, []))
            ]
            acknowledged = max(acknowledged, since)
        if not candidates:
            return
        result = self.evictions.evict("its namespace is over its GPU budget", candidates, acknowledged)
        if result.waiting:  # a webhook process started meanwhile, with an older listing: the next run tries again
            done.waiting += sorted({pod.namespace for pod in candidates})
        done.evicted += [str(pod) for pod in result.evicted]
        done.refused += [str(pod) for pod in result.refused]


def _applied(obj: Mapping[str, Any], budget: Budget | None) -> bool:
    """Whether the ledger holds the budget the resource's spec asks for."""
    try:
        return budget == budget_from_resource(obj)
    except BudgetRequestError:
        return True  # no budget to wait for: the status says what is wrong with the spec
