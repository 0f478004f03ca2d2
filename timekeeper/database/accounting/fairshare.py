"""The SQL side of fair share (docs/fair-share.md): each namespace's decayed usage, grown exactly once in the
transaction that charges the ledger, and the bands the `fairshare` task ranked, for the listing and `explain`.

Rows are locked after everything else a charging transaction locks, in namespace order; the `fairshare` task locks
only these rows, in the same order: no deadlock.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, select

from gpusharing.listing import FairShareLevel, FairShareStanding
from gpusharing.units.weights import MICROS_PER_SECOND
from timekeeper.accounting.ledger import Accounting
from timekeeper.budgets.periods import iso_utc
from timekeeper.database.connection import Database, Statements
from timekeeper.database.tables import fair_share
from timekeeper.fairshare.bands import FairShareBands, admission_band
from timekeeper.fairshare.decay import DecayedUsage


@dataclass(frozen=True)
class Charge:
    """One interval of a namespace's charge: weighted GPU-seconds billed at a constant rate over [start, end]."""

    namespace: str
    gpu_seconds: float
    start: dt.datetime
    end: dt.datetime


def charged_interval(namespace: str, accounting: Accounting, weighted: int, now: dt.datetime, observed: bool) -> Charge:
    """The time a charge was billed over, for its decay: what the record proves ends where it was observed to (a
    meter's report, when it came), and began as long before as the pod's share takes to make the raw charge."""
    ledger = accounting.ledger
    end = (ledger.ended_at or ledger.observed_until or now) if observed else now
    seconds = accounting.charge_micro_gpu_seconds / MICROS_PER_SECOND / ledger.share if ledger.share else 0.0
    return Charge(namespace, weighted / MICROS_PER_SECOND, end - dt.timedelta(seconds=seconds), end)


@dataclass(frozen=True)
class FairShareRecord:
    """A namespace's row: its decayed usage and, once ranked, its band and where it stood."""

    namespace: str
    usage: DecayedUsage
    half_life_seconds: float | None
    band: int | None = None
    band_since: dt.datetime | None = None
    reason: str | None = None
    ratio: float | None = None
    rank: int | None = None
    share_gpus: float | None = None
    held_gpus: float | None = None
    path: str | None = None
    band_changes_at: dt.datetime | None = None
    ranked_at: dt.datetime | None = None


@dataclass(frozen=True)
class Ranked:
    """What the `fairshare` task writes of a namespace it ranked."""

    namespace: str
    band: int
    band_since: dt.datetime
    reason: str
    ratio: float
    rank: int
    share_gpus: float
    held_gpus: float
    half_life_seconds: float | None
    path: str  # JSON: its LevelStandings, level 1 first
    band_changes_at: dt.datetime | None


_RANKED = ("band", "band_since", "reason", "ratio", "rank", "share_gpus", "held_gpus", "half_life_seconds", "path",
           "band_changes_at", "ranked_at")


class FairShareLedger:
    def __init__(self, db: Database, half_life: dt.timedelta):
        self.db = db
        self.half_life = half_life  # the default; a row's own (its budget's spec.fairShare.halfLife) wins
        lock = (
            select(fair_share.c.namespace, fair_share.c.gpu_seconds, fair_share.c.as_of, fair_share.c.half_life_seconds)
            .where(fair_share.c.namespace.in_(bindparam("namespaces", expanding=True)))
            .order_by(fair_share.c.namespace)
        )
        self._lock = lock if db.is_sqlite else lock.with_for_update()
        self._open = db.bulk_insert(
            fair_share, ["namespace", "gpu_seconds", "as_of"], lambda insert: insert.on_conflict_do_nothing()
        )
        self._grow = db.bulk_update(fair_share, "namespace", ["gpu_seconds", "as_of"])
        self._rank = db.bulk_update(fair_share, "namespace", list(_RANKED))

    def grow(self, conn: Statements, charges: Sequence[Charge]) -> None:
        """Adds the charges to their namespaces' decayed usage, in the caller's transaction (the ledger's charge)."""
        charged = [charge for charge in charges if charge.gpu_seconds > 0]
        if not charged:
            return
        namespaces = sorted({charge.namespace for charge in charged})
        earliest = {ns: min(c.start for c in charged if c.namespace == ns) for ns in namespaces}
        self._open.execute(conn, [{"namespace": ns, "gpu_seconds": 0.0, "as_of": earliest[ns]} for ns in namespaces])
        rows = {row.namespace: row for row in conn.execute(self._lock, {"namespaces": namespaces})}
        usage = {ns: DecayedUsage(row.gpu_seconds, row.as_of) for ns, row in rows.items()}
        for charge in charged:
            usage[charge.namespace] = usage[charge.namespace].plus(
                charge.gpu_seconds, charge.start, charge.end, self._half_life(rows[charge.namespace].half_life_seconds))
        self._grow.execute(conn, [{"namespace": ns, "gpu_seconds": usage[ns].gpu_seconds, "as_of": usage[ns].as_of}
                                  for ns in namespaces])

    def _half_life(self, seconds: float | None) -> dt.timedelta:
        return self.half_life if seconds is None else dt.timedelta(seconds=seconds)

    def half_life_of(self, record: FairShareRecord) -> dt.timedelta:
        return self._half_life(record.half_life_seconds)

    def records(self, namespaces: Collection[str] | None = None) -> dict[str, FairShareRecord]:
        """Every namespace's row (or those named)."""
        query = select(fair_share)
        if namespaces is not None:
            query = query.where(fair_share.c.namespace.in_(sorted(namespaces)))
        with self.db.read() as conn:
            return {row.namespace: _record(row) for row in conn.execute(query)}

    def rank(self, ranked: Sequence[Ranked], now: dt.datetime) -> None:
        """Writes the bands the `fairshare` task ranked; a namespace without a row (no usage yet) gets one."""
        if not ranked:
            return
        rows = sorted(ranked, key=lambda r: r.namespace)
        with self.db.write() as conn:
            self._open.execute(conn, [{"namespace": r.namespace, "gpu_seconds": 0.0, "as_of": now} for r in rows])
            self._rank.execute(conn, [{**_ranked_columns(r), "ranked_at": now} for r in rows])


def listed_band(
    bands: FairShareBands, record: FairShareRecord, half_life: dt.timedelta, detail: bool = False,
) -> FairShareStanding | None:
    """A ranked namespace's fair share as the listing shows it (None: not ranked, or its band no longer configured):
    its band's class, the class a pod admitted above its fair share gets (the burst guard), and where it stood;
    `detail` (one budget read, for `gpusharing explain`): its path down the tree and when its band would rise at
    zero use."""
    if record.band is None or not 0 <= record.band < len(bands.classes) or record.share_gpus is None:
        return None
    decayed = record.usage.at(record.ranked_at or record.usage.as_of, half_life)
    return FairShareStanding(
        band=bands.classes[record.band],
        burst_class=bands.classes[admission_band(bands, record.band, 1.0, 0.0)],
        share_gpus=round(record.share_gpus, 4),
        held_gpus=round(record.held_gpus or 0.0, 4),
        ratio=None if record.ratio is None else round(record.ratio, 4),
        rank=record.rank,
        reason=record.reason,
        since=None if record.band_since is None else iso_utc(record.band_since),
        usage_gpu_seconds=round(decayed.gpu_seconds, 3),
        as_of=iso_utc(decayed.as_of),
        half_life_seconds=half_life.total_seconds(),
        held_as_of=None if record.ranked_at is None else record.ranked_at.timestamp(),
        path=_path(record.path) if detail else None,
        zero_use_change=None if not detail or record.band_changes_at is None else iso_utc(record.band_changes_at),
    )


def _path(stored: str | None) -> tuple[FairShareLevel, ...]:
    """The path the `fairshare` task wrote (its JSON, level 1 first), read through the listing's contract."""
    levels = (FairShareLevel.read(level) for level in json.loads(stored or "[]"))
    return tuple(level for level in levels if level is not None)


def _ranked_columns(ranked: Ranked) -> dict[str, Any]:
    return {column: getattr(ranked, column) for column in _RANKED if column != "ranked_at"} | {
        "namespace": ranked.namespace
    }


def _record(row: Any) -> FairShareRecord:
    values: Mapping[str, Any] = row._mapping
    return FairShareRecord(values["namespace"], DecayedUsage(values["gpu_seconds"], values["as_of"]),
                           values["half_life_seconds"], **{c: values[c] for c in _RANKED if c != "half_life_seconds"})
