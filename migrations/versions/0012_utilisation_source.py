"""Whose word a pod's GPU utilisation is: the node agent's or Prometheus's outranks the meter's while fresh
(gpusharing.utilisation), so each pod ledger keeps its reading's source, when it was read and until when it is fresh.

Existing readings are the meters' (nothing else reported before): their source is `meter`, read at the meter's last
report, fresh (no `utilisation_fresh_until`) for two meter intervals after it, as before.

Revision ID: 0012_utilisation_source
Revises: 0011_published_commitments
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_utilisation_source"
down_revision = "0011_published_commitments"
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("pod_ledgers") as batch:
        batch.add_column(sa.Column("utilisation_source", sa.String(16), nullable=True))
        batch.add_column(sa.Column("utilisation_at", _TIME, nullable=True))
        batch.add_column(sa.Column("utilisation_fresh_until", _TIME, nullable=True))
    op.execute("UPDATE pod_ledgers SET utilisation_source = 'meter', utilisation_at = last_report_at "
               "WHERE last_report_at IS NOT NULL")


def downgrade() -> None:
    with op.batch_alter_table("pod_ledgers") as batch:
        for column in ("utilisation_fresh_until", "utilisation_at", "utilisation_source"):
            batch.drop_column(column)
