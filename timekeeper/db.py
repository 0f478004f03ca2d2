"""The database connection: PostgreSQL, or an embedded SQLite file with its writes serialized."""

from __future__ import annotations

import fcntl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql import Insert

from timekeeper.config import TimekeeperConfig

_BEGIN = "timekeeper_sqlite_begin"
CONNECT_TIMEOUT_SECONDS = 5  # an unreachable server is reported (503, /readyz) rather than waited for


class Database:
    def __init__(self, url: str, pool_size: int = 10, sqlite_busy_timeout_ms: int = 10_000):
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        if self.is_sqlite:
            self.engine = _sqlite_engine(url, pool_size, sqlite_busy_timeout_ms)
        else:
            # No pre-ping: it would cost a round trip per transaction; a dropped connection fails one request (503).
            self.engine = create_engine(
                url, pool_size=pool_size, max_overflow=pool_size, connect_args={"connect_timeout": CONNECT_TIMEOUT_SECONDS}
            )
        self._write_lock = _WriterLock(self.engine.url.database) if self.is_sqlite else None

    @classmethod
    def from_config(cls, config: TimekeeperConfig) -> "Database":
        return cls(config.database_url, config.db_pool_size, config.sqlite_busy_timeout_ms)

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A transaction that may write; PostgreSQL rows it reads FOR UPDATE stay locked until it ends."""
        if self._write_lock is None:
            with self.engine.begin() as conn:
                yield conn
            return
        with self._write_lock.held(), self.engine.connect().execution_options(**{_BEGIN: "BEGIN IMMEDIATE"}) as conn:
            with conn.begin():
                yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    def insert(self, table: Any) -> Insert:
        """An INSERT that knows ON CONFLICT on this backend."""
        return (sqlite.insert if self.is_sqlite else postgresql.insert)(table)  # type: ignore[no-any-return]

    def dispose(self) -> None:
        self.engine.dispose()


class _WriterLock:
    """SQLite has one writer at a time: the timekeeper's writers, threads and processes, queue here.

    BEGIN IMMEDIATE alone would serialize them too, but a writer that finds the database busy polls it with
    sleeps of up to 100 ms; a lock file wakes the next writer as soon as the last one is done. BEGIN IMMEDIATE
    and the busy timeout still guard against other writers (a migration, a second tool).
    """

    def __init__(self, database: str | None):
        self._threads = threading.Lock()
        self._path = f"{database}.writer-lock" if database and database != ":memory:" else None

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._threads:
            if self._path is None:
                yield
                return
            with open(self._path, "a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
                yield


def _sqlite_engine(url: str, pool_size: int, busy_timeout_ms: int) -> Engine:
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        connect_args={"timeout": busy_timeout_ms / 1000, "check_same_thread": False},
    )

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the driver so that BEGIN IMMEDIATE can be issued (see _begin).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.execute("PRAGMA synchronous=FULL")  # a report answered is on disk, even after a power loss
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql(conn.get_execution_options().get(_BEGIN, "BEGIN"))

    return engine
