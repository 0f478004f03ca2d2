"""A throwaway PostgreSQL server on loopback, for the test suite and the benchmarks.

PostgreSQL refuses to run as root, so when we are root its programs run as the `postgres` system user, in a
temporary directory that user owns.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psycopg

from demo.processes import free_port


class PostgresUnavailable(RuntimeError):
    pass


def _binary(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise PostgresUnavailable(f"{name} is not installed (looked on PATH and in /usr/lib/postgresql/*/bin)")
    return found


@dataclass
class PostgresServer:
    directory: Path
    port: int
    as_user: list[str]

    @classmethod
    def start(cls, durable: bool = False) -> "PostgresServer":
        """initdb and start a server; `durable` False turns fsync off (tests), True keeps PostgreSQL's defaults."""
        directory = Path(tempfile.mkdtemp(prefix="gpusharing-pg-"))
        as_user: list[str] = []
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable("running as root and there is no `postgres` user to run PostgreSQL as") from None
            os.chown(directory, user.pw_uid, user.pw_gid)
            as_user = ["runuser", "-u", "postgres", "--"]
        server = cls(directory, free_port(), as_user)
        options = f"-h 127.0.0.1 -p {server.port} -k {directory} -c max_connections=200"
        if not durable:
            options += " -F -c synchronous_commit=off -c full_page_writes=off"
        try:
            server._run(_binary("initdb"), "-D", str(server.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
            log = str(directory / "server.log")
            server._run(_binary("pg_ctl"), "-D", str(server.data), "-l", log, "-o", options, "-w", "-t", "30", "start")
        except PostgresUnavailable:
            server.stop()
            raise
        return server

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run([*self.as_user, _binary("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"], capture_output=True)
        shutil.rmtree(self.directory, ignore_errors=True)

    def _run(self, *command: str) -> None:
        result = subprocess.run([*self.as_user, *command], capture_output=True, text=True, cwd=self.directory)
        if result.returncode != 0:
            log = self.directory / "server.log"
            detail = (result.stderr or result.stdout).strip() + ("\n" + log.read_text() if log.exists() else "")
            raise PostgresUnavailable(f"`{' '.join(command[:2])}` failed: {detail.strip()[-2000:]}")
