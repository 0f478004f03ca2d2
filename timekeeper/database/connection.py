"""The database connection: PostgreSQL, or an embedded SQLite file with its writes serialized."""

from __future__ import annotations

import datetime as dt
import fcntl
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
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
from sqlalchemy.sql import Executable, Insert

from timekeeper.database.base import UtcDateTime
from timekeeper.database.statements import Parameters, Pipeline, PreparedStatements, SqliteStatements

_BEGIN = "timekeeper_sqlite_begin"
CONNECT_TIMEOUT_SECONDS = 5  # an unreachable server is reported (503, /readyz) rather than waited for
STATEMENT_TIMEOUT_MS = 30_000  # PostgreSQL's statement_timeout for every statement of the timekeeper's


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
        # SQLite's statements are compiled for its own driver's parameters; PostgreSQL's for PREPARE.
        dialect: Any = self.engine.dialect
        self._statements = (
            PreparedStatements(dialect, typed_rows=True) if self.is_sqlite
            else PreparedStatements(type(dialect)(paramstyle="numeric_dollar"), typed_rows=False)
        )

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
                yield SqliteStatements(conn, self._statements)
            return
        # Autocommit: the transaction is the pipeline's own BEGIN ... COMMIT, sent with its first and last statements.
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
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
        statement = on_conflict(postgresql.insert(table).from_select(columns, select(*incoming.c)))
        return BulkWrite(statement, columns, times=_times(table, columns))

    def bulk_update(self, table: Table, key: str, columns: Sequence[str]) -> BulkWrite:
        """An UPDATE of many rows, each found by its `key` column and given new `columns`."""
        everything = [key, *columns]
        incoming = _sqlite_incoming(everything) if self.is_sqlite else _incoming(table, everything)
        update = table.update().where(table.c[key] == incoming.c[key]).values({c: incoming.c[c] for c in columns})
        if self.is_sqlite:
            return self._sqlite_write(update, table, everything)
        return BulkWrite(update, everything, times=_times(table, everything))

    def _sqlite_write(self, statement: Executable, table: Table, columns: Sequence[str]) -> BulkWrite:
        """SQLite's: each column's value written as its type's bind processor writes it (times and dates as text)."""
        stored = [table.c[c].type._cached_bind_processor(self.engine.dialect) for c in columns]
        alike = {c: dt.datetime if isinstance(table.c[c].type, UtcDateTime) else dt.date for c in columns
                 if type(table.c[c].type) in (UtcDateTime, Date)}
        return BulkWrite(statement, columns, stored, alike)

    def dispose(self) -> None:
        self.engine.dispose()


_INCOMING = "incoming"
_encode = msgspec.json.Encoder().encode  # several times json.dumps's speed; a batch's rows are written in one text


def _times(table: Table, columns: Sequence[str]) -> list[str]:
    return [c for c in columns if isinstance(table.c[c].type, UtcDateTime)]


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
    # PostgreSQL: the columns of times, each checked to be UTC before it is written.
    times: Sequence[str] = ()

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
            conn.execute(self.statement, {_INCOMING: _encode(incoming).decode()})
            return
        # PostgreSQL reads each row's columns by name and ignores any other key: the rows are written as they are,
        # times in RFC 3339 (msgspec's), once each row is known to hold every column (else it would write NULL) and
        # each time to be UTC.
        named = set(self.columns)
        for row in rows:
            if not row.keys() >= named:
                raise KeyError(f"a row without {sorted(named - row.keys())}")
            for c in self.times:
                value = row[c]
                if value is not None and value.utcoffset() is None:
                    raise ValueError("a naive datetime has no place in the database: times are UTC")
        conn.execute(self.statement, {_INCOMING: _encode(rows).decode()})


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
