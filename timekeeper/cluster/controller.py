"""The timekeeper's controller: GPUBudgets into the ledger, their status back, Events and evictions on crossings.

The states need no action: they are computed from the ledger on every read, so the webhook sees a namespace over
budget as soon as the report that crossed commits. What is done here goes to the Kubernetes API, off the request
path, by one timekeeper process at a time (the leader of a coordination.k8s.io Lease, across every worker of
every replica), every TIMEKEEPER_DEMOTION_INTERVAL_SECONDS, at once when a report or a budget change crosses, and
on every change the watches of GPUBudgets and ClusterGPUBudgets see. Each pass looks at the whole picture again,
so an eviction a PodDisruptionBudget refused is retried on the next pass, and a leader that dies leaves nothing
half-done that the next cannot finish. Each Event is claimed in the database before it is sent, so that two
leaders (one whose lease lapsed under a long pass) never both send it.

A pass can outlast the Lease (hundreds of evictions): it renews the Lease as it goes, checks it before each
namespace and each eviction, and stops the moment it is lost. Each eviction is claimed in the database under the
leader's term first (timekeeper.cluster.fencing): a leader deposed while it believed it led (paused, or slowed
past its Lease) evicts nothing once its successor has recorded itself, and no pod is ever evicted twice.

A namespace's pods are evicted only once every live webhook process holds a listing read after the controller saw
the namespace over budget (timekeeper.cluster.webhooks): the replacements its ReplicaSets make at once are then
admitted with the over-budget class, never in budget to be evicted again.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from gpusharing.contract import BudgetState
from gpusharing.names import is_group
from timekeeper import metrics
from timekeeper.budgets.hierarchy import hierarchy_problem
from timekeeper.budgets.requests import BudgetRequestError
from timekeeper.budgets.status import BudgetStatus
from timekeeper.budgets.store import BudgetStore, HierarchyConflict, NoBudget
from timekeeper.cluster.demotion import eviction_candidates, threshold_event, transition_event
from timekeeper.cluster.fencing import EvictionFence
from timekeeper.cluster.kube import EvictionResult, KubeApi, KubeUnavailable
from timekeeper.cluster.leader import LEASE_NAME, LeaderElection
from timekeeper.cluster.webhooks import WebhookListings
from timekeeper.cluster.resources import (
    CLUSTER_GPU_BUDGETS,
    GPU_BUDGETS,
    Problem,
    ResourceWatch,
    budget_from_resource,
    budget_name,
    event_target,
    owner,
    resource_status,
    status_differs,
)

log = logging.getLogger(__name__)

CLAIM_BATCH = 50  # evictions claimed in one transaction


@dataclass
class ControllerPass:
    events: list[tuple[str, str]] = field(default_factory=list)  # (budget name, reason)
    evicted: list[str] = field(default_factory=list)  # namespace/pod
    refused: list[str] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)  # budgets written from resources
    removed: list[str] = field(default_factory=list)  # budgets whose resource is gone
    statuses_written: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # namespaces whose evictions wait for the webhooks
    lost: bool = False  # the Lease was lost during the pass, which stopped there


class LeaseLost(Exception):
    """The controller no longer leads: the pass stops where it is."""


class Controller:
    def __init__(
        self,
        budgets: BudgetStore,
        kube: KubeApi,
        in_budget_class: str,
        interval_seconds: float,
        lease_namespace: str,
        lease_seconds: float | None = None,
    ):
        self.budgets = budgets
        self.kube = kube
        self.in_budget_class = in_budget_class
        self.interval = interval_seconds
        identity = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.election = LeaderElection(kube, lease_namespace, identity, lease_seconds or max(3 * interval_seconds, 15.0))
        self.fence = EvictionFence(budgets.db, f"{lease_namespace}/{LEASE_NAME}")
        self.webhooks = WebhookListings(budgets.db)
        self._over_since: dict[str, float] = {}  # namespaces to evict: when this process saw them over (the database's time)
        self.watches = [ResourceWatch(kube, GPU_BUDGETS, self.wake), ResourceWatch(kube, CLUSTER_GPU_BUDGETS, self.wake)]
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._running = threading.Lock()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="controller", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for resource_watch in self.watches:
            resource_watch.stop()
        self.election.release()

    def run_once(self) -> ControllerPass | None:
        """One pass; None when another process leads."""
        with self._running:
            if not self.election.try_acquire_or_renew() or not self.fence.enter(self.election.term, self.election.identity):
                for resource_watch in self.watches:
                    resource_watch.stop()
                return None
            for resource_watch in self.watches:
                resource_watch.start()
            done = ControllerPass()
            try:
                self._pass(done)
            except LeaseLost as lost:
                done.lost = True
                log.warning("%s: the pass stops here, its leader's successor takes over", lost)
            return done

    def _pass(self, done: ControllerPass) -> None:
        problems = self._apply_resources(done)
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
        for status in statuses.values():
            self._keep_lease()
            self._record_transition(status, acted.get(status.namespace, BudgetState.UNKNOWN), targets, done)
            self._warn(status, targets, done)
            if status.namespace in evicting:
                self._evict(status.namespace, done)
        self._write_statuses(statuses, problems, done)

    def _keep_lease(self) -> None:
        if not self.election.keep():
            raise LeaseLost(f"lost the lease as {self.election.identity}")

    # -- resources into the ledger ----------------------------------------------------------------------------------

    def _resources_by_budget(self) -> dict[str, dict[str, Any]]:
        return {budget_name(obj): obj for w in self.watches for obj in list(w.objects.values())}

    def _apply_resources(self, done: ControllerPass) -> dict[str, Problem]:
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
                problems[name] = Problem("ParentNotFound", f"the parent {budget.parent} has no budget (no ClusterGPUBudget "
                                         "or REST budget of that name): only this budget limits it")
            elif name not in problems and (problem := hierarchy_problem(ledger, name, budget.parent, False)):
                problems[name] = Problem("HierarchyConflict", problem)
        synced = {w.resource.namespaced: w.synced for w in self.watches}
        for name, by in managed.items():
            if name in wanted or not synced[by.startswith("GPUBudget ")]:
                continue
            try:
                self.budgets.remove_budget(name, actor=by, owner=by)
                done.removed.append(name)
                log.info("%s: its budget was removed with its resource (%s)", name, by, extra={"namespace": name, "actor": by})
            except NoBudget:
                pass
        return problems

    def _write_statuses(self, statuses: dict[str, BudgetStatus], problems: dict[str, Problem], done: ControllerPass) -> None:
        now = dt.datetime.now(dt.timezone.utc)
        children: dict[str, list[str]] = {}
        for status in statuses.values():
            if status.parent:
                children.setdefault(status.parent, []).append(status.namespace)
        for w in self.watches:
            for obj in list(w.objects.values()):
                name = budget_name(obj)
                wanted = resource_status(obj, statuses.get(name), problems.get(name), sorted(children.get(name, [])), now)
                if not status_differs(obj.get("status"), wanted):
                    continue
                metadata = obj["metadata"]
                gone = {key: None for key in obj.get("status") or {} if key not in wanted}  # a merge patch removes by null
                try:
                    self.kube.patch_custom_status(w.resource, metadata.get("namespace"), metadata["name"], {**wanted, **gone})
                except KubeUnavailable as exc:
                    log.warning("%s; will try again", exc)
                    continue
                done.statuses_written.append(name)

    # -- Events and evictions ------------------------------------------------------------------------------------

    def _record_transition(self, status: BudgetStatus, previous: BudgetState, targets: dict[str, dict[str, Any]],
                           done: ControllerPass) -> None:
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
            try:
                recorded = self._send(status.namespace, event, targets)
            except KubeUnavailable as exc:
                self.budgets.release_transition(status.namespace, status.state, claimed)
                log.warning("%s; will try again", exc, extra=fields)
                return
            if recorded:
                metrics.EVENTS.labels(event[0]).inc()
                done.events.append((status.namespace, event[0]))
                fields["event"] = event[0]
        log.info("%s: %s -> %s%s", status.namespace, claimed, status.state, f" ({event[1]})" if event else "", extra=fields)

    def _warn(self, status: BudgetStatus, targets: dict[str, dict[str, Any]], done: ControllerPass) -> None:
        """Warns once per period of the highest warning threshold the budget's own use newly reached. Thresholds
        passed on the way to exhaustion are recorded without a warning: the exhaustion's Event says more."""
        crossed = status.crossed_thresholds
        if not crossed:
            return
        new = self.budgets.claim_warnings(status.namespace, status.window.start, crossed)
        if not new or status.own_state is BudgetState.OVER_BUDGET:
            return
        event = threshold_event(status)
        try:
            self._send(status.namespace, event, targets)
        except KubeUnavailable as exc:
            self.budgets.release_warnings(status.namespace, status.window.start, new)
            log.warning("%s; will try again", exc)
            return
        metrics.WARNINGS.labels(str(max(new))).inc()
        metrics.EVENTS.labels(event[0]).inc()
        done.events.append((status.namespace, event[0]))
        log.info("%s", event[1], extra={"namespace": status.namespace, "state": str(status.state), "event": event[0]})

    def _send(self, name: str, event: tuple[str, str, bool], targets: dict[str, dict[str, Any]]) -> bool:
        """The Event on the namespace (not for a group) and on the resource that holds the budget, if any; False
        when there was nothing to record it on (a namespace deleted meanwhile, a group without a resource)."""
        reason, message, warning = event
        recorded = False
        if not is_group(name):
            recorded = self.kube.record_event(name, reason, message, warning)
        if name in targets:
            self.kube.record_object_event(event_target(targets[name]), reason, message, warning)
            recorded = True
        return recorded

    def _evict(self, namespace: str, done: ControllerPass) -> None:
        behind = self.webhooks.behind(self._over_since[namespace])
        if behind:
            done.waiting.append(namespace)
            log.info("%s: evictions wait for %d webhook process(es) to hold its over-budget state", namespace, behind,
                     extra={"namespace": namespace})
            return
        try:
            pods = eviction_candidates(self.kube.running_pods(namespace), self.in_budget_class)
        except KubeUnavailable as exc:
            log.warning("%s; will try again", exc)
            return
        for start in range(0, len(pods), CLAIM_BATCH):
            batch = pods[start:start + CLAIM_BATCH]
            self._keep_lease()
            term = self.election.term
            claimed = self.fence.claim_many(term, [(uid, namespace, name) for name, uid in batch])
            if claimed is None:
                raise LeaseLost(f"a later leader than {self.election.identity} (term {term}) has recorded itself")
            evicted: set[str] = set()
            try:
                self._evict_claimed(namespace, [(name, uid) for name, uid in batch if uid in claimed], evicted, done)
            finally:  # what was not evicted (refused, failed, or the Lease lost) is given back
                self.fence.release(term, *(claimed - evicted))

    def _evict_claimed(self, namespace: str, pods: list[tuple[str, str]], evicted: set[str], done: ControllerPass) -> None:
        """Evicts claimed pods, the Lease checked before each; adds the uids evicted to `evicted`."""
        for name, uid in pods:
            self._keep_lease()
            remaining = self.election.remaining_seconds()
            if remaining <= 0:  # ran out between the check and now (the process was paused): not asked for
                raise LeaseLost(f"the lease of {self.election.identity} ran out unrenewed")
            try:
                result = self.kube.evict(namespace, name, uid, timeout=remaining)
            except KubeUnavailable as exc:
                log.warning("%s; will try again", exc)
                continue
            metrics.EVICTIONS.labels(result.value).inc()
            fields = {"namespace": namespace, "pod": name, "eviction": result.value}
            if result is EvictionResult.EVICTED:
                evicted.add(uid)
                done.evicted.append(f"{namespace}/{name}")
                log.info("evicted pod %s/%s: its namespace is over its GPU budget", namespace, name, extra=fields)
            elif result is EvictionResult.REFUSED:
                done.refused.append(f"{namespace}/{name}")
                log.info("eviction of %s/%s refused by a PodDisruptionBudget; will try again", namespace, name, extra=fields)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # the loop must outlive a database or API outage
                log.exception("controller pass failed; will try again")
            self._wake.wait(self.interval)
            self._wake.clear()
