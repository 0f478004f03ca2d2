"""The GPU capacity ledger as stored (docs/chargeback.md): each GPU node's cursor (node_capacity) and what it offered
per UTC hour (node_hours), written by the controller's `capacity` task, exactly once whoever observes; and its reads,
each node-hour's capacity beside what its pods were billed in it (timekeeper.chargeback.capacity has the arithmetic).
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, func, select

from gpusharing.gpu.capacity import NodeGpus
from timekeeper.chargeback.capacity import (
    Advance,
    Cursor,
    NodeHour,
    NodeTime,
    Utilisation,
    advance,
    node_hour_figures,
    utilisation,
)
from timekeeper.database.connection import Database
from timekeeper.database.tables import node_capacity, node_hours, pod_hours, pod_ledgers

STREAMED_ROWS = 10_000  # fetched at a time: a month of 500 nodes is 360,000 node-hours
_TIME = ("capacity_micro_gpu_seconds", "down_micro_gpu_seconds")
_HELD = ("allocated", "idle")
_CURSOR = ("uid", "model", "micro_gpus", "ready", "observed_until", "gone_at")


@dataclass(frozen=True)
class CapacityPass:
    """What one observation recorded: the nodes whose cursors moved, those seen first and those gone, the time added."""

    advanced: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    added: NodeTime = NodeTime(0)


class CapacityLedger:
    """The nodes' cursors moved and their time added (`observe`, the controller's leader); node-hours read."""

    def __init__(self, db: Database):
        self.db = db
        lock = select(node_capacity).order_by(node_capacity.c.node)
        self._lock = lock if db.is_sqlite else lock.with_for_update()
        self._start = db.insert(node_capacity).on_conflict_do_nothing().returning(node_capacity.c.node)
        self._move = db.bulk_update(node_capacity, "node", _CURSOR)
        self._add = db.bulk_insert(
            node_hours,
            ["node", "hour", "model", *_TIME],
            lambda insert: insert.on_conflict_do_update(
                index_elements=[node_hours.c.node, node_hours.c.hour],
                set_={column: node_hours.c[column] + insert.excluded[column] for column in _TIME},
            ),
        )

    def observe(self, nodes: Mapping[str, NodeGpus], now: dt.datetime) -> CapacityPass:
        """Moves every GPU node's cursor to `now` in one transaction (PostgreSQL: the cursors locked in node order, as
        every observer locks them), adding the time between to its hours; `nodes` is the cache's, by name. The ledger
        starts with the controller: a node seen first is recorded from its creation if within the hour, else from now;
        a node gone, re-created or observed late: timekeeper.chargeback.capacity.advance."""
        with self.db.write() as conn:
            cursors = {row.node: _cursor(row) for row in conn.execute(self._lock)}
            advances = [moved for name in sorted(cursors.keys() | nodes.keys())
                        if (moved := advance(name, cursors.get(name), nodes.get(name), now)) is not None]
            new = [_row(moved.cursor) for moved in advances if moved.new]
            # Another observer may have started the same node since the lock: whoever inserted its cursor adds its time.
            started = set(conn.execute(self._start, new).scalars()) if new else set()
            advances = [moved for moved in advances if not moved.new or moved.cursor.node in started]
            moved_rows = [_row(moved.cursor) for moved in advances if not moved.new]
            if moved_rows:
                self._move.execute(conn, moved_rows)
            hours = _hour_rows(advances)
            if hours:
                self._add.execute(conn, hours)
        return CapacityPass(
            [moved.cursor.node for moved in advances], sorted(started), [m.cursor.node for m in advances if m.gone],
            sum((time for moved in advances for time in moved.added.values()), NodeTime(0)),
        )

    def node_hours(self, start: dt.datetime, end: dt.datetime, limit: int | None = None) -> list[NodeHour]:
        """Each node-hour of [start, end): its capacity and down time as recorded beside what the pods bound to the node
        were billed in the hour (every row of the hour, corrections included, whatever their model), by node and hour;
        then a line per model of what pods were billed on a node-hour not recorded, those on no node last."""
        with self.db.read() as conn:
            return list(itertools.islice(_lines(conn, start, end), limit))

    def unallocated(self, start: dt.datetime, end: dt.datetime) -> dict[dt.datetime, dict[str, int]]:
        """Each hour's capacity nobody held, by model, against what pods were billed on time (`booked_hour` the hour):
        what exports show, so that a closed hour's line never changes when a correction comes for it."""
        left: dict[dt.datetime, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        with self.db.read() as conn:
            for line in _lines(conn.execution_options(yield_per=STREAMED_ROWS), start, end, on_time=True):
                if line.figures.unallocated:
                    left[line.hour][line.model] += line.figures.unallocated
        return {hour: dict(models) for hour, models in sorted(left.items())}

    def utilization(self, start: dt.datetime, end: dt.datetime) -> Utilisation:
        """The cluster's and each GPU model's figures over [start, end): the sums of its node-hours', streamed."""
        with self.db.read() as conn:
            return utilisation(_lines(conn.execution_options(yield_per=STREAMED_ROWS), start, end))


def _lines(conn: Connection, start: dt.datetime, end: dt.datetime, on_time: bool = False) -> Iterator[NodeHour]:
    """CapacityLedger.node_hours's lines, as the database sends them: two GROUP BYs over the window's pod_hours (one
    beside node_hours, one for the rest), so that what is read is a row per node-hour, whatever the number of pods;
    `on_time`: only what was booked while the hour's billing period was open."""
    billed = pod_hours.join(pod_ledgers, pod_ledgers.c.pod_uid == pod_hours.c.pod_uid)
    in_window = (pod_hours.c.hour >= start, pod_hours.c.hour < end,
                 *((pod_hours.c.booked_hour == pod_hours.c.hour,) if on_time else ()))
    sums = (func.sum(pod_hours.c.micro_gpu_seconds), func.sum(pod_hours.c.idle_micro_gpu_seconds))
    held = (select(pod_ledgers.c.node, pod_hours.c.hour, *(total.label(name) for total, name in zip(sums, _HELD)))
            .select_from(billed).where(*in_window).group_by(pod_ledgers.c.node, pod_hours.c.hour).subquery())
    recorded = (
        select(node_hours.c.node, node_hours.c.hour, node_hours.c.model, *(node_hours.c[c] for c in _TIME),
               *(func.coalesce(held.c[column], 0) for column in _HELD))
        .select_from(node_hours.outerjoin(held, _at_node_hour(held.c.node, held.c.hour)))
        .where(node_hours.c.hour >= start, node_hours.c.hour < end)
        .order_by(node_hours.c.node, node_hours.c.hour)
    )
    elsewhere = (
        select(pod_ledgers.c.node, pod_hours.c.hour, pod_hours.c.model, *sums)
        .select_from(billed.outerjoin(node_hours, _at_node_hour(pod_ledgers.c.node, pod_hours.c.hour)))
        .where(*in_window, node_hours.c.node.is_(None))
        .group_by(pod_ledgers.c.node, pod_hours.c.hour, pod_hours.c.model)
        .order_by(pod_ledgers.c.node.nulls_last(), pod_hours.c.hour, pod_hours.c.model)
    )
    for node, hour, model, capacity, down, allocated, idle in conn.execute(recorded):
        yield NodeHour(node, hour, model, node_hour_figures(capacity, down, int(allocated), int(idle)))
    for node, hour, model, allocated, idle in conn.execute(elsewhere):
        yield NodeHour(node, hour, model, node_hour_figures(0, 0, int(allocated), int(idle)))


def _at_node_hour(node: ColumnElement[str | None], hour: ColumnElement[dt.datetime]) -> ColumnElement[bool]:
    return (node_hours.c.node == node) & (node_hours.c.hour == hour)


def _cursor(row: Row[Any]) -> Cursor:
    return Cursor(row.node, row.uid, row.model, row.micro_gpus, row.ready, row.observed_until, row.gone_at)


def _row(cursor: Cursor) -> dict[str, Any]:
    return {"node": cursor.node, **{column: getattr(cursor, column) for column in _CURSOR}}


def _hour_rows(advances: list[Advance]) -> list[dict[str, Any]]:
    """The time added, a row per node and hour (rows locked in key order), each of the first model recorded in it."""
    rows: dict[tuple[str, dt.datetime], dict[str, Any]] = {}
    for moved in advances:
        for (hour, model), time in moved.added.items():
            row = rows.setdefault((moved.cursor.node, hour), {"node": moved.cursor.node, "hour": hour, "model": model,
                                                              **dict.fromkeys(_TIME, 0)})
            row["capacity_micro_gpu_seconds"] += time.capacity
            row["down_micro_gpu_seconds"] += time.down
    return [row for _, row in sorted(rows.items()) if row["capacity_micro_gpu_seconds"]]
