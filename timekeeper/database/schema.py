"""The schema's version: Alembic driven from code, so `gpusharing db upgrade` works from any directory and when
installed."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import URL, Engine, make_url
from sqlalchemy.exc import SQLAlchemyError

import migrations


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # Passed as an attribute rather than an option: ConfigParser would read '%' in a password as interpolation.
    config.attributes["database_url"] = database_url
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    """Back to `revision` (`base`: no table left): each later revision's downgrade drops what it added, data
    included."""
    command.downgrade(alembic_config(database_url), revision)


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    assert head is not None, "migrations/versions holds no revision"
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def schema_problem(engine: Engine, head: str | None = None) -> str | None:
    """Why the database cannot be served (unreachable, or behind the code's migrations), or None when it can."""
    head = head or head_revision()
    if path := missing_sqlite_file(engine.url):
        return f"the database file {path} does not exist: run `gpusharing db upgrade` to create it"
    try:
        current = current_revision(engine)
    except SQLAlchemyError as exc:
        return f"the database is unreachable: {first_line(exc)}"
    if current != head:
        if current is not None and not known_revision(current):
            return (
                f"the database is at revision {current}, newer than this timekeeper knows (it needs {head}): run the "
                f"newer version, or migrate back with its `gpusharing db downgrade {head}`"
            )
        found = f"at revision {current}" if current else "not migrated"
        return f"the database is {found}, this timekeeper needs revision {head}: run `gpusharing db upgrade`"
    return None


def known_revision(revision: str) -> bool:
    try:
        return ScriptDirectory.from_config(alembic_config("")).get_revision(revision) is not None
    except CommandError:  # a revision of a newer version: its file is not here
        return False


def missing_sqlite_file(url: str | URL) -> str | None:
    """The SQLite file `url` names when it does not exist: checked before connecting, since SQLite would create an
    empty file, which looks like a database to the next look."""
    parsed = make_url(url)
    path = parsed.database
    if parsed.get_backend_name() == "sqlite" and path and path != ":memory:" and not Path(path).exists():
        return path
    return None


def first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
