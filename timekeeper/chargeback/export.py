"""The rows of a chargeback export, plain data (docs/chargeback.md, "The FOCUS export"): each namespace's GPU time per
GPU model and hour, the capacity nobody held as the cluster's own line or shared among the namespaces in proportion
to what they held (OpenCost's shareIdle), and time that arrived after its billing period closed as corrections.

An export of a window holds the hours of the window as they were booked while their periods were open, and the
corrections booked in the window (for hours before it): once every period the window touches has closed, nothing
can change what it holds, and the same export is the same bytes.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from timekeeper.accounting.hours import apportion
from timekeeper.chargeback.calendar import BillingCalendar
from timekeeper.chargeback.focus import FocusCharge
from timekeeper.chargeback.prices import GpuPrice


class ExportConflict(ValueError):
    """An export that cannot be made as things stand (no prices, two currencies); the message says what to do."""


Prices = Callable[[str, dt.datetime], GpuPrice | None]  # a model's price in force in an hour
Tags = Callable[[str | None, dt.datetime], Mapping[str, str]]  # a namespace's (None: the cluster's) in a billing period


@dataclass(frozen=True)
class HeldHour:
    """A namespace's GPU time on one model in one hour, as booked in `booked_hour` (the hour itself: on time)."""

    hour: dt.datetime
    namespace: str
    model: str
    booked_hour: dt.datetime
    micro_gpu_seconds: int

    @property
    def correction(self) -> bool:
        return self.booked_hour != self.hour


@dataclass(frozen=True)
class ExportTerms:
    """What the rows are made with: the calendar, the prices, the tags, and whether unallocated time is shared."""

    calendar: BillingCalendar
    prices: Prices
    tags: Tags
    share_unallocated: bool
    namespace: str | None = None  # a tenant's export: its own rows, and its part of the shared unallocated time


def export_rows(corrections: Iterable[HeldHour], held: Iterable[HeldHour],
                unallocated: Mapping[dt.datetime, Mapping[str, int]], terms: ExportTerms) -> Iterator[FocusCharge]:
    """The export's rows: the corrections booked in the window, then each hour's (`held` ordered by hour, on time
    only; `unallocated`: each hour's capacity nobody held, by model)."""
    for row in corrections:
        yield _charge(row.hour, row.booked_hour, row.namespace, row.model, row.micro_gpu_seconds, "allocated", terms)
    idle_hours = iter(sorted(unallocated))  # merged in: `held` streams, an hour at a time
    next_idle = next(idle_hours, None)
    for hour, rows in itertools.groupby(held, key=lambda row: row.hour):
        while next_idle is not None and next_idle < hour:
            yield from _hour(next_idle, [], unallocated[next_idle], terms)
            next_idle = next(idle_hours, None)
        if next_idle == hour:
            next_idle = next(idle_hours, None)
        yield from _hour(hour, list(rows), unallocated.get(hour, {}), terms)
    while next_idle is not None:
        yield from _hour(next_idle, [], unallocated[next_idle], terms)
        next_idle = next(idle_hours, None)


def _hour(hour: dt.datetime, held: list[HeldHour], unallocated: Mapping[str, int],
          terms: ExportTerms) -> Iterator[FocusCharge]:
    rows: list[tuple[str, str, str, int]] = [(row.namespace, row.model, "allocated", row.micro_gpu_seconds)
                                             for row in held]
    for model in sorted(unallocated):
        left = unallocated[model]
        holders = sorted((row.namespace, row.micro_gpu_seconds) for row in held
                         if row.model == model and row.micro_gpu_seconds > 0)
        if terms.share_unallocated and holders and left > 0:
            parts = apportion(left, [micro for _, micro in holders])
            rows += [(namespace, model, "shared-unallocated", part)
                     for (namespace, _), part in zip(holders, parts) if part]
        elif left:
            rows.append(("", model, "unallocated", left))
    for namespace, model, category, micro in sorted(rows):
        if terms.namespace is None or namespace == terms.namespace:
            yield _charge(hour, hour, namespace or None, model, micro, category, terms)


def _charge(hour: dt.datetime, booked_hour: dt.datetime, namespace: str | None, model: str, micro: int,
            category: str, terms: ExportTerms) -> FocusCharge:
    booked = terms.calendar.period_of(booked_hour)
    assert booked.end is not None  # every billing period ends
    price = terms.prices(model, hour)
    correction = booked_hour != hour
    return FocusCharge(
        charge_period_start=hour,
        billing_period_start=booked.start,
        billing_period_end=booked.end,
        namespace=namespace,
        model=model,
        micro_gpu_seconds=micro,
        category=category,
        correction=correction,
        corrected_period_start=terms.calendar.period_of(hour).start if correction else None,
        tags=terms.tags(namespace, booked.start),
        list_per_gpu_hour=None if price is None else price.list_per_gpu_hour,
        contracted_per_gpu_hour=None if price is None else price.contracted_per_gpu_hour,
    )
