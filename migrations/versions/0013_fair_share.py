"""Fair share: each namespace's usage decayed by a half-life, grown with the ledger's charges in their transaction, and
its band as the controller's `fairshare` task ranked it (timekeeper.database.tables.FairShareRow).

The table starts empty: usage counts from the upgrade on (the ledger's history is not replayed), and every namespace
starts in the band its use since then earns.

Revision ID: 0013_fair_share
Revises: 0012_utilisation_source
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_fair_share"
down_revision = "0012_utilisation_source"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "fair_share",
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.Column("as_of", TIME, nullable=False),
        sa.Column("half_life_seconds", sa.Float(), nullable=True),
        sa.Column("band", sa.Integer(), nullable=True),
        sa.Column("band_since", TIME, nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("ratio", sa.Float(), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("share_gpus", sa.Float(), nullable=True),
        sa.Column("held_gpus", sa.Float(), nullable=True),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("band_changes_at", TIME, nullable=True),
        sa.Column("ranked_at", TIME, nullable=True),
        sa.PrimaryKeyConstraint("namespace", name="pk_fair_share"),
    )


def downgrade() -> None:
    op.drop_table("fair_share")
