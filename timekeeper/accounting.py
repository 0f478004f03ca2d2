"""Meter reports into the pod ledgers and the namespaces' daily usage, exactly once (the SQL side of timekeeper.ledger).

One report is one transaction: the pod's ledger row is locked (PostgreSQL: SELECT ... FOR UPDATE; SQLite: one
writer at a time), the report is accounted against it, and the growth is added to the namespace's usage of the
UTC day it was received on. Concurrent reports of one pod, from any worker or process, are thereby serialized, and
a report that commits has changed both the ledger and the usage, or neither.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from gpusharing.report import MeterReport, ReportError
from timekeeper.budget import BudgetStatus, crossed_into_over_budget, iso_utc, state_for, usage_day
from timekeeper.ledger import MICROS_PER_SECOND, Accounting, Outcome, PodLedger, account, billed_micro_gpu_seconds
from timekeeper.models import namespace_usage, pod_ledgers
from timekeeper.store import BudgetStore


@dataclass(frozen=True)
class ReportTerms:
    """What the webhook recorded on the reporting pod, trusted in place of what the report claims."""

    share: float
    requested_memory_mib: float | None  # None: the pod's request of GPU memory is not known


@dataclass(frozen=True)
class ReportResult:
    outcome: Outcome
    charged_micro_gpu_seconds: int
    status: BudgetStatus  # the namespace's, after the report
    crossed: bool  # this report put the namespace over budget

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.status.namespace,
            "state": str(self.status.state),
            "outcome": str(self.outcome),
            "chargedGpuSeconds": self.charged_micro_gpu_seconds / MICROS_PER_SECOND,
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


class ReportLedger:
    def __init__(self, budgets: BudgetStore, stale_seconds: float = 900.0):
        self.budgets = budgets
        self.db = budgets.db
        self.stale_seconds = stale_seconds  # a pod not heard from this long no longer counts as holding memory

    def record(self, report: MeterReport, terms: ReportTerms | None = None) -> ReportResult:
        """Accounts one report (terms None: the report's own share and request are trusted).

        Raises ReportError when it cannot be accounted; nothing is changed then.
        """
        cumulative = billed_micro_gpu_seconds(report, None if terms is None else terms.share)
        now = self.budgets.clock()
        readings = {
            "billed_share": report.gpu_share if terms is None else terms.share,
            "gpu_memory_used_mib": report.gpu_memory_used_mib,
            "gpu_utilization_percent": report.gpu_utilization_percent,
            "gpu_memory_requested_mib": report.gpu_memory_requested_mib if terms is None else terms.requested_memory_mib,
        }
        with self.db.write() as conn:
            accounting = self._account(conn, report, cumulative, readings, now)
            if accounting.charge_micro_gpu_seconds:
                self._charge(conn, report.namespace, usage_day(now), accounting.charge_micro_gpu_seconds)
            status = self.budgets.status_in(conn, report.namespace, now)
        before = state_for(status.allowance_gpu_minutes, status.used_micro_gpu_seconds - accounting.charge_micro_gpu_seconds)
        return ReportResult(
            accounting.outcome,
            accounting.charge_micro_gpu_seconds,
            status,
            crossed_into_over_budget(before, status.state),
        )

    def _account(
        self, conn: Connection, report: MeterReport, cumulative: int, readings: dict[str, Any], now: dt.datetime
    ) -> Accounting:
        ledger = self._locked_ledger(conn, report)
        if ledger is None:
            inserted = conn.execute(
                self.db.insert(pod_ledgers)
                .values(
                    pod_uid=report.pod_uid,
                    namespace=report.namespace,
                    pod=report.pod,
                    micro_gpu_seconds=cumulative,
                    last_seq=report.seq,
                    final=report.final,
                    first_report_at=now,
                    last_report_at=now,
                    **readings,
                )
                .on_conflict_do_nothing()
                .returning(pod_ledgers.c.pod_uid)
            ).first()
            if inserted is not None:
                return account(None, report.seq, cumulative, report.final)
            ledger = self._locked_ledger(conn, report)  # another worker's first report of this pod won the insert
            assert ledger is not None
        accounting = account(ledger, report.seq, cumulative, report.final)
        if accounting.outcome is Outcome.CHARGED:
            conn.execute(
                pod_ledgers.update()
                .where(pod_ledgers.c.pod_uid == report.pod_uid)
                .values(
                    micro_gpu_seconds=accounting.ledger.micro_gpu_seconds,
                    last_seq=accounting.ledger.last_seq,
                    final=accounting.ledger.final,
                    last_report_at=now,
                    **readings,
                )
            )
        return accounting

    def _locked_ledger(self, conn: Connection, report: MeterReport) -> PodLedger | None:
        query = select(
            pod_ledgers.c.namespace, pod_ledgers.c.last_seq, pod_ledgers.c.micro_gpu_seconds, pod_ledgers.c.final
        ).where(pod_ledgers.c.pod_uid == report.pod_uid)
        row = conn.execute(query if self.db.is_sqlite else query.with_for_update()).first()
        if row is None:
            return None
        if row.namespace != report.namespace:
            raise ReportError(f"pod {report.pod_uid} reports in namespace {row.namespace}, not {report.namespace}")
        return PodLedger(row.last_seq, row.micro_gpu_seconds, row.final)

    def _charge(self, conn: Connection, namespace: str, day: dt.date, micro: int) -> None:
        conn.execute(
            self.db.insert(namespace_usage)
            .values(namespace=namespace, day=day, micro_gpu_seconds=micro)
            .on_conflict_do_update(
                index_elements=[namespace_usage.c.namespace, namespace_usage.c.day],
                set_={"micro_gpu_seconds": namespace_usage.c.micro_gpu_seconds + micro},
            )
        )

    def pods(self, namespace: str | None = None, over_memory: bool = False, limit: int = 500) -> list[PodRecord]:
        """Pods from the ledger; over_memory: only running pods whose GPU memory exceeds what they requested."""
        query = select(pod_ledgers).order_by(pod_ledgers.c.namespace, pod_ledgers.c.pod).limit(limit)
        if namespace is not None:
            query = query.where(pod_ledgers.c.namespace == namespace)
        if over_memory:
            fresh_since = self.budgets.clock() - dt.timedelta(seconds=self.stale_seconds)
            query = query.where(
                pod_ledgers.c.gpu_memory_used_mib > pod_ledgers.c.gpu_memory_requested_mib,
                pod_ledgers.c.final.is_(False),
                pod_ledgers.c.last_report_at >= fresh_since,
            )
        with self.db.read() as conn:
            return [PodRecord(**row._mapping) for row in conn.execute(query)]
