"""Statements compiled once per shape (parameter names, IN-list lengths) for a driver's own positional parameters,
and the two ways a write transaction runs them: PostgreSQL's pipeline, all of a batch's statements in one message
per round trip; SQLite's driver connection, each at once. SQLAlchemy compiles; these run what it compiled, since its
execution around a statement costs as much as the database's own work on a batch's, or more (docs/design/controller.md,
"The ledger's transactions")."""

from __future__ import annotations

import hashlib
import sqlite3
import weakref
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.sql.compiler import SQLCompiler

Parameters = Mapping[str, Any] | Sequence[Mapping[str, Any]] | None


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
            shape, values = self._statements.bind(statement, row)
            name, sql = shape.name, shape.sql
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
    """SQLAlchemy Core statements compiled once per shape for a driver's positional parameters (PostgreSQL's PREPARE,
    numeric_dollar; SQLite's qmark), and what each connection has prepared."""

    def __init__(self, dialect: Any, typed_rows: bool):
        self._dialect = dialect
        self._typed_rows = typed_rows  # whether rows are made here (SQLite's), or by the driver (psycopg's)
        self._shapes: dict[tuple[Executable, tuple[str, ...], tuple[int, ...]], _Shape] = {}
        self._prepared: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()

    def prepared_on(self, driver_connection: Any) -> set[str]:
        """The names prepared on that connection (a new connection has none)."""
        return self._prepared.setdefault(driver_connection, set())

    def bind(self, statement: Executable, parameters: Mapping[str, Any]) -> tuple[_Shape, list[Any]]:
        """The statement's shape for these parameters (a name per distinct SQL), and their positional values."""
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
            shape = self._shapes[key] = _Shape.of(
                compiled, compiled.construct_expanded_state(padded), padded, self._typed_rows
            )
        return shape, shape.values(padded)


@dataclass(frozen=True)
class _Shape:
    """A statement expanded for one set of parameter names and IN-list lengths (expanding it costs more than running
    it)."""

    name: str
    sql: str
    # Where each $n comes from: (parameter, index in its IN list or None, processor), or (None, constant, None).
    sources: tuple[tuple[str | None, Any, Callable[[Any], Any] | None], ...]
    # Its rows as SQLAlchemy would type them, when they are made here: named by their columns, each value through its
    # type's processor (None: returns no rows, or psycopg makes them).
    row: type | None
    processors: tuple[Callable[[Any], Any] | None, ...]

    @classmethod
    def of(cls, compiled: SQLCompiler, state: Any, parameters: Mapping[str, Any], typed_rows: bool) -> _Shape:
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
        columns = compiled._result_columns if typed_rows else []
        row = namedtuple("Row", [column.name for column in columns], rename=True) if columns else None
        processors = tuple(column.type._cached_result_processor(compiled.dialect, None) for column in columns)
        name = "tk_" + hashlib.sha1(state.statement.encode()).hexdigest()[:20]
        return cls(name, state.statement, tuple(sources), row, processors)

    def values(self, parameters: Mapping[str, Any]) -> list[Any]:
        values = []
        for name, where, processor in self.sources:
            if name is None:
                values.append(where)
                continue
            value = parameters[name] if where is None else parameters[name][where]
            values.append(processor(value) if processor else value)
        return values

    def rows(self, fetched: Iterable[Sequence[Any]]) -> list[Any]:
        """What the driver fetched, typed and named as SQLAlchemy's rows would be."""
        assert self.row is not None
        make = self.row._make  # type: ignore[attr-defined]
        if not any(self.processors):
            return [make(values) for values in fetched]
        processors = self.processors
        return [make([p(v) if p else v for p, v in zip(processors, values)]) for values in fetched]


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


class SqliteStatements:
    """Pipeline's interface on SQLite, in a write transaction: each statement compiled once per shape, then run on the
    driver's connection at once, its rows typed as SQLAlchemy's would be."""

    def __init__(self, conn: Connection, statements: PreparedStatements):
        self._driver: Any = conn.connection.driver_connection
        self._statements = statements

    def execute(self, statement: Executable, parameters: Parameters = None, /) -> Iterable[Any]:
        rows: list[Any] = []
        for row in parameters if isinstance(parameters, Sequence) else [parameters or {}]:
            shape, values = self._statements.bind(statement, row)
            try:
                cursor = self._driver.execute(shape.sql, values)
                fetched = cursor.fetchall() if shape.row is not None else ()
            except sqlite3.Error as failed:  # raised as SQLAlchemy raises it; the transaction is rolled back
                raise DBAPIError.instance(shape.sql, values, failed, sqlite3.Error) from failed
            if fetched:
                rows.extend(shape.rows(fetched))
        return rows
