"""Chargeback by the hour: pods' charges split by the hour their GPU time was used in (pod_hours), what each GPU node
offered per hour (node_hours, node_capacity), the node each pod was bound to, and the tags a closed period's rows were
first exported with (export_tags; docs/chargeback.md).

Revision ID: 0017_hours
Revises: 0016_device_model
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_hours"
down_revision = "0016_device_model"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)
CHARGED = ("micro_gpu_seconds", "weighted_micro_gpu_seconds", "metered_micro_gpu_seconds", "idle_micro_gpu_seconds",
           "idle_weighted_micro_gpu_seconds")


def upgrade() -> None:
    with op.batch_alter_table("pod_ledgers") as batch:
        batch.add_column(sa.Column("node", sa.String(253), nullable=True))
    op.create_table(
        "pod_hours",
        sa.Column("pod_uid", sa.String(253), nullable=False),
        sa.Column("hour", TIME, nullable=False),
        sa.Column("model", sa.String(96), nullable=False),
        sa.Column("booked_hour", TIME, nullable=False),
        *(sa.Column(column, sa.BigInteger(), nullable=False) for column in CHARGED[:-1]),
        sa.Column(CHARGED[-1], sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("pod_uid", "hour", "model", "booked_hour", name="pk_pod_hours"),
    )
    op.create_index("ix_pod_hours_hour", "pod_hours", ["hour"])
    op.create_index("ix_pod_hours_booked_hour", "pod_hours", ["booked_hour"])
    op.create_table(
        "export_tags",
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("period_start", TIME, nullable=False),
        sa.Column("tags", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "period_start", name="pk_export_tags"),
    )
    op.create_table(
        "node_hours",
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("hour", TIME, nullable=False),
        sa.Column("model", sa.String(96), nullable=False),
        sa.Column("capacity_micro_gpu_seconds", sa.BigInteger(), nullable=False),
        sa.Column("down_micro_gpu_seconds", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("node", "hour", name="pk_node_hours"),
    )
    op.create_index("ix_node_hours_hour", "node_hours", ["hour"])
    op.create_table(
        "node_capacity",
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("uid", sa.String(64), nullable=False),
        sa.Column("model", sa.String(96), nullable=False),
        sa.Column("micro_gpus", sa.BigInteger(), nullable=False),
        sa.Column("ready", sa.Boolean(), nullable=False),
        sa.Column("observed_until", TIME, nullable=False),
        sa.Column("gone_at", TIME, nullable=True),
        sa.PrimaryKeyConstraint("node", name="pk_node_capacity"),
    )


def downgrade() -> None:
    op.drop_table("export_tags")
    op.drop_table("node_capacity")
    op.drop_index("ix_node_hours_hour", table_name="node_hours")
    op.drop_table("node_hours")
    op.drop_index("ix_pod_hours_booked_hour", table_name="pod_hours")
    op.drop_index("ix_pod_hours_hour", table_name="pod_hours")
    op.drop_table("pod_hours")
    with op.batch_alter_table("pod_ledgers") as batch:
        batch.drop_column("node")
