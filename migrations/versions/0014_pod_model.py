"""One GPU model per pod for its whole life: the model a pod is billed on, fixed at its first charge (its node's, once
the pod is bound: timekeeper.accounting.placement), and the model its meter last named, kept as evidence beside it.

An open pod's model is fixed at its next charge; a closed pod's stays unset (its usage rows already name its models).

Revision ID: 0014_pod_model
Revises: 0013_fair_share
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_pod_model"
down_revision = "0013_fair_share"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("pod_ledgers") as batch:
        batch.add_column(sa.Column("model", sa.String(96), nullable=True))
        batch.add_column(sa.Column("meter_model", sa.String(96), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pod_ledgers") as batch:
        for column in ("meter_model", "model"):
            batch.drop_column(column)
