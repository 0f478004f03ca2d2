"""The controller's fencing: its term (the Lease's leaseTransitions when taken) and each eviction claimed under it, so
that a deposed controller can evict nothing and no pod is evicted twice (timekeeper.database.cluster.fencing); and which
budget listing each webhook process holds, so that a crossing's evictions wait until every webhook knows of it
(timekeeper.database.cluster.listings).

Revision ID: 0009_eviction_fencing
Revises: 0008_idle
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_eviction_fencing"
down_revision = "0008_idle"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "controller_terms",
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("term", sa.BigInteger, nullable=False),
        sa.Column("holder", sa.String(253), nullable=False),
        sa.Column("since", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_controller_terms"),
    )
    op.create_table(
        "eviction_claims",
        sa.Column("pod_uid", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("pod", sa.String(253), nullable=False),
        sa.Column("term", sa.BigInteger, nullable=False),
        sa.Column("claimed_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("pod_uid", name="pk_eviction_claims"),
    )
    op.create_index("ix_eviction_claims_claimed_at", "eviction_claims", ["claimed_at"])
    op.create_table(
        "webhook_listings",
        sa.Column("webhook", sa.String(253), nullable=False),
        sa.Column("in_force_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("webhook", name="pk_webhook_listings"),
    )
    op.create_index("ix_webhook_listings_expires_at", "webhook_listings", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_webhook_listings_expires_at", "webhook_listings")
    op.drop_table("webhook_listings")
    op.drop_index("ix_eviction_claims_claimed_at", "eviction_claims")
    op.drop_table("eviction_claims")
    op.drop_table("controller_terms")
