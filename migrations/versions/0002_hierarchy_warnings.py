"""Budget hierarchies, warning thresholds, budgets owned by GPUBudget resources; the demoter's lease moves to a
Kubernetes Lease.

Revision ID: 0002_hierarchy_warnings
Revises: 0001_initial
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_hierarchy_warnings"
down_revision = "0001_initial"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("budgets") as batch:
        batch.add_column(sa.Column("parent", sa.String(63), nullable=True))
        # Existing budgets get the default thresholds.
        batch.add_column(sa.Column("warning_thresholds", sa.String(32), nullable=False, server_default="80,95"))
        batch.add_column(sa.Column("managed_by", sa.String(253), nullable=True))
    with op.batch_alter_table("budgets") as batch:
        batch.alter_column("warning_thresholds", server_default=None)
    op.create_table(
        "budget_warnings",
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("period_start", TIME, nullable=False),
        sa.Column("threshold", sa.Integer(), nullable=False),
        sa.Column("warned_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("namespace", "period_start", "threshold", name="pk_budget_warnings"),
    )
    op.drop_table("leases")


def downgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("holder", sa.String(253), nullable=False),
        sa.Column("expires_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_leases"),
    )
    op.drop_table("budget_warnings")
    with op.batch_alter_table("budgets") as batch:
        for column in ("managed_by", "warning_thresholds", "parent"):
            batch.drop_column(column)
