"""`gpusharing db downgrade REVISION`: every migration's downgrade works on SQLite and PostgreSQL with a row in every
table, keeps the rows of what it does not drop, and the upgrade after it works on the same data; the command's
exit statuses."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, MetaData, create_engine, func, inspect, select, text

from gpusharing.cli import main
from testbed.postgres import PostgresServer
from timekeeper.database.schema import (
    alembic_config,
    current_revision,
    downgrade,
    head_revision,
    schema_problem,
    upgrade,
)
from timekeeper.database.tables import Base

VALUES: dict[type, Any] = {str: "x", int: 1, float: 1.5, bool: True, bytes: b"x", dt.date: dt.date(2026, 11, 1),
                           dt.datetime: dt.datetime(2026, 11, 1, 12, tzinfo=dt.timezone.utc)}


def steps() -> list[tuple[str, str]]:
    """(revision, the one before it or base) for every migration, from the newest down."""
    scripts = ScriptDirectory.from_config(alembic_config(""))
    return [(script.revision, str(script.down_revision or "base")) for script in scripts.walk_revisions()]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'timekeeper.sqlite'}"
    postgres: PostgresServer = request.getfixturevalue("postgres")
    return postgres.create_database("downgrades")


def tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names()) - {"alembic_version"}


def fill(engine: Engine) -> None:
    """A row in every empty table, each column given a value of its type."""
    metadata = MetaData()
    metadata.reflect(engine)
    with engine.begin() as conn:
        for name in tables(engine):
            table = metadata.tables[name]
            if conn.execute(select(func.count()).select_from(table)).scalar_one() == 0:
                conn.execute(
                    table.insert().values({column.name: VALUES[column.type.python_type] for column in table.columns})
                )


def rows(engine: Engine) -> dict[str, int]:
    metadata = MetaData()
    metadata.reflect(engine)
    with engine.connect() as conn:
        return {
            name: conn.execute(select(func.count()).select_from(metadata.tables[name])).scalar_one()
            for name in tables(engine)
        }


def test_every_downgrade_keeps_what_it_does_not_drop_and_upgrades_again(url: str) -> None:
    assert [revision for revision, _ in steps()][-1] == "0001_initial" and len(steps()) >= 4
    upgrade(url)
    engine = create_engine(url)
    for revision, before in steps():
        fill(engine)
        kept = tables(engine)
        downgrade(url, before)
        assert current_revision(engine) == (None if before == "base" else before)
        remaining = tables(engine) & kept
        counted = rows(engine)  # once: reflecting the schema for every table made this test take minutes
        assert all(counted[name] == 1 for name in remaining), counted
        fill(engine)  # a table the downgrade made again (0002's leases) has a row too
        upgrade(url, revision)  # the upgrade on the downgraded data
        assert current_revision(engine) == revision and tables(engine) == kept
        counted = rows(engine)
        assert all(counted[name] == 1 for name in remaining), counted
        downgrade(url, before)
    assert tables(engine) == set()
    upgrade(url)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    assert schema_problem(engine) is None
    engine.dispose()


def db(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The exit status, stdout, and the last line on stderr (after Alembic's own lines)."""
    code = main(["db", *args])
    out, err = capsys.readouterr()
    return code, out, (err.splitlines() or [""])[-1]


def test_db_downgrade_and_its_exit_statuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'tk.sqlite'}"
    at = ("--database-url", url)
    assert db(capsys, "downgrade", "0003", *at) == (  # 2: nothing to downgrade, and nothing created by looking
        2, "", f"gpusharing: the database file {tmp_path / 'tk.sqlite'} does not exist: there is nothing to downgrade")
    assert list(tmp_path.iterdir()) == []
    assert db(capsys, "upgrade", *at)[:2] == (0, "database migrated to head\n")
    assert db(capsys, "downgrade", "0003", *at)[:2] == (0, "database migrated down to 0003\n")  # a unique prefix
    assert current_revision(create_engine(url)) == "0003_usage_reports"
    code, out, err = db(capsys, "downgrade", "0004", *at)  # 2: not a downgrade from here
    assert (code, out) == (2, "") and err.endswith(
        "to 0004: Destination 0004 is not a valid downgrade target from current head(s)"
    )
    code, out, err = db(capsys, "downgrade", "0999", *at)
    assert (code, out, err) == (
        2,
        "",
        f"gpusharing: cannot migrate {url} to 0999: Can't locate revision identified by '0999'",
    )
    code, out, err = db(capsys, "downgrade", "base", "--database-url", "postgresql+psycopg://tk:secret@127.0.0.1:1/tk")
    assert (code, out) == (1, "")  # 1: the database cannot be reached; the password is not shown
    assert err == (
        "gpusharing: cannot migrate the database postgresql+psycopg://tk:***@127.0.0.1:1/tk: connection failed: "
        'connection to server at "127.0.0.1", port 1 failed: Connection refused'
    )
    assert db(capsys, "downgrade", "base", *at)[:2] == (0, "database migrated down to base\n")
    assert tables(create_engine(url)) == set()


def test_a_database_a_newer_version_migrated_says_to_downgrade_with_that_version(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tk.sqlite'}"
    upgrade(url)
    engine = create_engine(url)
    with engine.begin() as conn:  # as the next version's migration would leave it
        conn.execute(text("UPDATE alembic_version SET version_num = '0099_from_the_future'"))
    assert schema_problem(engine) == (
        f"the database is at revision 0099_from_the_future, newer than this timekeeper knows (it needs "
        f"{head_revision()}): "
        f"run the newer version, or migrate back with its `gpusharing db downgrade {head_revision()}`"
    )
    engine.dispose()
