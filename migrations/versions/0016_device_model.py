"""The GPU model a node agent reads of the devices a pod was given (NVML's name), kept beside the model the pod is
billed on as evidence, as the meter's is (`meter_model`).

Revision ID: 0016_device_model
Revises: 0015_gpu_prices
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016_device_model"
down_revision = "0015_gpu_prices"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("pod_ledgers") as batch:
        batch.add_column(sa.Column("device_model", sa.String(96), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pod_ledgers") as batch:
        batch.drop_column("device_model")
