"""Meter reports into the pod ledgers and the namespaces' daily usage, exactly once (the SQL side of timekeeper.accounting.ledger).

Reports arriving together are accounted together, in one transaction (ReportQueue): the pods' ledger rows are
locked (PostgreSQL: SELECT ... FOR UPDATE, in pod uid order; SQLite: one writer at a time), each report is
accounted against its pod's ledger in the order received, and the growth is added to the namespaces' usage of
the UTC day it was received on. Concurrent reports of one pod, from any worker or process, are thereby
serialized, and a report that commits has changed both its ledger and the usage, or neither. Rows are always
locked in the same order (ledgers by uid, then usage by namespace, then pods' daily usage by uid), so concurrent
transactions cannot deadlock.

The pod ledgers count raw GPU-seconds (share × time: what exactly-once is about); each charge is weighted by the
billing weight of the GPU model it is billed as when it is made, and the namespaces' usage, which budgets count,
grows by the weighted charge. Both are kept per pod, day and model for usage reports (timekeeper.accounting.usage).
"""

from __future__ import annotations

import datetime as dt
import queue
import threading
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, select

from gpusharing.gpu.catalogue import GpuCatalogue, shipped_catalogue
from gpusharing.report import MeterReport, ReportError
from timekeeper.accounting.ledger import (
    MICROS_PER_SECOND,
    NEW_POD,
    Accounting,
    Outcome,
    PodLedger,
    account,
    billed_micro_gpu_seconds,
)
from timekeeper.accounting.usage import NO_CHARGE, Labels, PodCharge, UsageLedger, pod_charge
from timekeeper.accounting.weights import WeightLog, billing_model
from timekeeper.budgets.periods import iso_utc, usage_day
from timekeeper.budgets.status import BudgetStatus, crossed
from timekeeper.budgets.store import BudgetStore
from timekeeper.database.connection import Statements
from timekeeper.database.tables import namespace_usage, pod_ledgers


@dataclass(frozen=True)
class ReportTerms:
    """What the webhook recorded on the reporting pod, trusted in place of what the report claims."""

    share: float
    requested_memory_mib: float | None  # None: the pod's request of GPU memory is not known
    labels: Labels = ()  # the pod's, as usage reports may group by them
    model: str | None = None  # the GPU model the webhook recorded on the pod


@dataclass(frozen=True)
class ReportResult:
    outcome: Outcome
    charged_micro_gpu_seconds: int  # raw
    billed_micro_gpu_seconds: int  # weighted: what the budget counted
    status: BudgetStatus  # the namespace's, after the report
    crossed: bool  # this report moved the namespace's state, or past a warning threshold

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.status.namespace,
            "state": str(self.status.state),
            "outcome": str(self.outcome),
            "chargedGpuSeconds": self.charged_micro_gpu_seconds / MICROS_PER_SECOND,
            "billedGpuSeconds": self.billed_micro_gpu_seconds / MICROS_PER_SECOND,
        }


@dataclass(frozen=True)
class PodRecord:
    pod_uid: str
    namespace: str
    pod: str
    billed_share: float
    micro_gpu_seconds: int
    last_seq: int
    final: bool
    first_report_at: dt.datetime
    last_report_at: dt.datetime
    gpu_memory_used_mib: float | None
    gpu_memory_requested_mib: float | None
    gpu_utilization_percent: float | None

    @property
    def memory_over_request_mib(self) -> float | None:
        if self.gpu_memory_used_mib is None or self.gpu_memory_requested_mib is None:
            return None
        return max(0.0, self.gpu_memory_used_mib - self.gpu_memory_requested_mib)

    def to_json(self) -> dict[str, Any]:
        return {
            "podUid": self.pod_uid,
            "namespace": self.namespace,
            "pod": self.pod,
            "gpuShare": self.billed_share,
            "gpuSeconds": self.micro_gpu_seconds / MICROS_PER_SECOND,
            "seq": self.last_seq,
            "final": self.final,
            "firstReportAt": iso_utc(self.first_report_at),
            "lastReportAt": iso_utc(self.last_report_at),
            "gpuMemoryUsedMiB": self.gpu_memory_used_mib,
            "gpuMemoryRequestedMiB": self.gpu_memory_requested_mib,
            "gpuUtilizationPercent": self.gpu_utilization_percent,
            "gpuMemoryOverRequestMiB": self.memory_over_request_mib,
        }


@dataclass(frozen=True)
class _Accepted:
    """A report that passed the checks made before the transaction."""

    index: int  # its place in the batch
    report: MeterReport
    cumulative: int  # billed, micro-GPU-seconds
    readings: dict[str, Any]
    labels: Labels
    model: str | None  # recorded by the webhook


class ReportLedger:
    def __init__(
        self, budgets: BudgetStore, stale_seconds: float = 900.0,
        catalogue: GpuCatalogue | None = None, catalogue_source: str = "the shipped catalogue",
    ):
        self.budgets = budgets
        self.db = budgets.db
        self.catalogue = catalogue or shipped_catalogue()
        self.catalogue_source = catalogue_source
        self.weights = WeightLog(self.db)
        self._weights_recorded = False
        self.stale_seconds = stale_seconds  # a pod not heard from this long no longer counts as running
        self.usage = UsageLedger(self.db)
        # Built once: constructing statements per report would cost more than running them.
        lock = (
            select(pod_ledgers.c.pod_uid, pod_ledgers.c.namespace, pod_ledgers.c.last_seq,
                   pod_ledgers.c.micro_gpu_seconds, pod_ledgers.c.final)
            .where(pod_ledgers.c.pod_uid.in_(bindparam("uids", expanding=True)))
            .order_by(pod_ledgers.c.pod_uid)
        )
        self._lock = lock if self.db.is_sqlite else lock.with_for_update()
        self._open = self.db.bulk_insert(pod_ledgers, _OPENING_COLUMNS, lambda insert: insert.on_conflict_do_nothing())
        self._advance = self.db.bulk_update(pod_ledgers, "pod_uid", _ADVANCING_COLUMNS)
        self._charge = self.db.bulk_insert(
            namespace_usage,
            ["namespace", "day", "micro_gpu_seconds"],
            lambda insert: insert.on_conflict_do_update(
                index_elements=[namespace_usage.c.namespace, namespace_usage.c.day],
                set_={"micro_gpu_seconds": namespace_usage.c.micro_gpu_seconds + insert.excluded.micro_gpu_seconds},
            ),
        )

    def record(self, reports: Sequence[tuple[MeterReport, ReportTerms | None]]) -> list[ReportResult | ReportError]:
        """Accounts reports, in order, in one transaction (terms None: the report's own share and request are trusted).

        Each report gets its result, or the ReportError that refused it (a refused report changes nothing).
        """
        now = self.budgets.clock()
        if not self._weights_recorded:  # before anything is billed at them; a failure fails the batch, as the database's
            self.weights.record(self.catalogue, now, self.catalogue_source)
            self._weights_recorded = True
        results: dict[int, ReportResult | ReportError] = {}
        accepted: list[_Accepted] = []
        for index, (report, terms) in enumerate(reports):
            try:
                cumulative = billed_micro_gpu_seconds(report, None if terms is None else terms.share)
            except ReportError as refused:
                results[index] = refused
                continue
            labels, model = ((), None) if terms is None else (terms.labels, terms.model)
            accepted.append(_Accepted(index, report, cumulative, _readings(report, terms, now), labels, model))
        if accepted:
            results.update(self._account(accepted, now))
        return [results[index] for index in range(len(reports))]

    def _account(self, accepted: list[_Accepted], now: dt.datetime) -> dict[int, ReportResult | ReportError]:
        """One transaction in two round trips on PostgreSQL: the ledgers are read and locked, then all is written."""
        results: dict[int, ReportResult | ReportError] = {}
        accounted: dict[int, tuple[str, Accounting]] = {}
        advanced: dict[str, dict[str, Any]] = {}
        charges: dict[str, int] = defaultdict(int)
        pod_charges: dict[tuple[str, str], PodCharge] = defaultdict(lambda: NO_CHARGE)
        billed: dict[int, int] = {}
        with self.db.pipeline() as conn:
            # The budgets travel with the lock; they are needed after the charges.
            budget_rows = self.budgets.budget_rows(conn, {item.report.namespace for item in accepted})
            ledgers = self._lock_ledgers(conn, accepted, now)
            for item in accepted:
                report = item.report
                namespace, ledger = ledgers[report.pod_uid]
                if namespace != report.namespace:
                    results[item.index] = ReportError(
                        f"pod {report.pod_uid} reports in namespace {namespace}, not {report.namespace}"
                    )
                    continue
                accounting = account(ledger, report.seq, item.cumulative, report.final)
                ledgers[report.pod_uid] = (namespace, accounting.ledger)
                accounted[item.index] = (namespace, accounting)
                model = billing_model(self.catalogue, report.gpu_model, item.model)
                charge = pod_charge(accounting.charge_micro_gpu_seconds, model.billing_weight, report.gpu_utilization_percent)
                pod_charges[report.pod_uid, model.name] += charge
                charges[namespace] += charge.weighted_micro_gpu_seconds
                billed[item.index] = charge.weighted_micro_gpu_seconds
                if accounting.outcome is Outcome.CHARGED:
                    advanced[report.pod_uid] = {
                        "pod_uid": report.pod_uid,
                        "pod": report.pod,
                        "micro_gpu_seconds": accounting.ledger.micro_gpu_seconds,
                        "last_seq": accounting.ledger.last_seq,
                        "final": accounting.ledger.final,
                        **item.readings,
                    }
            if advanced:
                self._advance.execute(conn, [advanced[uid] for uid in sorted(advanced)])
            day = usage_day(now)
            charged = [{"namespace": ns, "day": day, "micro_gpu_seconds": charges[ns]} for ns in sorted(charges) if charges[ns]]
            if charged:
                self._charge.execute(conn, charged)
            self.usage.charge(conn, day, pod_charges)
            # Read after the charges, in the same transaction; sent with them and the commit.
            reads = self.budgets.read_use(conn, budget_rows, charges.keys(), now) if charges else None
        statuses = reads.statuses() if reads else {}
        earlier = reads.statuses(minus=charges) if reads else {}
        for index, (namespace, accounting) in accounted.items():
            status = statuses[namespace]
            results[index] = ReportResult(
                accounting.outcome,
                accounting.charge_micro_gpu_seconds,
                billed[index],
                status,
                crossed(earlier[namespace], status),
            )
        return results

    def _lock_ledgers(
        self, conn: Statements, accepted: list[_Accepted], now: dt.datetime
    ) -> dict[str, tuple[str, PodLedger]]:
        """uid -> (namespace, ledger) of every reporting pod, locked; pods reporting for the first time get one."""
        uids = sorted({item.report.pod_uid for item in accepted})
        rows = {row.pod_uid: row for row in conn.execute(self._lock, {"uids": uids})}
        new = {}
        labels: dict[str, Labels] = {}
        for item in accepted:
            report = item.report
            if report.pod_uid not in rows and report.pod_uid not in new:
                new[report.pod_uid] = {
                    "pod_uid": report.pod_uid,
                    "namespace": report.namespace,
                    "pod": report.pod,
                    "micro_gpu_seconds": NEW_POD.micro_gpu_seconds,
                    "last_seq": NEW_POD.last_seq,
                    "final": NEW_POD.final,
                    "first_report_at": now,
                    **item.readings,
                }
                labels[report.pod_uid] = item.labels
        if new:
            # Another transaction may open the same pod at once: one insert wins, and both lock the winner's row.
            self._open.execute(conn, [new[uid] for uid in sorted(new)])
            self.usage.label(conn, labels)
            rows.update((row.pod_uid, row) for row in conn.execute(self._lock, {"uids": sorted(new)}))
        return {uid: (row.namespace, PodLedger(row.last_seq, row.micro_gpu_seconds, row.final)) for uid, row in rows.items()}

    def top_pods(self, limit: int) -> list[PodRecord]:
        """The running pods (not final, heard from recently) that were billed the most GPU time."""
        fresh_since = self.budgets.clock() - dt.timedelta(seconds=self.stale_seconds)
        query = (select(pod_ledgers).where(pod_ledgers.c.final.is_(False), pod_ledgers.c.last_report_at >= fresh_since)
                 .order_by(pod_ledgers.c.micro_gpu_seconds.desc(), pod_ledgers.c.pod_uid).limit(limit))
        with self.db.read() as conn:
            return [PodRecord(**row._mapping) for row in conn.execute(query)]

    def silent_meters(self, silent_seconds: float, gone_seconds: float) -> int:
        """Pods whose meter went quiet: not final, last heard from between `gone_seconds` and `silent_seconds` ago."""
        now = self.budgets.clock()
        query = select(func.count()).select_from(pod_ledgers).where(
            pod_ledgers.c.final.is_(False),
            pod_ledgers.c.last_report_at < now - dt.timedelta(seconds=silent_seconds),
            pod_ledgers.c.last_report_at >= now - dt.timedelta(seconds=gone_seconds),
        )
        with self.db.read() as conn:
            return int(conn.execute(query).scalar_one())

    def pods(
        self, namespace: str | None = None, over_memory: bool = False, limit: int = 500, running: bool = False
    ) -> list[PodRecord]:
        """Pods from the ledger; running: only pods not ended and heard from lately; over_memory: only running pods
        whose GPU memory exceeds what they requested."""
        query = select(pod_ledgers).order_by(pod_ledgers.c.namespace, pod_ledgers.c.pod).limit(limit)
        if namespace is not None:
            query = query.where(pod_ledgers.c.namespace == namespace)
        if running or over_memory:
            fresh_since = self.budgets.clock() - dt.timedelta(seconds=self.stale_seconds)
            query = query.where(pod_ledgers.c.final.is_(False), pod_ledgers.c.last_report_at >= fresh_since)
        if over_memory:
            query = query.where(pod_ledgers.c.gpu_memory_used_mib > pod_ledgers.c.gpu_memory_requested_mib)
        with self.db.read() as conn:
            return [PodRecord(**row._mapping) for row in conn.execute(query)]


# The ledger's columns written from a report (see _readings), when it advances and when it opens.
_READING_COLUMNS = ("billed_share", "gpu_memory_used_mib", "gpu_utilization_percent", "gpu_memory_requested_mib", "last_report_at")
_ADVANCING_COLUMNS = ("pod", "micro_gpu_seconds", "last_seq", "final", *_READING_COLUMNS)
_OPENING_COLUMNS = ("pod_uid", "namespace", *_ADVANCING_COLUMNS, "first_report_at")


def _readings(report: MeterReport, terms: ReportTerms | None, now: dt.datetime) -> dict[str, Any]:
    """What a charged report leaves in its pod's ledger besides the accounting: the share billed, NVML readings."""
    return {
        "billed_share": report.gpu_share if terms is None else terms.share,
        "gpu_memory_used_mib": report.gpu_memory_used_mib,
        "gpu_utilization_percent": report.gpu_utilization_percent,
        "gpu_memory_requested_mib": report.gpu_memory_requested_mib if terms is None else terms.requested_memory_mib,
        "last_report_at": now,
    }


class ReportQueue:
    """Hands the reports of concurrent requests to one thread, which accounts them together in one transaction.

    Under load, reports that arrive while a transaction runs are accounted in the next one: a transaction's fixed
    cost (round trips, commit) is shared by many reports. Alone, a report is accounted at once.
    """

    def __init__(self, ledger: ReportLedger, max_batch: int = 256, timeout_seconds: float = 30.0):
        self.ledger = ledger
        self.max_batch = max_batch
        self.timeout = timeout_seconds
        self._queue: queue.SimpleQueue[tuple[MeterReport, ReportTerms | None, Future[ReportResult]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="report-ledger", daemon=True)
        self._thread.start()

    def submit(self, report: MeterReport, terms: ReportTerms | None) -> ReportResult:
        """The report's result once its transaction committed; raises ReportError, or what the database raised."""
        outcome: Future[ReportResult] = Future()
        self._queue.put((report, terms, outcome))
        return outcome.result(self.timeout)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def account(self, reports: list[tuple[MeterReport, ReportTerms | None]]) -> list[ReportResult | BaseException]:
        """Accounts reports together; when their transaction fails, each report's failure is its own."""
        try:
            return list(self.ledger.record(reports))
        except Exception as failed:  # the transaction failed and accounted nothing
            if len(reports) == 1:
                return [failed]
        # Again one by one, so that whatever made it fail fails its own report only.
        return [self.account([report])[0] for report in reports]

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # close after this batch
                    break
                batch.append(item)
            results = self.account([(r, t) for r, t, _ in batch])
            for (_, _, outcome), result in zip(batch, results):
                if isinstance(result, BaseException):
                    outcome.set_exception(result)
                else:
                    outcome.set_result(result)
