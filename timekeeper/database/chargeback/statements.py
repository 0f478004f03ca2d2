"""The statements as stored (docs/audit.md): the chain's head, a period's rows as its statement's leaves (the charges
booked in it, then the capacity ledger's hours), a statement appended once whichever replica writes it, and the
statements read back with their rows for `gpusharing verify` and `gpusharing statements export`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Select, func, insert, select, text
from sqlalchemy.exc import IntegrityError

from gpusharing.statements.leaves import CapacityLeaf, ChargeLeaf
from gpusharing.statements.statement import StatedPeriod, note_hash
from gpusharing.statements.verify import StoredStatement
from timekeeper.chargeback.statements import ChainHead, SignedPrice, signed_price
from timekeeper.database.chargeback.prices import PriceLog, in_force
from timekeeper.database.connection import Database
from timekeeper.database.tables import node_capacity, node_hours, pod_hours, pod_ledgers, statements

STREAMED_ROWS = 10_000  # fetched at a time: a month of 10,000 namespaces is a million rows
LEAVES_TIMEOUT_MS = 30 * 60 * 1000  # PostgreSQL's statement timeout while a period's rows are read (sorted first)


@dataclass(frozen=True)
class WrittenStatement:
    """A statement to append: its signed note, its tree and the key in force after it."""

    sequence: int
    period: StatedPeriod | None
    size: int
    root: bytes
    note: bytes
    leaf_hashes: bytes | bytearray | None
    signer: str


class StatementLog:
    def __init__(self, db: Database):
        self.db = db
        self.prices = PriceLog(db)

    def head(self) -> ChainHead | None:
        """The last statement written, and the end of the last period stated."""
        with self.db.read() as conn:
            last = conn.execute(select(statements.c.sequence, statements.c.note, statements.c.signer)
                                .order_by(statements.c.sequence.desc()).limit(1)).first()
            stated_until = conn.execute(select(func.max(statements.c.period_end))).scalar()
        if last is None:
            return None
        return ChainHead(last.sequence, note_hash(last.note), last.signer, stated_until)

    def first_hour(self) -> dt.datetime | None:
        """The ledger's first hour, charged or counted: where the first statement's period lies."""
        with self.db.read() as conn:
            hours = [conn.execute(select(func.min(pod_hours.c.booked_hour))).scalar(),
                     conn.execute(select(func.min(node_hours.c.hour))).scalar()]
        return min((hour for hour in hours if hour is not None), default=None)

    def capacity_counted_until(self) -> dt.datetime | None:
        """Up to when every GPU node still there has been counted in the capacity ledger (None: none is)."""
        with self.db.read() as conn:
            return conn.execute(select(func.min(node_capacity.c.observed_until))
                                .where(node_capacity.c.gone_at.is_(None))).scalar()

    def leaves(self, start: dt.datetime, end: dt.datetime) -> Iterator[bytes]:
        """The rows of the period [start, end) as leaves, in the tree's order: the charges booked in it by booked hour,
        hour, namespace, pod uid and model, then each node's hours by hour and node (names in byte order on every
        backend)."""
        history = self.prices.history()
        prices: dict[tuple[str, dt.datetime], SignedPrice | None] = {}

        def price_of(model: str, hour: dt.datetime) -> SignedPrice | None:
            if (model, hour) not in prices:
                sheet = in_force(history, hour)
                prices[model, hour] = None if sheet is None else signed_price(sheet.sheet.currency,
                                                                              sheet.sheet.price_at(model, hour))
            return prices[model, hour]

        charges, capacity = self.queries(start, end)
        with self.db.read() as conn:
            if not self.db.is_sqlite:  # a period's sort may outlast a request's timeout: it is done once a period
                conn.execute(text(f"SET LOCAL statement_timeout = {LEAVES_TIMEOUT_MS}"))
            for row in conn.execution_options(yield_per=STREAMED_ROWS).execute(charges):
                price = price_of(row.model, row.hour)
                yield ChargeLeaf(row.booked_hour, row.hour, row.namespace or "", row.pod or "", row.pod_uid, row.model,
                                 row.micro_gpu_seconds, row.weighted_micro_gpu_seconds, row.idle_micro_gpu_seconds,
                                 None if price is None else price.of(row.micro_gpu_seconds)).encoded()
            for node in conn.execution_options(yield_per=STREAMED_ROWS).execute(capacity):
                yield CapacityLeaf(node.hour, node.node, node.model, node.capacity_micro_gpu_seconds,
                                   node.down_micro_gpu_seconds).encoded()

    def queries(self, start: dt.datetime, end: dt.datetime) -> tuple[Select[Any], Select[Any]]:
        """The queries of the period [start, end)'s rows, in the tree's order: the charges booked in it, its
        node-hours."""
        charges = (
            select(pod_hours.c.booked_hour, pod_hours.c.hour, pod_ledgers.c.namespace, pod_ledgers.c.pod,
                   pod_hours.c.pod_uid, pod_hours.c.model, pod_hours.c.micro_gpu_seconds,
                   pod_hours.c.weighted_micro_gpu_seconds, pod_hours.c.idle_micro_gpu_seconds)
            .select_from(pod_hours.join(pod_ledgers, pod_ledgers.c.pod_uid == pod_hours.c.pod_uid, isouter=True))
            .where(pod_hours.c.booked_hour >= start, pod_hours.c.booked_hour < end)
            .order_by(pod_hours.c.booked_hour, pod_hours.c.hour, self._bytewise(pod_ledgers.c.namespace),
                      self._bytewise(pod_hours.c.pod_uid), self._bytewise(pod_hours.c.model))
        )
        capacity = (
            select(node_hours).where(node_hours.c.hour >= start, node_hours.c.hour < end)
            .order_by(node_hours.c.hour, self._bytewise(node_hours.c.node))
        )
        return charges, capacity

    def append(self, statement: WrittenStatement, now: dt.datetime) -> bool:
        """Writes `statement` after the head; False when another replica wrote that statement (or that period's)
        first: its sequence and its period are each written once."""
        row: dict[str, Any] = {
            "sequence": statement.sequence, "tree_size": statement.size, "root": statement.root,
            "note": statement.note, "leaf_hashes": statement.leaf_hashes, "signer": statement.signer,
            "period_start": statement.period.start if statement.period else None,
            "period_end": statement.period.end if statement.period else None, "written_at": now,
        }
        try:
            with self.db.write() as conn:
                conn.execute(insert(statements), [row])
        except IntegrityError:
            return False
        return True

    def stored(self, start: dt.datetime | None = None, end: dt.datetime | None = None,
               with_rows: bool = True) -> Iterator[StoredStatement]:
        """The statements in the chain's order (those of periods that start in [start, end), and the key handovers
        between them, when given), each with its period's rows as they are now."""
        query = select(statements.c.sequence, statements.c.note, statements.c.leaf_hashes, statements.c.period_start,
                       statements.c.period_end).order_by(statements.c.sequence)
        with self.db.read() as conn:
            sequences = self._window(conn, start, end)
            if sequences is not None:
                query = query.where(statements.c.sequence >= sequences[0], statements.c.sequence <= sequences[1])
            listed = conn.execute(query.with_only_columns(statements.c.sequence, statements.c.period_start,
                                                          statements.c.period_end)).all()
        for sequence, period_start, period_end in listed:
            with self.db.read() as conn:
                row = conn.execute(query.where(statements.c.sequence == sequence)).one()
            rows: Callable[[], Iterator[bytes]] | None = None
            if with_rows and period_start is not None:
                rows = lambda start=period_start, end=period_end: self.leaves(start, end)  # noqa: E731
            yield StoredStatement(sequence, f"the statements row of sequence {sequence}", row.note, row.leaf_hashes,
                                  rows)

    def note(self, sequence: int) -> bytes | None:
        """Statement `sequence`'s signed note as held; None when there is none."""
        with self.db.read() as conn:
            return conn.execute(select(statements.c.note).where(statements.c.sequence == sequence)).scalar()

    def signers(self) -> list[str]:
        """Every verifier key the chain was signed with, in the order it came into force."""
        with self.db.read() as conn:
            keys = conn.execute(select(statements.c.signer).order_by(statements.c.sequence)).scalars()
            return list(dict.fromkeys(keys))

    def _window(self, conn: Any, start: dt.datetime | None, end: dt.datetime | None) -> tuple[int, int] | None:
        """The sequences from the first statement of a period starting in [start, end) to the last one's."""
        if start is None and end is None:
            return None
        periods = select(func.min(statements.c.sequence), func.max(statements.c.sequence)).where(
            statements.c.period_start.is_not(None))
        if start is not None:
            periods = periods.where(statements.c.period_start >= start)
        if end is not None:
            periods = periods.where(statements.c.period_start < end)
        first, last = conn.execute(periods).one()
        return (0, -1) if first is None else (first, last)

    def _bytewise(self, column: ColumnElement[str]) -> ColumnElement[str]:
        """`column` ordered by its bytes: SQLite's default; PostgreSQL's default follows the database's locale."""
        return column if self.db.is_sqlite else column.collate("C")

