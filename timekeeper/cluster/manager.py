"""The controller (`gpusharing timekeeper controller`), built as kube-controller-manager builds its controllers:
shared informer caches, named tasks on one scheduler (gpusharing.scheduling), one Clock, a Lease, one fenced eviction
path and one queue of Events. Every replica keeps the caches warm; only the Lease's holder runs the leader's tasks.
A new concern is one more task here:

| task | every TIMEKEEPER_*_INTERVAL_SECONDS | what it does |
| --- | --- | --- |
| lease | a fifth of the Lease, 2 s at most | takes or renews the Lease; a new holder records its term for the fence |
| budgets | DEMOTION, and on a GPUBudget change | resources into the ledger, crossings' Events and evictions |
| statuses | STATUS | GPUBudget and ClusterGPUBudget status |
| bills | BILLING | every running pod's bill grows from the record |
| ended | ENDED | ended pods' bills close, their finalizers come off |
| idle | IDLE | idle policies: warnings, holds, demotions and evictions |
| silent-meters | SILENT_METERS | a MeterSilent Event on each pod whose meter went quiet |
| commitments | COMMITMENTS | safe admission's committed pods published for the web replicas |
| utilisation | UTILISATION, if TIMEKEEPER_UTILISATION_SOURCE=prometheus | pods' GPU utilisation from DCGM's series |
| events | 5 s, and when an Event is queued | sends the queued Events |
| fairshare | FAIRSHARE, if TIMEKEEPER_FAIRSHARE_ENABLED | bands ranked from decayed usage, written |
| fairshare-queue | FAIRSHARE_QUEUE | the queue released in fair-share order, room made (off: all released) |
| capacity | CAPACITY | each GPU node's time since the last pass recorded in the capacity ledger |
| statements | STATEMENTS, if TIMEKEEPER_STATEMENT_KEY_FILE | closed billing periods stated and signed |
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from gpusharing.clock import Clock
from gpusharing.contract import fresh_for
from gpusharing.scheduling import Task, TaskScheduler
from gpusharing.statements.statement import origin_of
from timekeeper import metrics
from timekeeper.accounting.record import RecordedPod
from timekeeper.budgets.commitments import CommittedPod, on_node
from timekeeper.cluster.billing import Biller, BillingPass
from timekeeper.cluster.budgetsync import BudgetPass, BudgetSync
from timekeeper.cluster.capacity import CapacityTask
from timekeeper.cluster.events import EventQueue
from timekeeper.cluster.evictions import EvictionPath, LeaseLost
from timekeeper.cluster.fairshare import FairSharePass, FairShareTask, QueuePass, release_everyone
from timekeeper.cluster.idling import IdlePass, Idler
from timekeeper.cluster.informers import ClusterInformers
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.leader import LEASE_NAME, LeaderElection
from timekeeper.cluster.statements import StatementsPass, StatementTask
from timekeeper.cluster.utilisation import PrometheusUtilisation, UtilisationPass, UtilisationSink
from timekeeper.config import TimekeeperConfig
from timekeeper.database.accounting.charging import ReportLedger
from timekeeper.database.accounting.readings import UtilisationLedger
from timekeeper.database.accounting.streaks import IdleLedger
from timekeeper.database.budgets.store import BudgetStore
from timekeeper.database.chargeback.capacity import CapacityLedger, CapacityPass
from timekeeper.database.chargeback.statements import StatementLog
from timekeeper.database.cluster.commitments import CommitmentPublisher, by_uid
from timekeeper.database.cluster.fencing import EvictionFence
from timekeeper.database.cluster.listings import WebhookListings

log = logging.getLogger(__name__)

LEASE_RETRY_SECONDS = 2.0  # client-go's retryPeriod: how often a follower asks for the Lease


@dataclass
class ControllerPass:
    """Every task run once (tests and `run_all`): what each did; None where it did not run or had nothing yet."""

    budgets: BudgetPass | None = None
    statuses: list[Any] | None = None
    billing: BillingPass | None = None
    ended: BillingPass | None = None
    idle: IdlePass | None = None
    silent: list[Any] | None = None
    utilisation: UtilisationPass | None = None
    fair_share: FairSharePass | None = None
    fair_share_queue: QueuePass | None = None
    capacity: CapacityPass | None = None
    statements: StatementsPass | None = None
    leading: bool = False


class ControllerManager:
    """The controller's caches, Lease, scheduler and tasks, wired; `start()` runs them, `stop()` on SIGTERM."""

    def __init__(
        self,
        config: TimekeeperConfig,
        budgets: BudgetStore,
        ledger: ReportLedger,
        idle: IdleLedger,
        capacity: CapacityLedger,
        kube: KubeApi,
        clock: Clock,
        identity: str | None = None,
        utilisation_sink: UtilisationSink | None = None,
    ):
        """`utilisation_sink`: where the `utilisation` task hands its readings (default: the pods' ledgers, as the node
        agents' go); a test's recording stand-in."""
        self.config = config
        self.clock = clock
        self.informers = ClusterInformers(kube, config.gpu_request)
        identity = identity or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        intervals = config.tasks
        lease_seconds = config.lease_seconds or max(3 * intervals.budgets, 15.0)
        self.election = LeaderElection(kube, config.lease_namespace, identity, lease_seconds, monotonic=clock.monotonic)
        self.fence = EvictionFence(budgets.db, f"{config.lease_namespace}/{LEASE_NAME}")
        self.evictions = EvictionPath(kube, self.election, self.fence, WebhookListings(budgets.db),
                                      config.eviction_concurrency, config.eviction_retry_seconds)
        self.scheduler = TaskScheduler(clock, leading=self.leading, observe=metrics.observe_task)
        self.events = EventQueue(kube, wake=lambda: self.scheduler.wake("events"))
        self.biller = Biller(ledger, kube, config.gpu_request, self.informers.pods, self.informers.claims,
                             self.informers.nodes, self.events, config.meter_interval_seconds)
        self.idler = Idler(
            idle, budgets, self.informers.pods, self.evictions, self.events, fresh_for(config.meter_interval_seconds)
        )
        self.commitments = CommitmentPublisher(budgets.db, budgets.clock, identity)
        self.capacity = CapacityTask(capacity, self.informers.nodes)
        self.fair_share = None if ledger.fair_share is None else FairShareTask(
            config.fair_share, ledger.fair_share, budgets, self.informers, self.evictions, self.events, budgets.clock,
            kube.ungate_pod)
        fair_share_statuses = self.fair_share.statuses if self.fair_share is not None else dict
        self.budget_sync = BudgetSync(
            budgets, kube, self.informers, self.evictions, self.events, lambda: self.idler.last, fair_share_statuses
        )
        self._leading = False
        now = budgets.clock
        self.utilisation: PrometheusUtilisation | None = None
        optional: list[Task] = []
        if config.prometheus is not None:
            sink = utilisation_sink or UtilisationLedger.of(ledger).record_utilisation
            utilisation = self.utilisation = PrometheusUtilisation(config.prometheus, self.informers.records, sink)
            optional.append(Task("utilisation", intervals.utilisation, lambda: utilisation.run(now())))
        chargeback = config.chargeback
        if chargeback.signing is not None:
            statements = StatementTask(StatementLog(budgets.db), chargeback.calendar, origin_of(chargeback.cluster),
                                       chargeback.signing)
            optional.append(Task("statements", intervals.statements, lambda: statements.run(now())))
        else:
            log.info("closed billing periods are not stated: TIMEKEEPER_STATEMENT_KEY_FILE is not set (docs/audit.md)")
        for task in (
            Task("lease", min(LEASE_RETRY_SECONDS, self.election.lease_seconds / 5), self._lead, leader_only=False),
            Task("budgets", intervals.budgets, self.budget_sync.sync),
            Task("statuses", intervals.statuses, self.budget_sync.write_statuses),
            Task("bills", intervals.bills, lambda: self.biller.bill_running(now())),
            Task("ended", intervals.ended, lambda: self.biller.close_ended(now())),
            Task("idle", intervals.idle, lambda: self.idler.run(now())),
            Task("silent-meters", intervals.silent_meters, lambda: self.biller.flag_silent(now())),
            Task("commitments", intervals.commitments, self._publish_commitments),
            Task("events", intervals.events, self.events.send, leader_only=False),
            *optional,
            *([Task("fairshare", intervals.fairshare, self.fair_share.run)] if self.fair_share is not None else []),
            Task("fairshare-queue", intervals.fairshare_queue, self.fair_share.run_queue if self.fair_share is not None
                 else lambda: release_everyone(list((self.informers.records() or {}).values()), kube.ungate_pod)),
            Task("capacity", intervals.capacity, lambda: self.capacity.run(now())),
        ):
            self.scheduler.add(Task(task.name, task.interval_seconds, _stops_on_lost_lease(task.name, task.run),
                                    task.leader_only))
        for watched in self.informers.budgets.values():
            watched.subscribe(on_change=lambda: self.scheduler.wake("budgets", "statuses"))

    def _publish_commitments(self) -> None:
        pods = self.informers.pods
        items = pods.items
        committed = [self._committed(pod.record, pod.commitment) for pod in list((items or {}).values())
                     if pod.commitment is not None]
        self.commitments.publish(by_uid(committed), items is not None and pods.broken_since is None)

    def _committed(self, record: RecordedPod, commitment: CommittedPod) -> CommittedPod:
        """What a pod commits: as admitted, until it is bound to a node whose GPU model costs more."""
        placed = self.biller.placement(record)
        if placed is None or placed.node is None:
            return commitment
        return on_node(commitment, placed.share, placed.model.billing_weight)

    def leading(self) -> bool:
        return self._leading and self.election.remaining_seconds() > 0

    def _lead(self) -> bool:
        was = self._leading
        self._leading = self.election.try_acquire_or_renew() and self.fence.enter(
            self.election.term, self.election.identity
        )
        metrics.LEADING.set(1 if self._leading else 0)
        self.informers.measure()  # every replica's caches, as often as the Lease is asked for
        if self._leading and not was:  # a new holder acts at once, on caches already warm
            self.scheduler.wake()
        return self._leading

    def start(self) -> None:
        self.informers.start()
        self.scheduler.start()

    def stop(self) -> None:
        """On SIGTERM: the runs under way finish (their evictions and Events recorded as done), the Lease is given
        up so that the other replica takes over at once, the caches stop."""
        self.scheduler.stop()
        self.evictions.close()
        self.events.send()
        self.election.release()
        self._leading = False
        self.informers.stop()
        if self.utilisation is not None:
            self.utilisation.close()

    @property
    def synced(self) -> bool:
        """Whether the caches have listed the cluster (readiness)."""
        return all(informer.synced for informer in (self.informers.pods, self.informers.claims, self.informers.nodes))

    def run_all(self) -> ControllerPass:
        """Every task once, now, in this thread (the lease first): what each did."""
        self.scheduler.wake()
        ran = self.scheduler.run_due()
        self.informers.measure()
        return ControllerPass(
            budgets=_as(ran.get("budgets"), BudgetPass),
            statuses=_as(ran.get("statuses"), list),
            billing=_as(ran.get("bills"), BillingPass),
            ended=_as(ran.get("ended"), BillingPass),
            idle=_as(ran.get("idle"), IdlePass),
            silent=_as(ran.get("silent-meters"), list),
            utilisation=_as(ran.get("utilisation"), UtilisationPass),
            fair_share=_as(ran.get("fairshare"), FairSharePass),
            fair_share_queue=_as(ran.get("fairshare-queue"), QueuePass),
            capacity=_as(ran.get("capacity"), CapacityPass),
            statements=_as(ran.get("statements"), StatementsPass),
            leading=self.leading(),
        )


def _stops_on_lost_lease(name: str, run: Callable[[], object]) -> Callable[[], object]:
    def task() -> object:
        try:
            return run()
        except LeaseLost as lost:
            log.warning("%s: task %s stops here, the Lease's next holder takes over", lost, name)
            return None
    return task


T = TypeVar("T")


def _as(value: object, kind: type[T]) -> T | None:
    return value if isinstance(value, kind) else None
