"""The database connection: PostgreSQL, or an embedded SQLite file with its writes serialized."""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from psycopg.rows import namedtuple_row
from sqlalchemy import Connection, Engine, Table, Text, bindparam, cast, column, create_engine, event, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Executable, Insert
from sqlalchemy.sql.compiler import SQLCompiler

from timekeeper.config import TimekeeperConfig

_BEGIN = "timekeeper_sqlite_begin"
CONNECT_TIMEOUT_SECONDS = 5  # an unreachable server is reported (503, /readyz) rather than waited for

Parameters = Mapping[str, Any] | Sequence[Mapping[str, Any]] | None


class Statements(Protocol):
    """What runs statements in a transaction: a SQLAlchemy Connection, or a Pipeline.

    The rows of a statement are iterated once; a Pipeline sends them only when they are read.
    """

    def execute(self, statement: Executable, parameters: Parameters = None, /) -> Iterable[Any]: ...


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
        self._compiled: dict[tuple[Executable, tuple[str, ...]], SQLCompiler] = {}

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
    def pipeline(self) -> Iterator[Statements]:
        """A write transaction whose statements travel together (see Pipeline); on SQLite, write()."""
        if self.is_sqlite:
            with self.write() as conn:
                yield _Buffered(conn)
            return
        with self.engine.connect() as conn:
            pipeline = Pipeline(conn, self._compiled)
            driver = pipeline.driver
            try:
                with driver.pipeline():
                    yield pipeline
                    driver.commit()
            except BaseException as failed:
                if driver.closed or driver.broken:
                    conn.invalidate()  # the pool must not hand this connection out again
                else:
                    driver.rollback()
                dbapi_error = self.engine.dialect.loaded_dbapi.Error
                if isinstance(failed, dbapi_error):  # raised as SQLAlchemy would have, for the callers' handlers
                    raise DBAPIError.instance(pipeline.last_sql, None, failed, dbapi_error) from failed
                raise

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    def insert(self, table: Any) -> Insert:
        """An INSERT that knows ON CONFLICT on this backend."""
        return (sqlite.insert if self.is_sqlite else postgresql.insert)(table)  # type: ignore[no-any-return]

    def bulk_insert(self, table: Table, columns: Sequence[str], on_conflict: Callable[[Any], Insert]) -> BulkWrite:
        """An INSERT of many rows, each with `columns`; on_conflict adds its ON CONFLICT clause."""
        if self.is_sqlite:
            return BulkWrite(on_conflict(sqlite.insert(table)), None)
        incoming = _incoming(table, columns)
        return BulkWrite(on_conflict(postgresql.insert(table).from_select(columns, select(*incoming.c))), columns)

    def bulk_update(self, table: Table, key: str, columns: Sequence[str]) -> BulkWrite:
        """An UPDATE of many rows, each found by its `key` column and given new `columns`."""
        if self.is_sqlite:
            matched = table.update().where(table.c[key] == bindparam(_MATCH + key))  # SET: the other parameters
            return BulkWrite(matched, None, key)
        incoming = _incoming(table, [key, *columns])
        return BulkWrite(
            table.update().where(table.c[key] == incoming.c[key]).values({c: incoming.c[c] for c in columns}), [key, *columns]
        )

    def dispose(self) -> None:
        self.engine.dispose()


# SQLAlchemy reserves a column's own name for the parameter that sets it.
_MATCH = "match_"
_INCOMING = "incoming"


@dataclass(frozen=True)
class BulkWrite:
    """A statement that writes many rows at once: on PostgreSQL one statement whatever their number, the rows sent
    as one JSON array (json_to_recordset; psycopg adapts a JSON string far faster than a dozen lists);
    elsewhere one statement per row (executemany)."""

    statement: Executable
    json_columns: Sequence[str] | None  # the columns sent as JSON; None: executemany
    key: str | None = None  # executemany of an UPDATE: the column that finds the row

    def execute(self, conn: Statements, rows: Sequence[Mapping[str, Any]]) -> None:
        if self.json_columns is not None:
            incoming = [{column: row[column] for column in self.json_columns} for row in rows]
            conn.execute(self.statement, {_INCOMING: json.dumps(incoming, default=_json_time)})
        elif self.key is not None:
            key = self.key
            conn.execute(self.statement, [{(_MATCH + k if k == key else k): value for k, value in row.items()} for row in rows])
        else:
            conn.execute(self.statement, rows)


def _incoming(table: Table, columns: Sequence[str]) -> Any:
    """json_to_recordset(:incoming) AS incoming(column1 type1, ...): the rows of a BulkWrite, typed as the table's."""
    as_json = cast(bindparam(_INCOMING, type_=Text), postgresql.JSON)
    return func.json_to_recordset(as_json).table_valued(*[column(c, table.c[c].type) for c in columns]).render_derived(
        name=_INCOMING, with_types=True
    )


def _json_time(value: Any) -> str:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise ValueError("a naive datetime has no place in the database: times are UTC")
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class Pipeline:
    """A PostgreSQL transaction in psycopg's pipeline mode: statements are sent at once and not waited for.

    The server is waited for only when a statement's rows are read, and at the commit: a transaction of many
    statements costs a round trip or two instead of one per statement. Each round trip also costs the calling
    thread a wait for the GIL when it comes back, which, beside busy request threads, takes longer than the
    round trip itself. Statements are SQLAlchemy Core, compiled once for the dialect.
    """

    def __init__(self, conn: Connection, compiled: dict[tuple[Executable, tuple[str, ...]], SQLCompiler]):
        self._conn = conn
        self._compiled = compiled
        self.driver: Any = conn.connection.driver_connection  # a psycopg Connection
        self.last_sql = ""

    def execute(self, statement: Executable, parameters: Parameters = None, /) -> Iterable[Any]:
        rows = parameters if isinstance(parameters, Sequence) else [parameters or {}]
        cursor = self.driver.cursor(row_factory=namedtuple_row)
        states = [self._compiled_for(statement, rows[0]).construct_expanded_state(row) for row in rows]
        self.last_sql = states[0].statement
        if isinstance(parameters, Sequence):
            cursor.executemany(self.last_sql, [_processed(state) for state in states])
        else:
            cursor.execute(self.last_sql, _processed(states[0]))
        return _Rows(cursor)

    def _compiled_for(self, statement: Executable, parameters: Mapping[str, Any]) -> SQLCompiler:
        # As SQLAlchemy does, an INSERT or UPDATE sets the columns its parameters name.
        key = (statement, tuple(sorted(parameters)))
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = statement.compile(dialect=self._conn.dialect, column_keys=list(key[1]))  # type: ignore[attr-defined]
            self._compiled[key] = compiled
        return compiled


class _Rows:
    def __init__(self, cursor: Any):
        self._cursor = cursor

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor.fetchall())  # waits for the server if the rows have not come yet


def _processed(state: Any) -> dict[str, Any]:
    """A statement's parameters as the driver takes them (what SQLAlchemy's types do to them applied)."""
    processors = state.processors
    return {name: processors[name](value) if name in processors else value for name, value in state.parameters.items()}


class _Buffered:
    """Pipeline's interface on a SQLAlchemy connection: statements run at once, their rows kept for later."""

    def __init__(self, conn: Connection):
        self._conn = conn

    def execute(self, statement: Executable, parameters: Parameters = None, /) -> Iterable[Any]:
        result = self._conn.execute(statement, parameters)
        return result.all() if result.returns_rows else []


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
