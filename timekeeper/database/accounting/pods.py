"""The pod ledgers as stored: a row per pod (its bill, its latest readings, its idle streak), and the reads of them
that the API, the metrics and the controller make."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, or_, select, update

from gpusharing.idle.verdict import Reading, Streak
from gpusharing.units.weights import MICROS_PER_SECOND
from gpusharing.utilisation import UtilisationSource
from timekeeper.accounting.ledger import (
    PodLedger,
)
from timekeeper.budgets.periods import iso_utc
from timekeeper.database.connection import Database
from timekeeper.database.tables import pod_ledgers


@dataclass(frozen=True)
class PodRecord:
    pod_uid: str
    namespace: str
    pod: str
    billed_share: float
    micro_gpu_seconds: int  # charged: the larger of observed and metered
    metered_micro_gpu_seconds: int
    observed_micro_gpu_seconds: int
    observed_until: dt.datetime | None
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    meter_silent_since: dt.datetime | None
    last_seq: int
    final: bool
    first_report_at: dt.datetime | None
    last_report_at: dt.datetime | None
    gpu_memory_used_mib: float | None
    gpu_memory_requested_mib: float | None
    gpu_utilization_percent: float | None
    idle_since: dt.datetime | None = None
    idle_warned_at: dt.datetime | None = None
    idle_acted_at: dt.datetime | None = None
    utilisation_source: str | None = None
    utilisation_at: dt.datetime | None = None
    utilisation_fresh_until: dt.datetime | None = None
    model: str | None = None  # the GPU model it is billed on
    meter_model: str | None = None  # the model its meter last named
    device_model: str | None = None  # the model of the GPUs it was given, as its node agent last read them
    node: str | None = None  # the node it was bound to

    @property
    def streak(self) -> Streak:
        return Streak(self.idle_since, self.idle_warned_at, self.idle_acted_at)

    @property
    def reading(self) -> Reading:
        """Its latest word on the GPU's utilisation: the node's (or Prometheus's) where fresh, else its meter's."""
        return ledger_reading(self.gpu_utilization_percent, self.utilisation_source, self.utilisation_at,
                              self.utilisation_fresh_until)

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
            "gpuModel": self.model,
            "meterGpuModel": self.meter_model,
            "deviceGpuModel": self.device_model,
            "node": self.node,
            "gpuSeconds": self.micro_gpu_seconds / MICROS_PER_SECOND,
            "observedGpuSeconds": self.observed_micro_gpu_seconds / MICROS_PER_SECOND,
            "meteredGpuSeconds": self.metered_micro_gpu_seconds / MICROS_PER_SECOND,
            "startedAt": _instant(self.started_at),
            "endedAt": _instant(self.ended_at),
            "meterSilentSince": _instant(self.meter_silent_since),
            "seq": self.last_seq,
            "final": self.final,
            "firstReportAt": _instant(self.first_report_at),
            "lastReportAt": _instant(self.last_report_at),
            "gpuMemoryUsedMiB": self.gpu_memory_used_mib,
            "gpuMemoryRequestedMiB": self.gpu_memory_requested_mib,
            "gpuUtilizationPercent": self.gpu_utilization_percent,
            "gpuMemoryOverRequestMiB": self.memory_over_request_mib,
            "idleSince": _instant(self.idle_since),
            "idleWarnedAt": _instant(self.idle_warned_at),
            "idleActedAt": _instant(self.idle_acted_at),
            "utilisationSource": self.utilisation_source,
            "utilisationAt": _instant(self.utilisation_at),
            "utilisationFreshUntil": _instant(self.utilisation_fresh_until),
        }


def ledger_reading(utilisation: float | None, source: str | None, at: dt.datetime | None,
                   fresh_until: dt.datetime | None) -> Reading:
    """A ledger row's reading (a row from before sources were kept, or never read, is its meter's)."""
    return Reading(utilisation, at, UtilisationSource(source or UtilisationSource.METER), fresh_until)


def _instant(at: dt.datetime | None) -> str | None:
    return None if at is None else iso_utc(at)


# The ledger's columns: its accounting (PodLedger), a report's readings, and what each write sets.
_LEDGER_COLUMNS = ("micro_gpu_seconds", "metered_micro_gpu_seconds", "observed_micro_gpu_seconds", "last_seq", "final",
                   "started_at", "observed_until", "ended_at", "billed_share", "model", "node")
_UTILISATION_COLUMNS = ("gpu_utilization_percent", "gpu_memory_used_mib", "utilisation_source", "utilisation_at",
                        "utilisation_fresh_until")
_READING_COLUMNS = (*_UTILISATION_COLUMNS, "gpu_memory_requested_mib", "last_report_at", "meter_model")
STREAK_COLUMNS = ("idle_since", "idle_warned_at", "idle_acted_at")
_ADVANCING_COLUMNS = ("pod", *_LEDGER_COLUMNS, *_READING_COLUMNS, "meter_silent_since", *STREAK_COLUMNS)
_OBSERVING_COLUMNS = ("pod", *_LEDGER_COLUMNS)
_OPENING_COLUMNS = ("pod_uid", "namespace", "pod", *_LEDGER_COLUMNS, *_READING_COLUMNS, "first_report_at")
LOCKED_COLUMNS = ("pod_uid", "namespace", *_LEDGER_COLUMNS, *_UTILISATION_COLUMNS, *STREAK_COLUMNS, "device_model")
UTILISATION_COLUMNS = (*_UTILISATION_COLUMNS, *STREAK_COLUMNS)  # what a reading from any source moves


def reading_columns(reading: Reading, memory_used_mib: float | None) -> dict[str, Any]:
    """A reading as its pod's ledger keeps it."""
    return {"gpu_utilization_percent": reading.utilisation, "gpu_memory_used_mib": memory_used_mib,
            "utilisation_source": None if reading.reported_at is None else reading.source.value,
            "utilisation_at": reading.reported_at, "utilisation_fresh_until": reading.fresh_until}


def streak_columns(streak: Streak) -> dict[str, Any]:
    return {"idle_since": streak.since, "idle_warned_at": streak.warned_at, "idle_acted_at": streak.acted_at}


def _ledger_columns(ledger: PodLedger) -> dict[str, Any]:
    return {
        "micro_gpu_seconds": ledger.billed,
        "metered_micro_gpu_seconds": ledger.metered,
        "observed_micro_gpu_seconds": ledger.observed,
        "last_seq": ledger.last_seq,
        "final": ledger.final,
        "started_at": ledger.started_at,
        "observed_until": ledger.observed_until,
        "ended_at": ledger.ended_at,
        "billed_share": ledger.share or 0.0,
        "model": ledger.model,
        "node": ledger.node,
    }


class PodLedgers:
    """Reads of the pod ledgers; `stale_seconds`: a pod not heard from this long no longer counts as running."""

    def __init__(self, db: Database, clock: Callable[[], dt.datetime], stale_seconds: float):
        self.db = db
        self.clock = clock
        self.stale_seconds = stale_seconds

    def _running(self) -> Any:
        """Pods not ended whose record or meter was heard from lately."""
        fresh_since = self.clock() - dt.timedelta(seconds=self.stale_seconds)
        return (pod_ledgers.c.ended_at.is_(None), pod_ledgers.c.final.is_(False),
                or_(pod_ledgers.c.last_report_at >= fresh_since, pod_ledgers.c.observed_until >= fresh_since))

    def top_pods(self, limit: int) -> list[PodRecord]:
        """The running pods that were billed the most GPU time."""
        query = (select(pod_ledgers).where(*self._running())
                 .order_by(pod_ledgers.c.micro_gpu_seconds.desc(), pod_ledgers.c.pod_uid).limit(limit))
        with self.db.read() as conn:
            return [PodRecord(**row._mapping) for row in conn.execute(query)]

    def silent_meters(self, silent_seconds: float, gone_seconds: float) -> int:
        """Pods whose meter went quiet: flagged silent by the controller and not ended, or (off a cluster, where only
        meters tell) not final and last heard from between `gone_seconds` and `silent_seconds` ago."""
        now = self.clock()
        query = select(func.count()).select_from(pod_ledgers).where(
            pod_ledgers.c.ended_at.is_(None),
            pod_ledgers.c.final.is_(False),
            or_(pod_ledgers.c.meter_silent_since.is_not(None), and_(
                pod_ledgers.c.last_report_at < now - dt.timedelta(seconds=silent_seconds),
                pod_ledgers.c.last_report_at >= now - dt.timedelta(seconds=gone_seconds),
            )),
        )
        with self.db.read() as conn:
            return int(conn.execute(query).scalar_one())

    def model_disagreements(self) -> int:
        """Pods not ended whose meter, or node agent, last named a GPU model other than the one they are billed on."""
        model = pod_ledgers.c.model
        query = select(func.count()).select_from(pod_ledgers).where(
            pod_ledgers.c.ended_at.is_(None), pod_ledgers.c.final.is_(False), model.is_not(None),
            or_(and_(pod_ledgers.c.meter_model.is_not(None), pod_ledgers.c.meter_model != model),
                and_(pod_ledgers.c.device_model.is_not(None), pod_ledgers.c.device_model != model)))
        with self.db.read() as conn:
            return int(conn.execute(query).scalar_one())

    def open_observed(self) -> list[tuple[str, str, str]]:
        """(uid, namespace, pod) of every pod the watch observed whose bill is not closed."""
        query = select(pod_ledgers.c.pod_uid, pod_ledgers.c.namespace, pod_ledgers.c.pod).where(
            pod_ledgers.c.ended_at.is_(None), pod_ledgers.c.observed_until.is_not(None))
        with self.db.read() as conn:
            return [(row.pod_uid, row.namespace, row.pod) for row in conn.execute(query)]

    def claim_silent(self, pod_uids: Sequence[str], quiet_since: dt.datetime, now: dt.datetime) -> list[str]:
        """Flags, and returns, those of the pods whose meter has not reported since `quiet_since` and that were not
        flagged yet: each silence is flagged once (a report clears the flag), by one process."""
        claimed = []
        with self.db.write() as conn:
            for start in range(0, len(pod_uids), 500):
                candidates = [row.pod_uid for row in conn.execute(
                    select(pod_ledgers.c.pod_uid).where(
                        pod_ledgers.c.pod_uid.in_(pod_uids[start:start + 500]), *self._silent(quiet_since)))]
                for uid in candidates:
                    flagged = conn.execute(
                        update(pod_ledgers)
                        .where(pod_ledgers.c.pod_uid == uid, *self._silent(quiet_since))
                        .values(meter_silent_since=now)
                    )
                    if flagged.rowcount == 1:
                        claimed.append(uid)
        return claimed

    @staticmethod
    def _silent(quiet_since: dt.datetime) -> tuple[Any, ...]:
        return (pod_ledgers.c.meter_silent_since.is_(None), pod_ledgers.c.ended_at.is_(None),
                or_(pod_ledgers.c.last_report_at.is_(None), pod_ledgers.c.last_report_at < quiet_since))

    def pods(
        self, namespace: str | None = None, over_memory: bool = False, limit: int = 500, running: bool = False,
        uid: str | None = None,
    ) -> list[PodRecord]:
        """Pods from the ledger; running: only pods not ended and heard from lately; over_memory: only running pods
        whose GPU memory exceeds what they requested; uid: only the pod of that UID."""
        query = select(pod_ledgers).order_by(pod_ledgers.c.namespace, pod_ledgers.c.pod).limit(limit)
        if namespace is not None:
            query = query.where(pod_ledgers.c.namespace == namespace)
        if uid is not None:
            query = query.where(pod_ledgers.c.pod_uid == uid)
        if running or over_memory:
            query = query.where(*self._running())
        if over_memory:
            query = query.where(pod_ledgers.c.gpu_memory_used_mib > pod_ledgers.c.gpu_memory_requested_mib)
        with self.db.read() as conn:
            return [PodRecord(**row._mapping) for row in conn.execute(query)]
