"""The ledger's rows written as its generic forms wrote them: a charge's columns named one by one, a charge in one hour
kept whole, and SQLite's bulk rows with each equal instant and day processed once."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from timekeeper.accounting.hours import apportion
from timekeeper.database.accounting.usage import _CHARGED, PodCharge, SpreadCharge, _columns
from timekeeper.database.connection import _INCOMING, Database
from timekeeper.database.tables import pod_hours, pod_usage

AMOUNTS = st.integers(min_value=-(10**18), max_value=10**18)
CHARGES = st.builds(PodCharge, AMOUNTS, AMOUNTS, AMOUNTS, AMOUNTS, AMOUNTS)


def test_the_charged_columns_are_the_charges_fields() -> None:
    assert _CHARGED == tuple(field.name for field in fields(PodCharge))


@given(CHARGES, CHARGES)
def test_a_charge_adds_and_subtracts_column_by_column(one: PodCharge, other: PodCharge) -> None:
    assert one + other == PodCharge(*(getattr(one, c) + getattr(other, c) for c in _CHARGED))
    assert one - other == PodCharge(*(getattr(one, c) - getattr(other, c) for c in _CHARGED))
    assert _columns(one) == {c: getattr(one, c) for c in _CHARGED}


@given(CHARGES, st.integers(min_value=-(10**12), max_value=10**12).filter(bool))
def test_a_charge_in_one_hour_is_split_as_apportion_splits_it(charge: PodCharge, weight: int) -> None:
    hour = dt.datetime(2028, 2, 3, 4, tzinfo=dt.timezone.utc)
    split = [apportion(getattr(charge, c), [weight])[0] for c in _CHARGED]
    assert SpreadCharge("uid", "model", charge, {hour: weight}).by_hour() == {hour: PodCharge(*split)}


class _Recorder:
    def __init__(self) -> None:
        self.parameters: list[Any] = []

    def execute(self, statement: Any, parameters: Any = None, /) -> list[Any]:
        self.parameters.append(parameters)
        return []


def _written(processor: Any, value: Any) -> Any:
    return value if processor is None else processor(value)


def test_sqlites_bulk_rows_hold_each_value_as_its_processor_writes_it(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'rows.sqlite'}")
    utc, east = dt.timezone.utc, dt.timezone(dt.timedelta(hours=5, minutes=30))
    now = dt.datetime(2028, 2, 3, 4, 5, 6, 789, tzinfo=utc)
    # Equal instants in other zones, days and a datetime where a day is written: each as its own processor writes it.
    instants = [now, now.astimezone(east), now + dt.timedelta(hours=1), now.astimezone(east)]
    days = [now.date(), now.date(), dt.date(2028, 2, 4), now.astimezone(east)]
    writes = [
        (db.bulk_insert(pod_hours, ["pod_uid", "hour", "model", "booked_hour"], lambda i: i.on_conflict_do_nothing()),
         [{"pod_uid": f"p{n}", "hour": at, "model": "m", "booked_hour": instants[0]} for n, at in enumerate(instants)]),
        (db.bulk_insert(pod_usage, ["pod_uid", "day", "model"], lambda i: i.on_conflict_do_nothing()),
         [{"pod_uid": f"p{n}", "day": day, "model": "m"} for n, day in enumerate(days)]),
    ]
    for write, rows in writes:
        recorder = _Recorder()
        write.execute(recorder, rows)
        processors = dict(zip(write.columns, write.stored or ()))
        expected = [{c: _written(processors[c], row[c]) for c in write.columns} for row in rows]
        assert [json.loads(parameters[_INCOMING]) for parameters in recorder.parameters] == [expected]
    db.dispose()
