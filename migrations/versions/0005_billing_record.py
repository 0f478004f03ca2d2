"""Billing from the API server's record: a pod's ledger keeps, beside what its meter reported, what the timekeeper's
pod watch observed (from the pod's start to its end, at the share recomputed from its spec), and bills the larger.

Existing ledgers carry over: what was billed so far stays billed, and counts as metered (it came from the meter);
nothing was observed yet. A pod still running is observed from its start at the next controller pass, and only what
that adds beyond its bill is charged. A row the watch opens has no report yet, so the report times may be empty.

Revision ID: 0005_billing_record
Revises: 0004_safe_admission
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_billing_record"
down_revision = "0004_safe_admission"
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("pod_ledgers") as batch:
        batch.add_column(sa.Column("metered_micro_gpu_seconds", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("observed_micro_gpu_seconds", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("observed_until", _TIME, nullable=True))
        batch.add_column(sa.Column("started_at", _TIME, nullable=True))
        batch.add_column(sa.Column("ended_at", _TIME, nullable=True))
        batch.add_column(sa.Column("meter_silent_since", _TIME, nullable=True))
        batch.alter_column("first_report_at", existing_type=_TIME, nullable=True)
        batch.alter_column("last_report_at", existing_type=_TIME, nullable=True)
    op.execute("UPDATE pod_ledgers SET metered_micro_gpu_seconds = micro_gpu_seconds")


def downgrade() -> None:
    # Rows the watch opened have no report: they go back with the time they were opened (their start) as both.
    op.execute(
        "UPDATE pod_ledgers SET first_report_at = COALESCE(first_report_at, started_at, observed_until, "
        "CURRENT_TIMESTAMP), last_report_at = COALESCE(last_report_at, observed_until, started_at, CURRENT_TIMESTAMP)"
    )
    with op.batch_alter_table("pod_ledgers") as batch:
        batch.alter_column("last_report_at", existing_type=_TIME, nullable=False)
        batch.alter_column("first_report_at", existing_type=_TIME, nullable=False)
        for column in ("meter_silent_since", "ended_at", "started_at", "observed_until", "observed_micro_gpu_seconds",
                       "metered_micro_gpu_seconds"):
            batch.drop_column(column)
