"""Alembic's entry point: the URL comes from timekeeper.database.schema.alembic_config (never from an alembic.ini)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from timekeeper.database.tables import Base

config = context.config
url = config.attributes.get("database_url") or config.get_main_option("sqlalchemy.url")


def run_offline() -> None:
    context.configure(url=url, target_metadata=Base.metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    if not url:
        raise RuntimeError("no database URL: migrations run through timekeeper.database.schema.alembic_config")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        # render_as_batch: SQLite changes tables by copying them; Alembic does that in batch mode.
        context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
