"""Budgets, top-ups, the audit log, pod ledgers, daily namespace usage, demotion states and leases.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "budgets",
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("gpu_minutes", sa.Float(), nullable=True),
        sa.Column("period", sa.String(16), nullable=False),
        sa.Column("evict_on_exhaustion", sa.Boolean(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("namespace", name="pk_budgets"),
    )
    op.create_table(
        "top_ups",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("period_start", TIME, nullable=False),
        sa.Column("gpu_minutes", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(253), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_top_ups"),
    )
    op.create_index("ix_top_ups_namespace", "top_ups", ["namespace"])
    op.create_table(
        "budget_changes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(253), nullable=False),
        sa.Column("changed_at", TIME, nullable=False),
        sa.Column("before", sa.Text(), nullable=True),
        sa.Column("after", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_budget_changes"),
    )
    op.create_index("ix_budget_changes_namespace", "budget_changes", ["namespace"])
    op.create_table(
        "pod_ledgers",
        sa.Column("pod_uid", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("pod", sa.String(253), nullable=False),
        sa.Column("billed_share", sa.Float(), nullable=False),
        sa.Column("micro_gpu_seconds", sa.BigInteger(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("final", sa.Boolean(), nullable=False),
        sa.Column("first_report_at", TIME, nullable=False),
        sa.Column("last_report_at", TIME, nullable=False),
        sa.Column("gpu_memory_used_mib", sa.Float(), nullable=True),
        sa.Column("gpu_memory_requested_mib", sa.Float(), nullable=True),
        sa.Column("gpu_utilization_percent", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("pod_uid", name="pk_pod_ledgers"),
    )
    op.create_index("ix_pod_ledgers_namespace", "pod_ledgers", ["namespace"])
    op.create_table(
        "namespace_usage",
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("micro_gpu_seconds", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "day", name="pk_namespace_usage"),
    )
    op.create_table(
        "namespace_states",
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("changed_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("namespace", name="pk_namespace_states"),
    )
    op.create_table(
        "leases",
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("holder", sa.String(253), nullable=False),
        sa.Column("expires_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_leases"),
    )


def downgrade() -> None:
    for table in (
        "leases",
        "namespace_states",
        "namespace_usage",
        "pod_ledgers",
        "budget_changes",
        "top_ups",
        "budgets",
    ):
        op.drop_table(table)
