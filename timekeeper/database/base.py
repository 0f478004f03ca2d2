"""What every table of the timekeeper is declared with: the declarative base, aware UTC datetimes on every backend,
and a model's Table (timekeeper.database.tables holds the tables)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import DateTime, MetaData, Table, TypeDecorator
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase

UTC = dt.timezone.utc


class UtcDateTime(TypeDecorator[dt.datetime]):
    """Aware UTC datetimes on every backend (SQLite keeps no time zone, so one is put back on reading)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("UtcDateTime needs an aware datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_name)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


def table_of(row: type[Base]) -> Table:
    """A model's Table, typed as one (declarative types `__table__` as any FromClause)."""
    table = row.__table__
    assert isinstance(table, Table)
    return table
