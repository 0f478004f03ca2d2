"""The audit log of the GPU models' billing weights.

A process bills with the catalogue it read at start (GPUSHARING_GPU_MODELS_FILE, the webhook's too), and each charge
is weighted when it is made: a change of weights applies to what is charged after a restart, never before.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, insert, select, text

from gpusharing.gpu.catalogue import GpuCatalogue
from gpusharing.units.weights import weight_number
from timekeeper.budgets.periods import iso_utc
from timekeeper.database.connection import Database
from timekeeper.database.tables import gpu_model_weights

MAX_HISTORY = 10_000


@dataclass(frozen=True)
class WeightChange:
    model: str
    billing_weight: int  # thousandths
    changed_at: dt.datetime
    source: str

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "billingWeight": weight_number(self.billing_weight),
            "changedAt": iso_utc(self.changed_at),
            "source": self.source,
        }


class WeightLog:
    def __init__(self, db: Database):
        self.db = db

    def record(self, catalogue: GpuCatalogue, now: dt.datetime, source: str) -> list[WeightChange]:
        """Records the weights of the catalogue that differ from the last recorded; returns what it recorded.

        Every worker and replica does this as it starts: one at a time (SQLite has one writer; on PostgreSQL the
        table is locked), so a change is recorded once.
        """
        with self.db.write() as conn:
            if not self.db.is_sqlite:
                conn.execute(text(f"LOCK TABLE {gpu_model_weights.name} IN SHARE ROW EXCLUSIVE MODE"))
            latest = _latest(conn)
            changes = [
                WeightChange(model.name, model.billing_weight, now, source)
                for model in catalogue.models
                if latest.get(model.name) != model.billing_weight
            ]
            if changes:
                conn.execute(
                    insert(gpu_model_weights),
                    [
                        {
                            "model": c.model,
                            "billing_weight": c.billing_weight,
                            "changed_at": c.changed_at,
                            "source": c.source,
                        }
                        for c in changes
                    ],
                )
        return changes

    def history(self) -> list[WeightChange]:
        """The newest first."""
        query = select(gpu_model_weights).order_by(gpu_model_weights.c.id.desc()).limit(MAX_HISTORY)
        with self.db.read() as conn:
            return [
                WeightChange(row.model, row.billing_weight, row.changed_at, row.source) for row in conn.execute(query)
            ]


def _latest(conn: Any) -> dict[str, int]:
    newest = select(func.max(gpu_model_weights.c.id)).group_by(gpu_model_weights.c.model)
    query = select(gpu_model_weights.c.model, gpu_model_weights.c.billing_weight).where(
        gpu_model_weights.c.id.in_(newest)
    )
    return {model: weight for model, weight in conn.execute(query)}
