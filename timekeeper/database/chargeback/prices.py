"""The price sheets recorded, as the weights' audit log is (timekeeper.database.accounting.weights): each process
records the sheet it starts with when it differs from the last recorded, in force from the first whole hour after, so
that no hour already charged is priced again (docs/chargeback.md, "Prices")."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import insert, select, text

from timekeeper.budgets.periods import iso_utc
from timekeeper.chargeback.prices import GpuPrice, PriceSheet
from timekeeper.database.connection import Database
from timekeeper.database.tables import gpu_price_sheets

MAX_VERSIONS = 1000  # shown


@dataclass(frozen=True)
class RecordedSheet:
    """A price sheet as recorded: in force from `effective_at` until the next one's."""

    sheet: PriceSheet
    recorded_at: dt.datetime
    effective_at: dt.datetime
    source: str

    def to_json(self) -> dict[str, Any]:
        return {**self.sheet.to_json(), "recordedAt": iso_utc(self.recorded_at),
                "effectiveAt": iso_utc(self.effective_at), "source": self.source}


def next_hour(at: dt.datetime) -> dt.datetime:
    """The first whole hour after `at` (UTC): the hour `at` lies in may already be charged."""
    return at.astimezone(dt.timezone.utc).replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=1)


class PriceLog:
    def __init__(self, db: Database):
        self.db = db

    def record(self, sheet: PriceSheet, now: dt.datetime, source: str) -> RecordedSheet | None:
        """Records `sheet` when it differs from the last recorded (one process at a time: SQLite has one writer, on
        PostgreSQL the table is locked); what it recorded, None when nothing changed."""
        with self.db.write() as conn:
            if not self.db.is_sqlite:
                conn.execute(text(f"LOCK TABLE {gpu_price_sheets.name} IN SHARE ROW EXCLUSIVE MODE"))
            latest = conn.execute(
                select(gpu_price_sheets.c.sheet).order_by(gpu_price_sheets.c.id.desc()).limit(1)).scalar()
            canonical = sheet.canonical()
            if latest == canonical or (latest is None and sheet.currency is None):
                return None
            recorded = RecordedSheet(sheet, now, next_hour(now), source[:253])
            conn.execute(insert(gpu_price_sheets), [{"recorded_at": now, "effective_at": recorded.effective_at,
                                                     "currency": sheet.currency, "sheet": canonical,
                                                     "source": recorded.source}])
        return recorded

    def history(self) -> list[RecordedSheet]:
        """The newest first."""
        query = select(gpu_price_sheets).order_by(gpu_price_sheets.c.id.desc()).limit(MAX_VERSIONS)
        with self.db.read() as conn:
            return [RecordedSheet(_sheet(row.sheet), row.recorded_at, row.effective_at, row.source)
                    for row in conn.execute(query)]


def in_force(history: list[RecordedSheet], at: dt.datetime) -> RecordedSheet | None:
    """The sheet of `history` (newest first) in force at `at`."""
    return next((recorded for recorded in history if recorded.effective_at <= at), None)


def _sheet(canonical: str) -> PriceSheet:
    """A sheet from its recorded form (written by record(): read as written)."""
    document = json.loads(canonical)
    return PriceSheet(document["currency"], tuple(
        GpuPrice(p["model"], dt.date.fromisoformat(p["from"]), Decimal(p["listPerGpuHour"]),
                 Decimal(p["contractedPerGpuHour"]))
        for p in document["prices"]))
