"""Usage reports: what each pod was charged per UTC day, summed over any days and grouped as finance asks.

Every charge is also added to its pod's rows of the GPU model it was billed as, split by the hour its time was used in
(pod_hours, timekeeper.accounting.hours) and by the day (pod_usage): raw (share × time), weighted, and the idle part
where utilisation was read. A report sums those integer rows between two dates, grouped by namespace, day, model, pod
or a label the pod had when first read, so it is exact however grouped, and agrees with the hours to the
micro-GPU-second.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, select

from gpusharing.units.weights import MICROS_PER_GPU_MINUTE, MICROS_PER_SECOND, weighted
from gpusharing.usage_report import LABEL_PREFIX, Labels, UsageRequest, UsageRequestError
from timekeeper.accounting.hours import apportion
from timekeeper.chargeback.calendar import BillingCalendar
from timekeeper.database.connection import Database, Statements
from timekeeper.database.tables import pod_hours, pod_labels, pod_ledgers, pod_usage

MAX_ROWS = 100_000  # in one report


@dataclass(frozen=True)
class PodCharge:
    """What one pod was charged, micro-GPU-seconds: raw (share × time), weighted (what budgets count), the raw
    part with a utilisation reading, of that part what the GPU left idle, and the idle part weighted (its cost)."""

    micro_gpu_seconds: int
    weighted_micro_gpu_seconds: int
    metered_micro_gpu_seconds: int = 0
    idle_micro_gpu_seconds: int = 0
    idle_weighted_micro_gpu_seconds: int = 0

    def __add__(self, other: "PodCharge") -> "PodCharge":  # each column named: a walk of _CHARGED costs a charge more
        return PodCharge(
            self.micro_gpu_seconds + other.micro_gpu_seconds,
            self.weighted_micro_gpu_seconds + other.weighted_micro_gpu_seconds,
            self.metered_micro_gpu_seconds + other.metered_micro_gpu_seconds,
            self.idle_micro_gpu_seconds + other.idle_micro_gpu_seconds,
            self.idle_weighted_micro_gpu_seconds + other.idle_weighted_micro_gpu_seconds,
        )

    def __sub__(self, other: "PodCharge") -> "PodCharge":
        return PodCharge(
            self.micro_gpu_seconds - other.micro_gpu_seconds,
            self.weighted_micro_gpu_seconds - other.weighted_micro_gpu_seconds,
            self.metered_micro_gpu_seconds - other.metered_micro_gpu_seconds,
            self.idle_micro_gpu_seconds - other.idle_micro_gpu_seconds,
            self.idle_weighted_micro_gpu_seconds - other.idle_weighted_micro_gpu_seconds,
        )


NO_CHARGE = PodCharge(0, 0)


@dataclass(frozen=True)
class SpreadCharge:
    """One charge of a pod, and where on the clock its raw GPU time lies (timekeeper.accounting.hours.charge_hours)."""

    pod_uid: str
    model: str
    charge: PodCharge
    hours: Mapping[dt.datetime, int]  # raw micro-GPU-seconds by UTC hour, adding up to charge.micro_gpu_seconds

    def by_hour(self) -> dict[dt.datetime, PodCharge]:
        """Each of the charge's amounts split by the hours in proportion to the raw time, exactly."""
        hours = sorted(self.hours)
        if not hours:
            return {}
        if len(hours) == 1 and self.hours[hours[0]]:  # the whole charge in one hour, as apportion would split it
            return {hours[0]: self.charge}
        weights = [self.hours[hour] for hour in hours]
        columns = [apportion(getattr(self.charge, column), weights) for column in _CHARGED]
        return {hour: PodCharge(*(parts[index] for parts in columns)) for index, hour in enumerate(hours)}


def pod_charge(charge_micro: int, billing_weight: int, utilization_percent: float | None) -> PodCharge:
    """A raw charge, weighted, and its idle part: billed share × time × (1 − utilisation), in whole
    micro-GPU-seconds, raw and weighted alike. The utilisation is taken to a thousandth of a percent, so that all is
    integer arithmetic."""
    if charge_micro < 0:  # a correction takes back exactly what the same charge would have added
        return NO_CHARGE - pod_charge(-charge_micro, billing_weight, utilization_percent)
    billed = weighted(charge_micro, billing_weight)
    if utilization_percent is None:
        return PodCharge(charge_micro, billed)
    idle = 100_000 - round(utilization_percent * 1000)
    return PodCharge(charge_micro, billed, charge_micro, charge_micro * idle // 100_000, billed * idle // 100_000)


_CHARGED = ("micro_gpu_seconds", "weighted_micro_gpu_seconds", "metered_micro_gpu_seconds", "idle_micro_gpu_seconds",
            "idle_weighted_micro_gpu_seconds")


def _columns(charge: PodCharge) -> dict[str, int]:
    return {
        "micro_gpu_seconds": charge.micro_gpu_seconds,
        "weighted_micro_gpu_seconds": charge.weighted_micro_gpu_seconds,
        "metered_micro_gpu_seconds": charge.metered_micro_gpu_seconds,
        "idle_micro_gpu_seconds": charge.idle_micro_gpu_seconds,
        "idle_weighted_micro_gpu_seconds": charge.idle_weighted_micro_gpu_seconds,
    }


class UsageLedger:
    """Writes pods' daily charges and first labels, in the ledger's transaction; reads usage reports."""

    def __init__(self, db: Database, calendar: BillingCalendar):
        self.db = db
        self.calendar = calendar
        self._charge = db.bulk_insert(
            pod_usage,
            ["pod_uid", "day", "model", *_CHARGED],
            lambda insert: insert.on_conflict_do_update(
                index_elements=[pod_usage.c.pod_uid, pod_usage.c.day, pod_usage.c.model],
                set_={column: pod_usage.c[column] + insert.excluded[column] for column in _CHARGED},
            ),
        )
        self._charge_hours = db.bulk_insert(
            pod_hours,
            ["pod_uid", "hour", "model", "booked_hour", *_CHARGED],
            lambda insert: insert.on_conflict_do_update(
                index_elements=[pod_hours.c.pod_uid, pod_hours.c.hour, pod_hours.c.model, pod_hours.c.booked_hour],
                set_={column: pod_hours.c[column] + insert.excluded[column] for column in _CHARGED},
            ),
        )
        self._label = db.bulk_insert(
            pod_labels, ["pod_uid", "key", "value"], lambda insert: insert.on_conflict_do_nothing()
        )

    def charge(self, conn: Statements, charges: Sequence[SpreadCharge], now: dt.datetime) -> None:
        """Adds each charge to its pod's rows of the hours and days its time was used in, booked as the calendar
        says, in key order (the order every transaction locks in)."""
        hours: dict[tuple[str, dt.datetime, str, dt.datetime], PodCharge] = defaultdict(lambda: NO_CHARGE)
        days: dict[tuple[str, dt.date, str], PodCharge] = defaultdict(lambda: NO_CHARGE)
        for spread in charges:
            for hour, part in spread.by_hour().items():
                hours[spread.pod_uid, hour, spread.model, self.calendar.booked(hour, now)] += part
                days[spread.pod_uid, hour.date(), spread.model] += part
        hour_rows = [
            {"pod_uid": uid, "hour": hour, "model": model, "booked_hour": booked, **_columns(part)}
            for (uid, hour, model, booked), part in sorted(hours.items(), key=lambda item: item[0])
            if part != NO_CHARGE
        ]
        day_rows = [
            {"pod_uid": uid, "day": day, "model": model, **_columns(part)}
            for (uid, day, model), part in sorted(days.items(), key=lambda item: item[0])
            if part != NO_CHARGE
        ]
        if hour_rows:
            self._charge_hours.execute(conn, hour_rows)
        if day_rows:
            self._charge.execute(conn, day_rows)

    def label(self, conn: Statements, labels: Mapping[str, Labels]) -> None:
        """Records the labels of pods seen for the first time (a pod's labels are recorded once, never changed)."""
        rows = [{"pod_uid": uid, "key": key, "value": value} for uid in sorted(labels) for key, value in labels[uid]]
        if rows:
            self._label.execute(conn, rows)

    def billed(self, pod_uids: Sequence[str]) -> dict[str, int]:
        """Each pod's weighted micro-GPU-seconds so far."""
        query = (
            select(pod_usage.c.pod_uid, func.sum(pod_usage.c.weighted_micro_gpu_seconds))
            .where(pod_usage.c.pod_uid.in_(pod_uids))
            .group_by(pod_usage.c.pod_uid)
        )
        with self.db.read() as conn:
            return {uid: int(total) for uid, total in conn.execute(query)}

    def report(self, request: "UsageRequest") -> "UsageReport":
        columns: dict[str, Any] = {}
        source: Any = pod_usage.join(pod_ledgers, pod_ledgers.c.pod_uid == pod_usage.c.pod_uid)
        for index, key in enumerate(request.group_by):
            if key == "namespace":
                columns["namespace"] = pod_ledgers.c.namespace
            elif key == "day":
                columns["day"] = pod_usage.c.day
            elif key == "model":
                columns["model"] = pod_usage.c.model
            elif key == "pod":
                columns.update(namespace=pod_ledgers.c.namespace, pod=pod_ledgers.c.pod, podUid=pod_ledgers.c.pod_uid)
            else:
                label = pod_labels.alias(f"label_{index}")
                source = source.outerjoin(
                    label, and_(label.c.pod_uid == pod_usage.c.pod_uid, label.c.key == key[len(LABEL_PREFIX):])
                )
                columns[key] = label.c.value
        grouped = [column.label(f"g{index}") for index, column in enumerate(columns.values())]
        query = (
            select(*grouped, *(func.sum(pod_usage.c[column]).label(column) for column in _CHARGED))
            .select_from(source)
            .where(pod_usage.c.day >= request.start, pod_usage.c.day < request.end)
            .group_by(*grouped)
            .order_by(*(column.nulls_last() for column in grouped))  # as PostgreSQL orders; SQLite puts NULL first
            .limit(MAX_ROWS + 1)
        )
        if request.namespace is not None:
            query = query.where(pod_ledgers.c.namespace == request.namespace)
        with self.db.read() as conn:
            rows = conn.execute(query).all()
        if len(rows) > MAX_ROWS:
            raise UsageRequestError(
                f"the report has more than {MAX_ROWS:,} rows: ask for fewer days or group by fewer keys"
            )
        fields = list(columns)
        return UsageReport(
            request,
            fields,
            [
                UsageRow(
                    {field: _group_value(row[index]) for index, field in enumerate(fields)},
                    PodCharge(*(int(getattr(row, column)) for column in _CHARGED)),
                )
                for row in rows
            ],
        )


def _group_value(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, dt.date) else value


@dataclass(frozen=True)
class UsageRow:
    group: dict[str, str | None]  # None: the pod has no such label
    charge: PodCharge

    def to_json(self) -> dict[str, Any]:
        return {**self.group, **_amounts(self.charge)}


def _amounts(charge: PodCharge) -> dict[str, Any]:
    metered = charge.metered_micro_gpu_seconds
    return {
        "gpuSeconds": charge.micro_gpu_seconds / MICROS_PER_SECOND,
        "gpuMinutes": charge.micro_gpu_seconds / MICROS_PER_GPU_MINUTE,
        "billedGpuSeconds": charge.weighted_micro_gpu_seconds / MICROS_PER_SECOND,
        "billedGpuMinutes": charge.weighted_micro_gpu_seconds / MICROS_PER_GPU_MINUTE,
        "meteredGpuMinutes": metered / MICROS_PER_GPU_MINUTE,
        "idleGpuMinutes": charge.idle_micro_gpu_seconds / MICROS_PER_GPU_MINUTE if metered else None,
        "idleBilledGpuMinutes": charge.idle_weighted_micro_gpu_seconds / MICROS_PER_GPU_MINUTE if metered else None,
    }


@dataclass(frozen=True)
class UsageReport:
    request: UsageRequest
    fields: list[str]  # the grouping columns, in order
    rows: list[UsageRow]

    @property
    def total(self) -> PodCharge:
        return sum((row.charge for row in self.rows), NO_CHARGE)

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.request.start.isoformat(),
            "to": self.request.end.isoformat(),
            "groupBy": list(self.request.group_by),
            "fields": self.fields,
            "items": [row.to_json() for row in self.rows],
            "total": _amounts(self.total),
        }
