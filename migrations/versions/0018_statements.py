"""Signed statements of closed billing periods, chained (docs/audit.md).

Revision ID: 0018_statements
Revises: 0017_hours
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018_statements"
down_revision = "0017_hours"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "statements",
        sa.Column("sequence", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("period_start", TIME, nullable=True),
        sa.Column("period_end", TIME, nullable=True),
        sa.Column("tree_size", sa.BigInteger(), nullable=False),
        sa.Column("root", sa.LargeBinary(), nullable=False),
        sa.Column("note", sa.LargeBinary(), nullable=False),
        sa.Column("leaf_hashes", sa.LargeBinary(), nullable=True),
        sa.Column("signer", sa.String(512), nullable=False),
        sa.Column("written_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("sequence", name="pk_statements"),
        sa.UniqueConstraint("period_start", name="uq_statements_period_start"),
    )


def downgrade() -> None:
    op.drop_table("statements")
