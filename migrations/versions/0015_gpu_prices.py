"""The price sheets the timekeeper starts with (timekeeper.chargeback.prices), each recorded once and in force from the
first whole hour after it was recorded, so that a change of price changes no hour already charged.

Revision ID: 0015_gpu_prices
Revises: 0014_pod_model
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_gpu_prices"
down_revision = "0014_pod_model"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "gpu_price_sheets",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("recorded_at", TIME, nullable=False),
        sa.Column("effective_at", TIME, nullable=False),
        sa.Column("currency", sa.String(3), nullable=True),
        sa.Column("sheet", sa.Text(), nullable=False),
        sa.Column("source", sa.String(253), nullable=False),
    )
    op.create_index("ix_gpu_price_sheets_effective_at", "gpu_price_sheets", ["effective_at"])


def downgrade() -> None:
    op.drop_index("ix_gpu_price_sheets_effective_at", table_name="gpu_price_sheets")
    op.drop_table("gpu_price_sheets")
