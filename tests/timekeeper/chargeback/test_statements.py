"""Statements of closed billing periods as the controller's `statements` task writes them
(timekeeper/cluster/statements.py, timekeeper/database/chargeback/statements.py; docs/audit.md), on SQLite and
PostgreSQL: a period is stated once it has closed and settled and the capacity ledger has counted it; its leaves are
the charges booked in it (a late charge is a correction row of the period open when it came) and its node-hours,
priced; two replicas closing at once write one statement; a new key is handed over to; and `gpusharing verify` names
each row or statement changed in the database afterwards."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete, insert, select, update

from gpusharing.contract import Period
from gpusharing.gpu.capacity import node_gpus
from gpusharing.gpu.catalogue import shipped_catalogue
from gpusharing.statements.note import Signer, generate_signer, sign_note
from gpusharing.statements.statement import StatedPeriod, origin_of
from gpusharing.statements.verify import verify
from tests.timekeeper.conftest import Clock
from timekeeper.accounting.ledger import Observation
from timekeeper.chargeback.calendar import BillingCalendar
from timekeeper.chargeback.prices import price_sheet_from
from timekeeper.chargeback.statements import SETTLE, SigningKeys, is_due, next_period
from timekeeper.cluster.statements import StatementTask
from timekeeper.database.accounting.charging import PodObservation, ReportLedger
from timekeeper.database.budgets.store import BudgetStore
from timekeeper.database.chargeback.capacity import CapacityLedger
from timekeeper.database.chargeback.prices import PriceLog
from timekeeper.database.chargeback.statements import StatementLog
from timekeeper.database.connection import Database
from timekeeper.database.tables import pod_hours, statements

UTC = dt.timezone.utc
START = dt.datetime(2026, 11, 30, 22, 30, tzinfo=UTC)  # 90 minutes before a day (and a month) ends
DAILY = BillingCalendar(Period.DAILY, dt.timedelta(minutes=30))
MICRO = 1_000_000
A100 = "NVIDIA A100-SXM4-80GB"
KEY = generate_signer("finance")
ORIGIN = origin_of("test")


def at(day: int, hour: int, minute: int = 0) -> dt.datetime:
    return dt.datetime(2026, 11 if day <= 30 else 12, day if day <= 30 else day - 30, hour, minute, tzinfo=UTC)


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    yield database
    database.dispose()


@pytest.fixture
def ledger(db: Database, clock: Clock) -> ReportLedger:
    PriceLog(db).record(price_sheet_from({"currency": "EUR", "prices": [
        {"model": A100, "from": "2026-01-01", "listPerGpuHour": "2.95", "contractedPerGpuHour": "2.137"}]},
        "the test's sheet", shipped_catalogue()), at(29, 0), "test")
    return ReportLedger(BudgetStore(db, clock=clock), calendar=DAILY)


def observed(uid: str, until: dt.datetime, share: float = 0.5, namespace: str = "ml") -> PodObservation:
    return PodObservation(uid, namespace, f"pod-{uid}", share, Observation(share, START, until, False), node="gpu-1")


def node_seen(db: Database, when: dt.datetime) -> None:
    """The capacity ledger's node, an 8-GPU A100 node created before the pods, observed at `when`."""
    node = node_gpus({
        "metadata": {"name": "gpu-1", "uid": "uid-gpu-1", "creationTimestamp": "2026-11-30T22:00:00Z",
                     "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T22:00:00Z"}]},
    }, shipped_catalogue())
    CapacityLedger(db).observe({"gpu-1": node}, when)


def task(db: Database, keys: SigningKeys | None = None) -> StatementTask:
    return StatementTask(StatementLog(db), DAILY, ORIGIN, keys or SigningKeys(KEY))


@pytest.fixture
def stated(db: Database, ledger: ReportLedger, clock: Clock) -> StatementLog:
    """Two pods billed from 22:30 on the 30th to 00:20 on the 1st, the node counted to 00:40; the 30th stated."""
    node_seen(db, START)
    clock.at = at(31, 0, 20)
    ledger.observe([observed("a", clock.at), observed("b", clock.at, share=0.25, namespace="vision")])
    node_seen(db, at(31, 0, 40))
    assert task(db).run(at(31, 0, 40)).periods == 1
    return StatementLog(db)


def leaves_of(log: StatementLog, day: int) -> list[dict[str, object]]:
    start = at(day, 0)
    return [json.loads(leaf) for leaf in log.leaves(start, start + dt.timedelta(days=1))]


def problems(db: Database, keys: list[Signer] | None = None) -> list[str]:
    return [str(f) for f in verify(StatementLog(db).stored(), [k.verifier for k in keys or [KEY]]).findings]


def test_the_next_period_follows_the_last_stated_else_the_ledger_s_first_hour() -> None:
    assert next_period(DAILY, None, None) is None  # an empty ledger: nothing to state
    assert next_period(DAILY, None, at(30, 22, 30)) == StatedPeriod("daily", at(30, 0), at(31, 0))
    assert next_period(DAILY, at(31, 0), None) == StatedPeriod("daily", at(31, 0), at(32, 0))
    monthly = BillingCalendar(Period.MONTHLY)
    # A period begun under another calendar is stated to the end of the current calendar's period.
    assert next_period(monthly, at(30, 0), None) == StatedPeriod("monthly", at(30, 0), at(31, 0))


def test_a_period_is_due_once_closed_settled_and_counted_by_the_capacity_ledger() -> None:
    day = StatedPeriod("daily", at(30, 0), at(31, 0))
    closed = at(31, 0) + DAILY.grace
    assert not is_due(DAILY, day, closed, None)
    assert is_due(DAILY, day, closed + SETTLE, None)
    assert not is_due(DAILY, day, closed + SETTLE, at(30, 23, 59))  # a node not yet counted to the period's end
    assert is_due(DAILY, day, closed + SETTLE, at(31, 0))


def test_a_period_is_not_stated_before_it_settles(db: Database, ledger: ReportLedger, clock: Clock) -> None:
    clock.at = at(31, 0, 20)
    ledger.observe([observed("a", clock.at)])
    assert task(db).run(at(31, 0, 30)).periods == 0  # closed at 00:30, settled a minute later
    assert task(db).run(at(31, 0, 31)).periods == 1


def test_a_statement_signs_each_charge_and_node_hour_booked_in_its_period_priced(stated: StatementLog) -> None:
    charges = [leaf for leaf in leaves_of(stated, 30) if leaf["kind"] == "charge"]
    assert [(c["namespace"], c["pod"], c["hour"], c["microGpuSeconds"]) for c in charges] == [
        ("ml", "pod-a", "2026-11-30T22:00:00Z", 900 * MICRO), ("vision", "pod-b", "2026-11-30T22:00:00Z", 450 * MICRO),
        ("ml", "pod-a", "2026-11-30T23:00:00Z", 1800 * MICRO), ("vision", "pod-b", "2026-11-30T23:00:00Z", 900 * MICRO)]
    assert charges[0] | {"listCost": charges[0]["listCost"]} == {
        "kind": "charge", "bookedHour": "2026-11-30T22:00:00Z", "hour": "2026-11-30T22:00:00Z", "namespace": "ml",
        "pod": "pod-a", "podUid": "a", "model": A100, "microGpuSeconds": 900 * MICRO,
        "weightedMicroGpuSeconds": 900 * MICRO, "idleMicroGpuSeconds": 0, "currency": "EUR",
        "listPerGpuHour": "2.950000", "contractedPerGpuHour": "2.137000", "listCost": "0.737500000000",
        "contractedCost": "0.534250000000"}
    capacity = [leaf for leaf in leaves_of(stated, 30) if leaf["kind"] == "capacity"]
    assert [(c["hour"], c["capacityMicroGpuSeconds"]) for c in capacity] == [
        ("2026-11-30T22:00:00Z", 8 * 3600 * MICRO), ("2026-11-30T23:00:00Z", 8 * 3600 * MICRO)]
    with stated.db.read() as conn:
        (row,) = conn.execute(select(statements)).all()
    assert (row.sequence, row.period_start, row.period_end, row.tree_size) == (1, at(30, 0), at(31, 0), 6)
    assert verify(stated.stored(), [KEY.verifier]).ok


def test_time_that_comes_after_the_close_is_a_correction_row_of_the_next_period(
    stated: StatementLog, ledger: ReportLedger, clock: Clock, db: Database,
) -> None:
    clock.at = at(31, 1, 0)
    ledger.observe([observed("c", at(31, 0, 10))])  # a pod the biller saw late, from 22:30 on the 30th
    node_seen(db, at(32, 1))
    assert task(db).run(at(32, 1)).periods == 1
    late = [leaf for leaf in leaves_of(stated, 31) if leaf.get("podUid") == "c"]
    assert [(leaf["hour"], leaf["bookedHour"], leaf["microGpuSeconds"]) for leaf in late] == [  # by booked hour
        ("2026-12-01T00:00:00Z", "2026-12-01T00:00:00Z", 300 * MICRO),
        ("2026-11-30T22:00:00Z", "2026-12-01T01:00:00Z", 900 * MICRO),
        ("2026-11-30T23:00:00Z", "2026-12-01T01:00:00Z", 1800 * MICRO)]
    assert problems(db) == []  # the closed statement was not rewritten


def test_periods_are_stated_one_after_the_other_up_to_the_last_closed(stated: StatementLog, db: Database) -> None:
    node_seen(db, at(34, 2))
    assert task(db).run(at(34, 2)).periods == 3  # the 1st, 2nd and 3rd of December
    with db.read() as conn:
        assert conn.execute(select(statements.c.period_start).order_by(statements.c.sequence)).scalars().all() == [
            at(30, 0), at(31, 0), at(32, 0), at(33, 0)]
    assert problems(db) == []


def test_two_replicas_closing_at_once_write_one_statement_per_period(
    database_url: str, ledger: ReportLedger, clock: Clock,
) -> None:
    clock.at = at(31, 0, 20)
    ledger.observe([observed("a", clock.at)])
    replicas = [Database(database_url) for _ in range(2)]
    try:
        done = []
        threads = [threading.Thread(target=lambda db=db: done.append(task(db).run(at(33, 1)).periods))
                   for db in replicas]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sum(done) == 3  # the 30th, the 1st and the 2nd: each by one of them
        with replicas[0].read() as conn:
            assert conn.execute(select(statements.c.sequence)).scalars().all() == [1, 2, 3]
        assert problems(replicas[0]) == []
    finally:
        for db in replicas:
            db.dispose()


def test_a_new_key_is_handed_over_to_by_a_statement_both_keys_sign(stated: StatementLog, db: Database) -> None:
    new = generate_signer("finance-2027")
    node_seen(db, at(31, 2))
    assert task(db, SigningKeys(new)).run(at(31, 2)).key_unrecognised  # the chain's key is not given: nothing
    done = task(db, SigningKeys(new, previous=KEY)).run(at(31, 2))
    assert done.handed_over and done.periods == 0
    node_seen(db, at(32, 2))
    assert task(db, SigningKeys(new, previous=KEY)).run(at(32, 2)).periods == 1
    assert problems(db, [KEY, new]) == []
    assert StatementLog(db).signers() == [KEY.verifier.text, new.verifier.text]


def test_verify_names_a_row_edited_deleted_or_inserted_in_the_database_after_the_close(
    stated: StatementLog, db: Database,
) -> None:
    day = "statement 1 (period 2026-11-30T00:00:00Z/2026-12-01T00:00:00Z)"
    with db.write() as conn:
        conn.execute(update(pod_hours).where(pod_hours.c.pod_uid == "b", pod_hours.c.hour == at(30, 23))
                     .values(micro_gpu_seconds=pod_hours.c.micro_gpu_seconds - 1))
    assert problems(db) == [f"{day}: leaf 3 was changed after the close: it now reads as pod vision/pod-b (b) on "
                            f"{A100} in the hour 2026-11-30T23:00:00Z"]
    with db.write() as conn:
        conn.execute(delete(pod_hours).where(pod_hours.c.pod_uid == "b", pod_hours.c.hour == at(30, 23)))
    assert problems(db) == [f"{day}: leaf 3 was deleted after the close, after pod ml/pod-a (a) on {A100} in the "
                            "hour 2026-11-30T23:00:00Z"]
    with db.write() as conn:
        conn.execute(insert(pod_hours), [{
            "pod_uid": "b", "hour": at(30, 23), "model": A100, "booked_hour": at(30, 23),
            "micro_gpu_seconds": 900 * MICRO, "weighted_micro_gpu_seconds": 900 * MICRO,
            "metered_micro_gpu_seconds": 0, "idle_micro_gpu_seconds": 0, "idle_weighted_micro_gpu_seconds": 0}])
        conn.execute(insert(pod_hours), [{
            "pod_uid": "x", "hour": at(30, 12), "model": A100, "booked_hour": at(30, 12),
            "micro_gpu_seconds": 1, "weighted_micro_gpu_seconds": 1, "metered_micro_gpu_seconds": 0,
            "idle_micro_gpu_seconds": 0, "idle_weighted_micro_gpu_seconds": 0}])
    assert problems(db) == [f"{day}:  (x) on {A100} in the hour 2026-11-30T12:00:00Z was added after the close (it "
                            "is no leaf of the statement)".replace(":  (x)", ": pod / (x)")]


def test_verify_names_a_statement_edited_re_signed_or_deleted_in_the_database(stated: StatementLog,
                                                                              db: Database) -> None:
    node_seen(db, at(33, 2))
    task(db).run(at(33, 2))  # statements 1 to 3
    with db.read() as conn:
        notes = dict(conn.execute(select(statements.c.sequence, statements.c.note)).all())

    def replaced(sequence: int, note: bytes) -> list[str]:
        with db.write() as conn:
            conn.execute(update(statements).where(statements.c.sequence == sequence).values(note=note))
        try:
            return problems(db)
        finally:
            with db.write() as conn:
                conn.execute(update(statements).where(statements.c.sequence == sequence).values(note=notes[sequence]))

    edited = replaced(2, notes[2].replace(b"sequence 2", b"sequence 7"))
    assert edited[0].startswith("statement 7 (period 2026-12-01T00:00:00Z/2026-12-02T00:00:00Z): is not signed by the "
                                "key in force")
    text = notes[2].decode().split("\n\n")[0] + "\n"
    other = generate_signer("finance")  # the same name, another key
    resigned = replaced(2, sign_note(text, [other]))
    assert resigned[0].startswith("statement 2 (period 2026-12-01T00:00:00Z/2026-12-02T00:00:00Z): is not signed by "
                                  f"the key in force, {KEY.verifier.text}; its signatures are by finance+")
    assert problems(db) == []
    with db.write() as conn:
        conn.execute(delete(statements).where(statements.c.sequence == 2))
    assert problems(db)[0] == ("statement 3 (period 2026-12-02T00:00:00Z/2026-12-03T00:00:00Z): follows statement 1: "
                               "statements 2 to 2 are missing")


def test_an_export_is_an_auditor_s_copy_verify_reads_without_the_database(stated: StatementLog,
                                                                          tmp_path: Path) -> None:
    from gpusharing.statements.directory import read_statements, write_keys, write_statement

    copy = tmp_path / "copy"
    copy.mkdir()
    for stored in stated.stored():
        write_statement(copy, stored.number, stored.note, stored.leaf_hashes, stored.rows() if stored.rows else None)
    write_keys(copy, stated.signers())
    assert verify(read_statements(copy), [KEY.verifier]).ok
    rows = (copy / "00000001.rows").read_bytes().splitlines()
    rows[0] = rows[0].replace(b'"microGpuSeconds":900000000', b'"microGpuSeconds":800000000')
    (copy / "00000001.rows").write_bytes(b"".join(row + b"\n" for row in rows))
    (problem,) = [str(f) for f in verify(read_statements(copy), [KEY.verifier]).findings]
    assert problem.endswith("leaf 0 was changed after the close: it now reads as pod ml/pod-a (a) on "
                            f"{A100} in the hour 2026-11-30T22:00:00Z")


def test_a_controller_that_sees_the_chain_go_back_writes_nothing_until_restarted(
    stated: StatementLog, db: Database, ledger: ReportLedger,
) -> None:
    """Removing the last statement and editing its period's rows would have the period stated again from the edited
    rows: the replica that saw the chain further refuses, and says so."""
    controller = task(db)
    node_seen(db, at(32, 2))
    assert controller.run(at(32, 2)).periods == 1  # the 1st of December: statement 2
    with db.write() as conn:
        conn.execute(delete(statements).where(statements.c.sequence == 2))
    done = controller.run(at(32, 3))
    assert done.rewound and done.periods == 0
    with db.read() as conn:
        assert conn.execute(select(statements.c.sequence)).scalars().all() == [1]
    assert task(db).run(at(32, 3)).periods == 1  # a restarted one cannot tell: the auditor's copy can
