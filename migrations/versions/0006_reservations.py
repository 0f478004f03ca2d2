"""Safe admission's reservations: what a pod being admitted holds of its budgets until the timekeeper sees the pod,
kept where every timekeeper process and replica counts them (keyed by the AdmissionReview's uid; each lapses at
expires_at).

Revision ID: 0006_reservations
Revises: 0005_billing_record
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_reservations"
down_revision = "0005_billing_record"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reservations",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("micro_gpu_seconds", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_reservations"),
    )
    op.create_index("ix_reservations_expires_at", "reservations", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_reservations_expires_at", table_name="reservations")
    op.drop_table("reservations")
