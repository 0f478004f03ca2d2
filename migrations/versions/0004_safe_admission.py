"""Safe admission's settings on every budget: how it admits GPU pods (open, safe, strict) and what it does with a
pod its uncommitted budget cannot cover (demote, refuse).

Existing budgets keep admitting as before: open, demote (the columns' server defaults, which stay).

Revision ID: 0004_safe_admission
Revises: 0003_usage_reports
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_safe_admission"
down_revision = "0003_usage_reports"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("budgets") as batch:
        batch.add_column(sa.Column("admission", sa.String(8), nullable=False, server_default="open"))
        batch.add_column(sa.Column("on_shortfall", sa.String(8), nullable=False, server_default="demote"))


def downgrade() -> None:
    with op.batch_alter_table("budgets") as batch:
        for column in ("on_shortfall", "admission"):
            batch.drop_column(column)
