"""Idle GPUs: each budget's idle policy, each pod's idle streak (when it began, when it was warned of and acted on),
the owners held out of budget after an idle pod of theirs was evicted, and the weighted (billed) part of each pod's
idle GPU time per day.

Existing budgets have no idle policy (the default budget's, TIMEKEEPER_IDLE_*, applies to them as to every budget
without one). Existing daily rows get their billed idle part as their idle part at the row's average weight.

Revision ID: 0008_idle
Revises: 0006_reservations
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_idle"
down_revision = "0006_reservations"
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("budgets") as batch:
        batch.add_column(sa.Column("idle", sa.Text(), nullable=True))
    with op.batch_alter_table("pod_ledgers") as batch:
        batch.add_column(sa.Column("idle_since", _TIME, nullable=True))
        batch.add_column(sa.Column("idle_warned_at", _TIME, nullable=True))
        batch.add_column(sa.Column("idle_acted_at", _TIME, nullable=True))
    with op.batch_alter_table("pod_usage") as batch:
        batch.add_column(
            sa.Column("idle_weighted_micro_gpu_seconds", sa.BigInteger(), nullable=False, server_default="0")
        )
    op.execute(
        "UPDATE pod_usage SET idle_weighted_micro_gpu_seconds = CAST(ROUND(CAST(idle_micro_gpu_seconds AS FLOAT) "
        "* weighted_micro_gpu_seconds / micro_gpu_seconds) AS BIGINT) WHERE micro_gpu_seconds > 0"
    )
    op.create_table(
        "idle_holds",
        sa.Column("owner_uid", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("owner_kind", sa.String(63), nullable=False),
        sa.Column("owner_name", sa.String(253), nullable=False),
        sa.Column("pod", sa.String(253), nullable=False),
        sa.Column("held_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("owner_uid", name="pk_idle_holds"),
    )
    op.create_index("ix_idle_holds_namespace", "idle_holds", ["namespace"])


def downgrade() -> None:
    op.drop_index("ix_idle_holds_namespace", table_name="idle_holds")
    op.drop_table("idle_holds")
    with op.batch_alter_table("pod_usage") as batch:
        batch.drop_column("idle_weighted_micro_gpu_seconds")
    with op.batch_alter_table("pod_ledgers") as batch:
        for column in ("idle_acted_at", "idle_warned_at", "idle_since"):
            batch.drop_column(column)
    with op.batch_alter_table("budgets") as batch:
        batch.drop_column("idle")
