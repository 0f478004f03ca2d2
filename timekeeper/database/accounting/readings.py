"""Utilisation readings from the node agents and from Prometheus into the pod ledgers, one transaction per batch (the
SQL side of gpusharing.utilisation).

A reading charges nothing: it replaces the pod's latest reading, which moves its idle streak and, while fresh, sets
the idle part of every charge. It is ignored, with the reason, where no ledger takes it or a fresher reading of a
higher rank stands (docs/operations.md, "GPU utilisation: the node's word over the meter's").
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import bindparam, select

from gpusharing.contract import fresh_for
from gpusharing.gpu.catalogue import GpuCatalogue
from gpusharing.idle.verdict import Reading, Streak
from gpusharing.utilisation import PodUtilisation, UtilisationSource
from timekeeper.database.accounting.charging import ReportLedger
from timekeeper.database.accounting.pods import (
    LOCKED_COLUMNS,
    UTILISATION_COLUMNS,
    ledger_reading,
    reading_columns,
    streak_columns,
)
from timekeeper.database.connection import Database
from timekeeper.database.tables import pod_ledgers


@dataclass(frozen=True)
class Ignored:
    pod_uid: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"podUid": self.pod_uid, "reason": self.reason}


@dataclass(frozen=True)
class RecordedReadings:
    """What a batch did: how many readings took their pod's place, and those ignored, each with its reason."""

    accepted: int
    ignored: tuple[Ignored, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "ignored": [ignored.to_json() for ignored in self.ignored]}


class UtilisationLedger:
    """Records utilisation readings against the pods' ledgers; `thresholds` gives a namespace's idle threshold (the
    ReportLedger's, so that one policy read serves both)."""

    def __init__(self, db: Database, thresholds: Callable[[str], float], catalogue: GpuCatalogue):
        self.db = db
        self.thresholds = thresholds
        self.catalogue = catalogue
        lock = (select(*(pod_ledgers.c[column] for column in LOCKED_COLUMNS))
                .where(pod_ledgers.c.pod_uid.in_(bindparam("uids", expanding=True))).order_by(pod_ledgers.c.pod_uid))
        self._lock = lock if db.is_sqlite else lock.with_for_update()
        self._write = db.bulk_update(pod_ledgers, "pod_uid", (*UTILISATION_COLUMNS, "device_model"))

    @classmethod
    def of(cls, ledger: ReportLedger) -> "UtilisationLedger":
        return cls(ledger.db, ledger.idle_threshold, ledger.catalogue)

    def record_utilisation(self, source: UtilisationSource, readings: Sequence[PodUtilisation], window_seconds: float,
                           at: dt.datetime) -> RecordedReadings:
        """Records readings from `source` spanning `window_seconds` up to `at` (the ledger's clock), in one
        transaction; each pod at most once (the last of a pod's readings counts)."""
        by_uid = {reading.pod_uid: reading for reading in readings}
        if not by_uid:
            return RecordedReadings(0)
        fresh_until = at + dt.timedelta(seconds=fresh_for(window_seconds))
        # Read before the transaction, so that nothing waits on it while the ledgers are locked.
        thresholds = {ns: self.thresholds(ns) for ns in {reading.namespace for reading in by_uid.values()}}
        ignored: list[Ignored] = []
        written: list[dict[str, Any]] = []
        with self.db.write() as conn:
            rows = {row.pod_uid: row for row in conn.execute(self._lock, {"uids": sorted(by_uid)})}
            for uid in sorted(by_uid):
                reading, row = by_uid[uid], rows.get(uid)
                reason = _ignored_because(reading, row, source, at)
                if reason is not None:
                    ignored.append(Ignored(uid, reason))
                    continue
                assert row is not None
                current = ledger_reading(row.gpu_utilization_percent, row.utilisation_source, row.utilisation_at,
                                         row.utilisation_fresh_until)
                streak = current.next_streak(Streak(row.idle_since, row.idle_warned_at, row.idle_acted_at), source,
                                             reading.utilisation_percent, thresholds[reading.namespace], at,
                                             fresh_for(window_seconds))
                taken = Reading(reading.utilisation_percent, at, source, fresh_until)
                written.append({"pod_uid": uid, **reading_columns(taken, reading.memory_used_mib),
                                **streak_columns(streak), "device_model": self._model(reading) or row.device_model})
            if written:
                self._write.execute(conn, written)
        order = {uid: index for index, uid in enumerate(by_uid)}
        return RecordedReadings(len(written), tuple(sorted(ignored, key=lambda ignore: order[ignore.pod_uid])))

    def _model(self, reading: PodUtilisation) -> str | None:
        """The model a node agent read, as the catalogue names it (as said, where the catalogue lacks it): evidence,
        compared with the model the pod is billed on, never billed."""
        if reading.gpu_model is None:
            return None
        model = self.catalogue.by_name(reading.gpu_model)
        return model.name if model is not None else reading.gpu_model


def bound_to_node(readings: Sequence[PodUtilisation], bound: Mapping[str, tuple[str, str]] | None,
                  node: str) -> tuple[list[PodUtilisation], list[Ignored]]:
    """The readings of pods bound to `node` (`bound`: (namespace, name) by uid; None: any, off a cluster), and the
    others, ignored with the reason: a node agent speaks for its own node's pods only."""
    kept: list[PodUtilisation] = []
    ignored: list[Ignored] = []
    for reading in readings:
        pod = None if bound is None else bound.get(reading.pod_uid)
        if bound is not None and pod is None:
            ignored.append(
                Ignored(reading.pod_uid, f"no pod of this uid is bound to node {node} (another node's, or unknown)")
            )
        elif pod is not None and pod != (reading.namespace, reading.pod):
            ignored.append(Ignored(reading.pod_uid, f"the pod of this uid on node {node} is {pod[0]}/{pod[1]}, not "
                                                    f"{reading.namespace}/{reading.pod}"))
        else:
            kept.append(reading)
    return kept, ignored


def _ignored_because(reading: PodUtilisation, row: Any, source: UtilisationSource, at: dt.datetime) -> str | None:
    """Why the reading does not take its pod's place (None: it does)."""
    if row is None:
        return "unknown pod: the timekeeper bills no pod of this uid (yet)"
    if row.namespace != reading.namespace:
        return f"the pod of this uid is billed in namespace {row.namespace}, not {reading.namespace}"
    if row.ended_at is not None or row.final:
        return "the pod's bill is closed"
    current = ledger_reading(row.gpu_utilization_percent, row.utilisation_source, row.utilisation_at,
                             row.utilisation_fresh_until)
    if current.outranks(source, at):
        return f"a fresh reading of a higher rank ({current.source}) stands"
    return None
