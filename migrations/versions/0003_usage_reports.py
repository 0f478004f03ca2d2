"""Usage reports and GPU-model weights: each pod's charges per UTC day and model (raw, weighted, and their idle
part), the labels pods had at their first report, and the history of the models' billing weights.

namespace_usage keeps counting what budgets count, now weighted GPU-seconds (the same as before at weight 1).

Revision ID: 0003_usage_reports
Revises: 0002_hierarchy_warnings
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_usage_reports"
down_revision = "0002_hierarchy_warnings"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pod_usage",
        sa.Column("pod_uid", sa.String(253), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("model", sa.String(96), nullable=False),
        sa.Column("micro_gpu_seconds", sa.BigInteger(), nullable=False),
        sa.Column("weighted_micro_gpu_seconds", sa.BigInteger(), nullable=False),
        sa.Column("metered_micro_gpu_seconds", sa.BigInteger(), nullable=False),
        sa.Column("idle_micro_gpu_seconds", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("pod_uid", "day", "model", name="pk_pod_usage"),
    )
    op.create_index("ix_pod_usage_day", "pod_usage", ["day"])
    op.create_table(
        "pod_labels",
        sa.Column("pod_uid", sa.String(253), nullable=False),
        sa.Column("key", sa.String(317), nullable=False),
        sa.Column("value", sa.String(63), nullable=False),
        sa.PrimaryKeyConstraint("pod_uid", "key", name="pk_pod_labels"),
    )
    op.create_table(
        "gpu_model_weights",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model", sa.String(96), nullable=False),
        sa.Column("billing_weight", sa.Integer(), nullable=False),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("source", sa.String(253), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_gpu_model_weights"),
    )


def downgrade() -> None:
    op.drop_table("gpu_model_weights")
    op.drop_table("pod_labels")
    op.drop_index("ix_pod_usage_day", table_name="pod_usage")
    op.drop_table("pod_usage")
