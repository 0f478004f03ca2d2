"""Usage rollups: each namespace's charges per period of each kind (namespace_period_usage), written with its daily
charges, so that a budget's status reads one row per kind of period however long the history; and top-ups indexed by
the period they add to.

The rollups are backfilled from namespace_usage: every day's charges added to the daily, weekly (ISO, from Monday),
monthly and everlasting (from 1970-01-01) period it lies in, as timekeeper.budgets.periods reckons them (whole UTC
days). The daily rows stay the source of anything that needs days.

Revision ID: 0010_usage_rollups
Revises: 0009_eviction_fencing
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_usage_rollups"
down_revision = "0009_eviction_fencing"
branch_labels = None
depends_on = None

# Each kind of period's first day, of the day `day`, in each dialect (ISO weeks start on Monday).
_STARTS = {
    "sqlite": {
        "daily": "day",
        "weekly": "date(day, '-' || ((CAST(strftime('%w', day) AS INTEGER) + 6) % 7) || ' days')",
        "monthly": "date(day, 'start of month')",
        "none": "'1970-01-01'",
    },
    "postgresql": {
        "daily": "day",
        "weekly": "day - (CAST(EXTRACT(ISODOW FROM day) AS INTEGER) - 1)",
        # no time zone: the session's is no part
        "monthly": "CAST(date_trunc('month', CAST(day AS TIMESTAMP)) AS DATE)",
        "none": "DATE '1970-01-01'",
    },
}


def upgrade() -> None:
    op.create_table(
        "namespace_period_usage",
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("period", sa.String(16), nullable=False),
        sa.Column("period_start", sa.Date(), nullable=False),
        sa.Column("micro_gpu_seconds", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("period", "period_start", "namespace", name="pk_namespace_period_usage"),
    )
    for period, start in _STARTS[op.get_bind().dialect.name].items():
        op.execute(
            "INSERT INTO namespace_period_usage (namespace, period, period_start, micro_gpu_seconds) "
            f"SELECT namespace, '{period}', {start}, SUM(micro_gpu_seconds) FROM namespace_usage "
            f"GROUP BY namespace, {start}"
        )
    op.create_index("ix_top_ups_period_start", "top_ups", ["period_start", "namespace"])


def downgrade() -> None:
    op.drop_index("ix_top_ups_period_start", table_name="top_ups")
    op.drop_table("namespace_period_usage")
