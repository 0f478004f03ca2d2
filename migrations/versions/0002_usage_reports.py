"""Usage reports: each pod's charges per UTC day (with their idle part), and the labels pods had at their first report.

Revision ID: 0002_usage_reports
Revises: 0001_initial
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_usage_reports"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pod_usage",
        sa.Column("pod_uid", sa.String(253), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("micro_gpu_seconds", sa.BigInteger(), nullable=False),
        sa.Column("metered_micro_gpu_seconds", sa.BigInteger(), nullable=False),
        sa.Column("idle_micro_gpu_seconds", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("pod_uid", "day", name="pk_pod_usage"),
    )
    op.create_index("ix_pod_usage_day", "pod_usage", ["day"])
    op.create_table(
        "pod_labels",
        sa.Column("pod_uid", sa.String(253), nullable=False),
        sa.Column("key", sa.String(317), nullable=False),
        sa.Column("value", sa.String(63), nullable=False),
        sa.PrimaryKeyConstraint("pod_uid", "key", name="pk_pod_labels"),
    )


def downgrade() -> None:
    op.drop_table("pod_labels")
    op.drop_index("ix_pod_usage_day", table_name="pod_usage")
    op.drop_table("pod_usage")
