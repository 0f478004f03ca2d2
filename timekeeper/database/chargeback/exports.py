"""The reads a chargeback export is made of (timekeeper.chargeback.export): each namespace's GPU time per model and
hour as booked, the corrections booked in a window (each hour's capacity nobody held is the capacity ledger's), and
the tags closed periods' rows were first exported with (docs/chargeback.md)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Mapping

from sqlalchemy import Select, func, select

from timekeeper.chargeback.export import HeldHour
from timekeeper.database.chargeback.capacity import CapacityLedger
from timekeeper.database.connection import Database
from timekeeper.database.tables import export_tags, pod_hours, pod_ledgers

STREAMED_ROWS = 10_000  # fetched at a time: an export of a month of 10,000 namespaces has millions of rows


class ChargebackReads:
    def __init__(self, db: Database):
        self.db = db
        self.capacity = CapacityLedger(db)
        self._pin = db.bulk_insert(export_tags, ["namespace", "period_start", "tags"],
                                   lambda insert: insert.on_conflict_do_nothing())

    def pinned_tags(self, start: dt.datetime, end: dt.datetime) -> dict[tuple[str, dt.datetime], dict[str, str]]:
        """The tags each namespace's rows of the closed billing periods starting in [start, end) were first exported
        with."""
        query = select(export_tags).where(export_tags.c.period_start >= start, export_tags.c.period_start < end)
        with self.db.read() as conn:
            return {(row.namespace, row.period_start): json.loads(row.tags) for row in conn.execute(query)}

    def pin_tags(self, pins: Mapping[tuple[str, dt.datetime], Mapping[str, str]]) -> None:
        """Records the tags of namespaces' rows of closed periods exported for the first time (a pin already there
        stays)."""
        rows = [{"namespace": namespace, "period_start": period, "tags": json.dumps(dict(tags), sort_keys=True)}
                for (namespace, period), tags in sorted(pins.items())]
        if rows:
            with self.db.write() as conn:
                self._pin.execute(conn, rows)

    def held(self, start: dt.datetime, end: dt.datetime, namespace: str | None) -> Iterator[HeldHour]:
        """Each namespace's time per model in each hour of [start, end), booked on time; by hour, namespace, model."""
        query = self._held(namespace).where(
            pod_hours.c.hour >= start, pod_hours.c.hour < end, pod_hours.c.booked_hour == pod_hours.c.hour)
        yield from self._stream(query)

    def corrections(self, start: dt.datetime, end: dt.datetime, namespace: str | None) -> Iterator[HeldHour]:
        """The time booked in [start, end) for hours of periods closed before it came."""
        query = self._held(namespace).where(
            pod_hours.c.booked_hour >= start, pod_hours.c.booked_hour < end,
            pod_hours.c.booked_hour != pod_hours.c.hour)
        yield from self._stream(query)

    @staticmethod
    def _held(namespace: str | None) -> Select[tuple[str, str, dt.datetime, dt.datetime, int]]:
        query = (
            select(pod_ledgers.c.namespace, pod_hours.c.model, pod_hours.c.hour, pod_hours.c.booked_hour,
                   func.sum(pod_hours.c.micro_gpu_seconds).label("micro"))
            .select_from(pod_hours.join(pod_ledgers, pod_ledgers.c.pod_uid == pod_hours.c.pod_uid))
            .group_by(pod_hours.c.hour, pod_hours.c.booked_hour, pod_ledgers.c.namespace, pod_hours.c.model)
            .order_by(pod_hours.c.hour, pod_ledgers.c.namespace, pod_hours.c.model, pod_hours.c.booked_hour)
        )
        return query if namespace is None else query.where(pod_ledgers.c.namespace == namespace)

    def _stream(self, query: Select[tuple[str, str, dt.datetime, dt.datetime, int]]) -> Iterator[HeldHour]:
        with self.db.read() as conn:
            for row in conn.execution_options(yield_per=STREAMED_ROWS).execute(query):
                if row.micro:  # an hour a correction emptied
                    yield HeldHour(row.hour, row.namespace, row.model, row.booked_hour, int(row.micro))
