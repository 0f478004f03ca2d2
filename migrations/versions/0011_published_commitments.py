"""Published commitments: the committed GPU pods the controller publishes from its pod watch (committed_pods), and its
heartbeat (commitment_publications), so that the web replicas count safe admission's commitments from the database
and hold no pod watch of their own (timekeeper.database.cluster.commitments).

Both tables start empty: the controller fills them on its first publication, and until then safe admission says
that the cluster's pods have not been published.

Revision ID: 0011_published_commitments
Revises: 0010_usage_rollups
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_published_commitments"
down_revision = "0010_usage_rollups"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "committed_pods",
        sa.Column("uid", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("share", sa.Float(), nullable=False),
        sa.Column("weight", sa.Integer(), nullable=False),
        sa.Column("deadline_seconds", sa.Integer(), nullable=False),
        sa.Column("started_at", TIME, nullable=True),
        sa.Column("admission_id", sa.String(64), nullable=True),
        sa.Column("seen_at", TIME, nullable=False),
        sa.Column("gone_at", TIME, nullable=True),
        sa.PrimaryKeyConstraint("uid", name="pk_committed_pods"),
    )
    op.create_table(
        "commitment_publications",
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("publisher", sa.String(253), nullable=False),
        sa.Column("published_at", TIME, nullable=False),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("confirmed_at", TIME, nullable=True),
        sa.PrimaryKeyConstraint("name", name="pk_commitment_publications"),
    )


def downgrade() -> None:
    op.drop_table("commitment_publications")
    op.drop_table("committed_pods")
