"""The GPU capacity ledger's arithmetic (docs/chargeback.md): what each GPU node offered per UTC hour and the part of
it the node was down, and how each node-hour's capacity splits into allocated, unallocated and down, exactly.

Capacity is the node's micro-GPUs × time, counted cumulatively from the epoch: a node of G micro-GPUs has offered
G × (t's microseconds since the epoch) // 10^6 micro-GPU-seconds by t, and a stretch of its time is the difference at
its ends. Cut at hours, at a change of Ready and at each observation, the parts telescope to the whole, whatever the
rounding.

A node's cursor says up to when its time is recorded; each observation moves it to `now` and adds the time between:
- a node seen for the first time starts from its creation if that is within the last hour, else from now (the ledger
  starts with the controller: time before it is not guessed);
- the time since the cursor is the node's GPUs as read now; down where the Ready condition is not True, split at the
  condition's lastTransitionTime when it falls inside (before it, the other way: the record says when it last
  changed, not how often before);
- a node absent from the cache for GONE_AFTER is gone: the time since its cursor is capacity and down, and nothing
  more is recorded of it (absent for less, it may be a cache that has not caught up: its time waits);
- a node re-created under its name (another uid) closes the old cursor as gone up to where the new one starts;
- an observation older than the cursor adds nothing, so each second is recorded once whoever observes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import groupby
from operator import attrgetter
from typing import NamedTuple

from gpusharing.gpu.capacity import NodeGpus
from gpusharing.units.weights import MICROS_PER_SECOND
from timekeeper.accounting.hours import HOUR, hour_of

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
MICROSECOND = dt.timedelta(microseconds=1)
FIRST_SEEN_WITHIN = HOUR  # a new node's time from its creation is recorded when it was created this recently
GONE_AFTER = dt.timedelta(minutes=2)  # longer than a watch lags: absent this long from the cache, a node is gone


def micro_gpus(gpus: float) -> int:
    """GPUs (MIG slices as their fraction) in millionths."""
    return round(gpus * MICROS_PER_SECOND)


def offered(micro: int, at: dt.datetime) -> int:
    """What `micro` micro-GPUs offer from the epoch to `at`, in whole micro-GPU-seconds (rounded down)."""
    return micro * ((at - EPOCH) // MICROSECOND) // MICROS_PER_SECOND


@dataclass(frozen=True)
class NodeTime:
    """A node's capacity over some time, and the part of it it was down, micro-GPU-seconds."""

    capacity: int
    down: int = 0

    def __add__(self, other: NodeTime) -> NodeTime:
        return NodeTime(self.capacity + other.capacity, self.down + other.down)


@dataclass(frozen=True)
class Stretch:
    """A stretch of a node's time, down or not."""

    start: dt.datetime
    end: dt.datetime
    down: bool


def stretches(start: dt.datetime, end: dt.datetime, ready: bool, changed_at: dt.datetime | None) -> list[Stretch]:
    """The time from `start` to `end` of a node whose Ready condition reads `ready` since `changed_at`: the other way
    before it, down while not Ready."""
    if end <= start:
        return []
    if changed_at is None or changed_at <= start:
        return [Stretch(start, end, not ready)]
    cut = min(changed_at, end)
    return [stretch for stretch in (Stretch(start, cut, ready), Stretch(cut, end, not ready))
            if stretch.end > stretch.start]


def node_time(micro: int, spans: list[Stretch]) -> dict[dt.datetime, NodeTime]:
    """The capacity of a node of `micro` micro-GPUs over `spans`, by UTC hour (cut at each), with its down part."""
    hours: dict[dt.datetime, NodeTime] = {}
    for stretch in spans:
        at = stretch.start
        while at < stretch.end:
            hour = hour_of(at)
            cut = min(hour + HOUR, stretch.end)
            part = offered(micro, cut) - offered(micro, at)
            hours[hour] = hours.get(hour, NodeTime(0)) + NodeTime(part, part if stretch.down else 0)
            at = cut
    return hours


@dataclass(frozen=True)
class Cursor:
    """A node's capacity recorded so far: up to `observed_until`, as last read; `gone_at` set, for good."""

    node: str
    uid: str
    model: str
    micro_gpus: int
    ready: bool
    observed_until: dt.datetime
    gone_at: dt.datetime | None = None


@dataclass(frozen=True)
class Advance:
    """What one observation records of a node: its cursor as it now stands, and the time added, by hour and model."""

    cursor: Cursor
    added: dict[tuple[dt.datetime, str], NodeTime]
    new: bool  # no cursor before: a node seen for the first time

    @property
    def gone(self) -> bool:
        return self.cursor.gone_at is not None


def advance(name: str, cursor: Cursor | None, node: NodeGpus | None, now: dt.datetime) -> Advance | None:
    """What an observation at `now` records of node `name`, as it stands in the cache (`node`; None: absent) and its
    cursor (None: none yet); None: nothing to record."""
    if cursor is not None and now <= cursor.observed_until:
        return None  # an older observation than the one recorded
    if node is None:
        if cursor is None or cursor.gone_at is not None or now - cursor.observed_until < GONE_AFTER:
            return None
        down = node_time(cursor.micro_gpus, [Stretch(cursor.observed_until, now, True)])
        return Advance(replace(cursor, observed_until=now, gone_at=now), _by_model(down, cursor.model), False)
    micro = micro_gpus(node.installed)
    if cursor is not None and cursor.uid == node.uid:
        if cursor.gone_at is not None:
            return None  # gone for good: a cache this far behind records nothing
        start, added = cursor.observed_until, {}
    elif cursor is None and micro == 0:
        return None  # no GPUs: not recorded
    else:
        start = _first_seen(node, now) if cursor is None else max(cursor.observed_until, _first_seen(node, now))
        added = {} if cursor is None or cursor.gone_at is not None else _by_model(
            node_time(cursor.micro_gpus, [Stretch(cursor.observed_until, start, True)]), cursor.model)
    up = _by_model(node_time(micro, stretches(start, now, node.ready, node.ready_changed_at)), node.model.name)
    for key, time in up.items():
        added[key] = added.get(key, NodeTime(0)) + time
    return Advance(Cursor(name, node.uid, node.model.name, micro, node.ready, now), added, cursor is None)


def _first_seen(node: NodeGpus, now: dt.datetime) -> dt.datetime:
    """Where a node seen for the first time starts: its creation if within FIRST_SEEN_WITHIN, else now."""
    created = node.created_at
    return created if created is not None and now - FIRST_SEEN_WITHIN <= created <= now else now


def _by_model(hours: dict[dt.datetime, NodeTime], model: str) -> dict[tuple[dt.datetime, str], NodeTime]:
    return {(hour, model): time for hour, time in hours.items()}


class CapacityFigures(NamedTuple):
    """A node-hour's capacity, or a window's, and where it went, micro-GPU-seconds: allocated − over + unallocated +
    down = capacity, exactly. `idle` is the part of allocated the GPUs' readings call idle. A tuple: a month of a
    large cluster's node-hours are made in a blink."""

    capacity: int = 0
    allocated: int = 0
    idle: int = 0
    unallocated: int = 0
    down: int = 0
    over: int = 0


def summed(figures: Iterable[CapacityFigures]) -> CapacityFigures:
    """The figures of many node-hours together (each one's identity holds, so the sum's does)."""
    return CapacityFigures(*(sum(column) for column in zip(*figures)))


def node_hour_figures(capacity: int, down: int, allocated: int, idle: int) -> CapacityFigures:
    """A node-hour's figures from its capacity and down time as recorded, and what its pods were billed in the hour
    (`allocated`, of it `idle`): a pod billed while its node was NotReady holds that time, so down is what is left of
    the recorded down time after the pods; unallocated, what is left after both; over, what the pods were billed
    beyond the capacity (never below the admitted share, or capacity not recorded)."""
    free = capacity - allocated
    if free <= 0:
        return CapacityFigures(capacity, allocated, idle, 0, 0, -free)
    held_down = min(down, free)
    return CapacityFigures(capacity, allocated, idle, free - held_down, held_down, 0)


class NodeHour(NamedTuple):
    """A node's figures in one UTC hour; `node` None: pods billed on no known node (capacity 0: all over)."""

    node: str | None
    hour: dt.datetime
    model: str  # the node's GPUs' model, as recorded; of a node whose capacity was not recorded, its pods'
    figures: CapacityFigures


@dataclass(frozen=True)
class Utilisation:
    """A window's figures: the cluster's, and each GPU model's."""

    cluster: CapacityFigures
    models: dict[str, CapacityFigures]


def utilisation(lines: Iterable[NodeHour]) -> Utilisation:
    """The sums of node-hours' figures, by the model of each line and in all; lines of one model in a row (a node's
    hours) are summed together, so that a month of a large cluster is never held at once."""
    models: dict[str, CapacityFigures] = {}
    for model, run in groupby(lines, key=attrgetter("model")):
        models[model] = summed([models.get(model, CapacityFigures()), *(line.figures for line in run)])
    return Utilisation(summed(models.values()), dict(sorted(models.items())))
