"""The database connection: PostgreSQL, or an embedded SQLite file with its writes serialized."""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import (
    ColumnElement,
    Connection,
    Date,
    Engine,
    Float,
    Table,
    Text,
    bindparam,
    cast,
    column,
    create_engine,
    event,
    func,
    literal_column,
    select,
    true,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement, Executable, Insert
from sqlalchemy.sql.compiler import SQLCompiler

from timekeeper.database.base import UtcDateTime

_BEGIN = "timekeeper_sqlite_begin"
CONNECT_TIMEOUT_SECONDS = 5  # an unreachable server is reported (503, /readyz) rather than waited for
STATEMENT_TIMEOUT_MS = 30_000  # PostgreSQL's statement_timeout for every statement of the timekeeper's

Parameters = Mapping[str, Any] | Sequence[Mapping[str, Any]] | None


class Statements(Protocol):
    """What runs statements in a transaction: a SQLAlchemy Connection, or a Pipeline.

    The rows of a statement are iterated once; a Pipeline sends them only when they are read.
    """

    def execute(self, statement: Executable, parameters: Parameters = None, /) -> Iterable[Any]: ...


class DatabaseSettings(Protocol):
    """What Database.from_config reads of a role's settings (timekeeper.config.TimekeeperConfig has them)."""

    @property
    def database_url(self) -> str: ...
    @property
    def db_pool_size(self) -> int: ...
    @property
    def sqlite_busy_timeout_ms(self) -> int: ...
    @property
    def db_statement_timeout_seconds(self) -> float: ...


class Database:
    def __init__(self, url: str, pool_size: int = 10, sqlite_busy_timeout_ms: int = 10_000,
                 statement_timeout_ms: int = STATEMENT_TIMEOUT_MS):
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        if self.is_sqlite:
            self.engine = _sqlite_engine(url, pool_size, sqlite_busy_timeout_ms)
        else:
            # No pre-ping: it would cost a round trip per transaction; a dropped connection fails one request (503).
            # A statement that runs (or waits for a lock) past the timeout is cancelled by the server: a 503, not a
            # request thread held.
            self.engine = create_engine(
                url,
                pool_size=pool_size,
                max_overflow=pool_size,
                connect_args={
                    "connect_timeout": CONNECT_TIMEOUT_SECONDS,
                    "options": f"-c statement_timeout={statement_timeout_ms}",
                },
            )
        self._write_lock = _WriterLock(self.engine.url.database) if self.is_sqlite else None
        self._statements = None if self.is_sqlite else PreparedStatements(self.engine.dialect)

    @classmethod
    def from_config(cls, config: DatabaseSettings) -> Database:
        """The database of the role's settings (TimekeeperConfig), read by their names: this layer imports no role's
        configuration. Prefer passing the plain values to Database() itself."""
        return cls(
            config.database_url,
            config.db_pool_size,
            config.sqlite_busy_timeout_ms,
            int(config.db_statement_timeout_seconds * 1000),
        )

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
        # Autocommit: the transaction is the pipeline's own BEGIN ... COMMIT, sent with its first and last statements.
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            assert self._statements is not None
            pipeline = Pipeline(conn, self._statements)
            try:
                yield pipeline
                pipeline.send("COMMIT")
            except BaseException as failed:
                dbapi_error = self.engine.dialect.loaded_dbapi.Error
                if isinstance(failed, dbapi_error):
                    # Dropped, or its prepared statements unknown (a message stops at its first error): not reused.
                    conn.invalidate()
                    raise DBAPIError.instance(pipeline.last_sql, None, failed, dbapi_error) from failed
                pipeline.driver.execute("ROLLBACK")  # nothing failed on the server: the connection is sound
                raise

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    def clock(self) -> ColumnElement[float]:
        """The database's time, in seconds since the epoch, as an SQL expression: the one clock that every replica and
        worker reads alike, for whatever they compare."""
        if self.is_sqlite:
            return cast((func.julianday("now") - 2440587.5) * 86400.0, Float)
        return cast(func.extract("epoch", func.clock_timestamp()), Float)

    def now(self) -> dt.datetime:
        """The database's time: what replicas compare (commitments' deadlines, crossings and listings) is read from
        this one clock, never from each process's own."""
        with self.read() as conn:
            return dt.datetime.fromtimestamp(float(conn.execute(select(self.clock())).scalar_one()), dt.timezone.utc)

    def insert(self, table: Table) -> sqlite.Insert | postgresql.Insert:
        """An INSERT that knows ON CONFLICT on this backend."""
        return sqlite.insert(table) if self.is_sqlite else postgresql.insert(table)

    def bulk_insert(self, table: Table, columns: Sequence[str], on_conflict: Callable[[Any], Insert]) -> BulkWrite:
        """An INSERT of many rows, each with `columns`; on_conflict adds its ON CONFLICT clause."""
        if self.is_sqlite:
            # WHERE: SQLite reads the ON CONFLICT of an INSERT ... SELECT only after one.
            rows = select(*_sqlite_incoming(columns).c).where(true())
            return self._sqlite_write(on_conflict(sqlite.insert(table).from_select(columns, rows)), table, columns)
        incoming = _incoming(table, columns)
        return BulkWrite(on_conflict(postgresql.insert(table).from_select(columns, select(*incoming.c))), columns)

    def bulk_update(self, table: Table, key: str, columns: Sequence[str]) -> BulkWrite:
        """An UPDATE of many rows, each found by its `key` column and given new `columns`."""
        everything = [key, *columns]
        incoming = _sqlite_incoming(everything) if self.is_sqlite else _incoming(table, everything)
        update = table.update().where(table.c[key] == incoming.c[key]).values({c: incoming.c[c] for c in columns})
        return self._sqlite_write(update, table, everything) if self.is_sqlite else BulkWrite(update, everything)

    def _sqlite_write(self, statement: Executable, table: Table, columns: Sequence[str]) -> BulkWrite:
        """SQLite's: each column's value written as its type's bind processor writes it (times and dates as text)."""
        stored = [table.c[c].type._cached_bind_processor(self.engine.dialect) for c in columns]
        alike = {c: dt.datetime if isinstance(table.c[c].type, UtcDateTime) else dt.date for c in columns
                 if type(table.c[c].type) in (UtcDateTime, Date)}
        return BulkWrite(statement, columns, stored, alike)

    def dispose(self) -> None:
        self.engine.dispose()


_INCOMING = "incoming"


@dataclass(frozen=True)
class BulkWrite:
    """A statement that writes many rows at once, whatever their number, sent as one JSON array (PostgreSQL:
    json_to_recordset; SQLite: json_each), which costs far less per row than lists of parameters or executemany."""

    statement: Executable
    columns: Sequence[str]
    # SQLite: each column's bind processor, applied before the JSON (which then holds what the database stores);
    # None: PostgreSQL, whose json_to_recordset reads times and dates as they are written in JSON.
    stored: Sequence[Callable[[Any], Any] | None] | None = None
    # SQLite: the columns whose processor writes equal values of this type alike (UtcDateTime's, in UTC; Date's).
    alike: Mapping[str, type] = field(default_factory=dict)

    def execute(self, conn: Statements, rows: Sequence[Mapping[str, Any]]) -> None:
        if self.stored is not None:
            seen: dict[tuple[str, Any], Any] = {}  # a batch's rows share their instants and days (its `now`)
            columns = list(zip(self.columns, self.stored, [self.alike.get(c) for c in self.columns]))
            incoming: list[dict[str, Any]] = []
            for row in rows:
                incoming.append(out := {})
                for c, process, alike in columns:
                    value = out[c] = row[c]
                    if process is not None and type(value) is alike:  # processed once per column and batch
                        out[c] = seen[c, value] if (c, value) in seen else seen.setdefault((c, value), process(value))
                    elif process is not None:
                        out[c] = process(value)
            conn.execute(self.statement, {_INCOMING: json.dumps(incoming)})
            return
        times: dict[Any, str] = {}  # a batch's rows share their instants (its `now`): each written once

        def as_json(value: Any) -> str:
            written = times.get(value)
            if written is None:
                written = times[value] = _json_time(value)
            return written

        incoming = [{column: row[column] for column in self.columns} for row in rows]
        conn.execute(self.statement, {_INCOMING: json.dumps(incoming, default=as_json)})


def _sqlite_incoming(columns: Sequence[str]) -> Any:
    """SELECT json_extract(value, '$.column1') AS column1, ... FROM json_each(:incoming): a BulkWrite's rows on
    SQLite."""
    each = func.json_each(bindparam(_INCOMING, type_=Text)).table_valued("value")
    return select(*(func.json_extract(each.c.value, literal_column(f"'$.{c}'")).label(c) for c in columns)).subquery(
        _INCOMING
    )


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
    """A PostgreSQL transaction whose statements travel together: one message per round trip.

    Statements are queued, not sent; the queue goes to the server in one message (the simple query protocol) when a
    queued statement's rows are first read, and at the commit, so a batch of reports takes two round trips whatever its
    size. Each statement is prepared once per connection, then EXECUTEd with its parameters bound by psycopg, so that
    the server does not plan it again. Why not psycopg's pipeline mode: docs/design/controller.md, "The ledger's
    transactions".
    """

    def __init__(self, conn: Connection, statements: PreparedStatements):
        from psycopg import ClientCursor  # imported here: a timekeeper on SQLite never loads the PostgreSQL driver
        from psycopg.rows import namedtuple_row

        self._statements = statements
        driver = conn.connection.driver_connection  # a psycopg Connection, in autocommit mode
        assert driver is not None
        self.driver: Any = driver
        self._prepared = statements.prepared_on(self.driver)
        self._preparing: set[str] = set()
        self._cursor = ClientCursor(self.driver, row_factory=namedtuple_row)
        self._queued: list[tuple[str, _Rows | None]] = [("BEGIN", None)]
        self.last_sql = ""

    def execute(self, statement: Executable, parameters: Parameters = None, /) -> Iterable[Any]:
        rows = parameters if isinstance(parameters, Sequence) else [parameters or {}]
        result = _Rows(self)
        for row in rows:
            name, sql, values = self._statements.bind(statement, row)
            if name not in self._prepared and name not in self._preparing:
                self._queued.append((f"PREPARE {name} AS {sql}", None))
                self._preparing.add(name)
            arguments = f"({self._cursor.mogrify(', '.join(['%s'] * len(values)), values)})" if values else ""
            self._queued.append((f"EXECUTE {name}{arguments}", result))
        return result

    def send(self, *then: str) -> None:
        """Sends the queued statements and `then` in one message, and keeps their rows."""
        queued = self._queued + [(sql, None) for sql in then]
        self._queued = []
        self.last_sql = ";\n".join(sql for sql, _ in queued)
        self._cursor.execute(self.last_sql)
        self._prepared |= self._preparing
        self._preparing.clear()
        for _, result in queued:  # one result per statement, in order
            if result is not None:
                result.sent = True
                if self._cursor.description is not None:
                    result.rows.extend(self._cursor.fetchall())
            self._cursor.nextset()


class PreparedStatements:
    """SQLAlchemy Core statements compiled for PREPARE (positional $n parameters), and what each connection has."""

    def __init__(self, dialect: Any):
        self._dialect = type(dialect)(paramstyle="numeric_dollar")
        self._shapes: dict[tuple[Executable, tuple[str, ...], tuple[int, ...]], _Shape] = {}
        self._prepared: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()

    def prepared_on(self, driver_connection: Any) -> set[str]:
        """The names prepared on that connection (a new connection has none)."""
        return self._prepared.setdefault(driver_connection, set())

    def bind(self, statement: Executable, parameters: Mapping[str, Any]) -> tuple[str, str, list[Any]]:
        """(name, SQL to prepare, positional values): a name per distinct SQL."""
        # IN lists are padded to a power of two (a repeated element changes nothing): few shapes to prepare.
        padded = {name: _padded(value) if isinstance(value, list) else value for name, value in parameters.items()}
        names = tuple(sorted(padded))
        key = (statement, names, tuple(len(padded[name]) for name in names if isinstance(padded[name], list)))
        shape = self._shapes.get(key)
        if shape is None:
            # As SQLAlchemy does, an INSERT or UPDATE sets the columns its parameters name.
            assert isinstance(statement, ClauseElement)  # every Executable this runs is one
            compiled = statement.compile(dialect=self._dialect, column_keys=list(names))
            assert isinstance(compiled, SQLCompiler)
            shape = self._shapes[key] = _Shape.of(compiled.construct_expanded_state(padded), padded)
        return shape.name, shape.sql, shape.values(padded)


@dataclass(frozen=True)
class _Shape:
    """A statement expanded for one set of parameter names and IN-list lengths (expanding it costs more than running
    it)."""

    name: str
    sql: str
    # Where each $n comes from: (parameter, index in its IN list or None, processor), or (None, constant, None).
    sources: tuple[tuple[str | None, Any, Callable[[Any], Any] | None], ...]

    @classmethod
    def of(cls, state: Any, parameters: Mapping[str, Any]) -> _Shape:
        expanded = {
            item: (name, index) for name, items in state.parameter_expansion.items() for index, item in enumerate(items)
        }
        sources: list[tuple[str | None, Any, Callable[[Any], Any] | None]] = []
        for name, value in zip(state.positiontup or (), state.positional_parameters or ()):
            processor = state.processors.get(name)
            if name in expanded:
                sources.append((expanded[name][0], expanded[name][1], processor))
            elif name in parameters:
                sources.append((name, None, processor))
            else:  # a value the statement itself holds
                sources.append((None, processor(value) if processor else value, None))
        return cls("tk_" + hashlib.sha1(state.statement.encode()).hexdigest()[:20], state.statement, tuple(sources))

    def values(self, parameters: Mapping[str, Any]) -> list[Any]:
        values = []
        for name, where, processor in self.sources:
            if name is None:
                values.append(where)
                continue
            value = parameters[name] if where is None else parameters[name][where]
            values.append(processor(value) if processor else value)
        return values


def _padded(values: list[Any]) -> list[Any]:
    size = 1
    while size < len(values):
        size *= 2
    return values + values[-1:] * (size - len(values))


class _Rows:
    """The rows of a queued statement: reading them sends the queue."""

    def __init__(self, pipeline: Pipeline):
        self._pipeline = pipeline
        self.rows: list[Any] = []
        self.sent = False

    def __iter__(self) -> Iterator[Any]:
        if not self.sent:
            self._pipeline.send()
        return iter(self.rows)


class _Buffered:
    """Pipeline's interface on a SQLAlchemy connection: statements run at once, their rows kept for later."""

    def __init__(self, conn: Connection):
        self._conn = conn

    def execute(self, statement: Executable, parameters: Parameters = None, /) -> Iterable[Any]:
        result = self._conn.execute(statement, parameters)
        return result.all() if result.returns_rows else []


class _WriterLock:
    """SQLite has one writer at a time: the timekeeper's writers, threads and processes, queue on a lock file, which
    wakes the next as soon as the last is done (BEGIN IMMEDIATE alone would have it poll with sleeps of up to 100 ms).
    BEGIN IMMEDIATE and the busy timeout still guard against other writers (a migration, a second tool)."""

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
