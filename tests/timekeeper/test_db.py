"""The database layer: pipelined transactions and bulk writes, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import psycopg
import pytest
from flask import Flask
from sqlalchemy import bindparam, select, text
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from testbed.postgres import PostgresServer
from tests.timekeeper.conftest import METER, READER, SpecClient
from timekeeper.app import create_app
from timekeeper.config import TimekeeperConfig
from timekeeper.database.connection import Database
from timekeeper.database.schema import upgrade
from timekeeper.database.tables import pod_ledgers

UTC = dt.timezone.utc
OPENED = dt.datetime(2028, 2, 29, 12, 0, tzinfo=UTC)
SEEN = dt.datetime(2028, 2, 29, 12, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))  # stored as 10:30 UTC
COLUMNS = ("pod_uid", "namespace", "pod", "billed_share", "micro_gpu_seconds", "last_seq", "final", "first_report_at",
           "last_report_at", "gpu_memory_used_mib", "gpu_memory_requested_mib", "gpu_utilization_percent")


def pod(uid: str, **changes: Any) -> dict[str, Any]:
    row = {"pod_uid": uid, "namespace": "team-a", "pod": f"pod-{uid}", "billed_share": 0.5, "micro_gpu_seconds": 0,
           "last_seq": 0, "final": False, "first_report_at": OPENED, "last_report_at": OPENED,
           "gpu_memory_used_mib": None, "gpu_memory_requested_mib": 2048.0, "gpu_utilization_percent": None}
    return {**row, **changes}


def stored(db: Database) -> dict[str, Any]:
    with db.read() as conn:
        return {row.pod_uid: row for row in conn.execute(select(pod_ledgers).order_by(pod_ledgers.c.pod_uid))}


@pytest.fixture
def db(database_url: str) -> Any:
    database = Database(database_url)
    yield database
    database.dispose()


def test_bulk_writes_insert_and_update_many_rows_with_every_column_type(db: Database) -> None:
    opening = db.bulk_insert(pod_ledgers, COLUMNS, lambda insert: insert.on_conflict_do_nothing())
    advancing = db.bulk_update(pod_ledgers, "pod_uid", ("micro_gpu_seconds", "last_seq", "final", "last_report_at",
                                                        "gpu_memory_used_mib", "gpu_utilization_percent"))
    with db.pipeline() as conn:
        opening.execute(conn, [pod("a"), pod("b"), pod("c")])
        opening.execute(conn, [pod("a", pod="not-reopened")])  # the conflict clause applies to every row
        advancing.execute(
            conn,
            [
                {
                    "pod_uid": "a",
                    "micro_gpu_seconds": 9_000_000_000_000,
                    "last_seq": 7,
                    "final": True,
                    "last_report_at": SEEN,
                    "gpu_memory_used_mib": 1500.5,
                    "gpu_utilization_percent": None,
                },
                {
                    "pod_uid": "c",
                    "micro_gpu_seconds": 1,
                    "last_seq": 1,
                    "final": False,
                    "last_report_at": OPENED,
                    "gpu_memory_used_mib": None,
                    "gpu_utilization_percent": 87.5,
                },
            ],
        )
    rows = stored(db)
    assert sorted(rows) == ["a", "b", "c"]
    a, b, c = rows["a"], rows["b"], rows["c"]
    assert (a.pod, a.micro_gpu_seconds, a.last_seq, a.final, a.gpu_memory_used_mib) == (
        "pod-a",
        9_000_000_000_000,
        7,
        True,
        1500.5,
    )
    assert a.last_report_at == SEEN and a.last_report_at.utcoffset() == dt.timedelta(0)
    assert a.first_report_at == OPENED and a.gpu_memory_requested_mib == 2048.0 and a.gpu_utilization_percent is None
    assert (b.micro_gpu_seconds, b.last_seq, b.final, b.gpu_memory_used_mib) == (0, 0, False, None)
    assert (c.micro_gpu_seconds, c.gpu_memory_used_mib, c.gpu_utilization_percent) == (1, None, 87.5)


def test_rows_read_in_a_pipeline_see_its_writes_and_may_be_read_after_the_commit(db: Database) -> None:
    opening = db.bulk_insert(pod_ledgers, COLUMNS, lambda insert: insert.on_conflict_do_nothing())
    with db.pipeline() as conn:
        opening.execute(conn, [pod("a"), pod("b")])
        rows = conn.execute(select(pod_ledgers.c.pod_uid, pod_ledgers.c.final).order_by(pod_ledgers.c.pod_uid))
    assert [(row.pod_uid, row.final) for row in rows] == [("a", False), ("b", False)]


def test_rows_read_in_a_pipeline_are_named_and_typed_as_sqlalchemys_own(db: Database) -> None:
    opening = db.bulk_insert(pod_ledgers, COLUMNS, lambda insert: insert.on_conflict_do_nothing())
    with db.pipeline() as conn:
        opening.execute(conn, [pod("a", final=True, last_report_at=SEEN, gpu_memory_used_mib=1500.5), pod("b")])
    # Every type the ledger reads (times, flags, numbers, NULLs), an IN list, and a label of an expression.
    query = (
        select(pod_ledgers, (pod_ledgers.c.last_seq + 1).label("next_seq"))
        .where(pod_ledgers.c.pod_uid.in_(bindparam("uids", expanding=True)))
        .order_by(pod_ledgers.c.pod_uid)
    )
    with db.pipeline() as conn:
        piped = list(conn.execute(query, {"uids": ["a", "b", "c"]}))
    with db.read() as conn:
        read = conn.execute(query, {"uids": ["a", "b", "c"]}).all()
    assert [row._asdict() for row in piped] == [row._asdict() for row in read]
    assert [[type(value) for value in row] for row in piped] == [[type(value) for value in row] for row in read]
    assert piped[0].last_report_at.utcoffset() == dt.timedelta(0) and piped[0].final is True


@pytest.mark.parametrize(
    ("row", "refusal"),
    [
        ({k: v for k, v in pod("a").items() if k != "final"}, KeyError),  # never written as NULL
        (pod("a", last_report_at=dt.datetime(2028, 2, 29, 12, 0)), ValueError),  # a naive time: which zone?
    ],
)
def test_a_bulk_row_without_a_column_or_with_a_naive_time_is_refused_and_nothing_written(
    db: Database, row: dict[str, Any], refusal: type[Exception]
) -> None:
    opening = db.bulk_insert(pod_ledgers, COLUMNS, lambda insert: insert.on_conflict_do_nothing())
    with pytest.raises(refusal):
        with db.pipeline() as conn:
            opening.execute(conn, [pod("b"), row])
    assert stored(db) == {}


def test_a_statement_given_many_rows_runs_once_for_each(db: Database) -> None:
    with db.pipeline() as conn:
        conn.execute(pod_ledgers.insert(), [pod("a", final=True), pod("b")])
    assert [(uid, row.final) for uid, row in stored(db).items()] == [("a", True), ("b", False)]


def test_a_failed_statement_undoes_the_whole_transaction_and_raises_as_sqlalchemy_would(db: Database) -> None:
    opening = db.bulk_insert(pod_ledgers, COLUMNS, lambda insert: insert.on_conflict_do_nothing())
    with pytest.raises(IntegrityError):
        with db.pipeline() as conn:
            opening.execute(conn, [pod("a")])
            conn.execute(pod_ledgers.insert(), pod("b"))
            conn.execute(pod_ledgers.insert(), pod("b"))  # the primary key again
    assert stored(db) == {}
    with db.pipeline() as conn:  # the connection went back to the pool clean
        opening.execute(conn, [pod("c")])
    assert list(stored(db)) == ["c"]


def test_an_error_of_the_caller_undoes_the_transaction_and_is_raised_unchanged(db: Database) -> None:
    opening = db.bulk_insert(pod_ledgers, COLUMNS, lambda insert: insert.on_conflict_do_nothing())
    with pytest.raises(KeyError):
        with db.pipeline() as conn:
            opening.execute(conn, [pod("a")])
            raise KeyError("the caller's own bug")
    assert stored(db) == {}


@pytest.fixture
def dropping_server(postgres: PostgresServer) -> tuple[str, PostgresServer]:
    url = postgres.create_database("dropped_connections")
    upgrade(url)
    return url, postgres


def test_a_connection_the_server_dropped_fails_one_report_with_503_and_the_retry_counts_once(
    dropping_server: tuple[str, PostgresServer], tokens_file: str
) -> None:
    url, server = dropping_server
    app: Flask = create_app(TimekeeperConfig(database_url=url, auth="static", static_tokens_file=tokens_file))
    meter = SpecClient(app.test_client(), METER)
    try:
        body = {
            "podUid": "uid-1",
            "namespace": "team-a",
            "pod": "trainer",
            "gpuShare": 0.5,
            "seq": 1,
            "gpuSeconds": 60.0,
        }
        assert meter.post("/api/v1/reports", json=body).status_code == 200
        with psycopg.connect(
            f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres", autocommit=True
        ) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'dropped_connections'"
            )
        second = {**body, "seq": 2, "gpuSeconds": 120.0}
        refused = meter.post("/api/v1/reports", json=second)
        assert refused.status_code == 503 and refused.json["error"] == "the database is unavailable, try again"
        retried = meter.post("/api/v1/reports", json=second)
        assert retried.status_code == 200 and retried.json["chargedGpuSeconds"] == 60.0
        assert meter.as_(READER).get("/api/v1/budgets/team-a").json["usedGpuMinutes"] == 2.0
    finally:
        app.extensions["reports"].close()
        app.extensions["database"].dispose()


def test_a_statement_is_prepared_once_per_connection_whatever_the_length_of_its_in_list(
    dropping_server: tuple[str, PostgresServer],
) -> None:
    url, _ = dropping_server
    db = Database(url, pool_size=1)
    opening = db.bulk_insert(pod_ledgers, COLUMNS, lambda insert: insert.on_conflict_do_nothing())
    locking = select(pod_ledgers.c.pod_uid).where(pod_ledgers.c.pod_uid.in_(bindparam("uids", expanding=True)))
    try:
        with db.pipeline() as conn:
            opening.execute(conn, [pod(uid) for uid in "abcde"])
        found = []
        for uids in (["a", "b", "c"], ["d", "c", "b", "a"], ["e", "a", "b"]):  # four elements once padded
            with db.pipeline() as conn:
                found.append(sorted(row.pod_uid for row in conn.execute(locking, {"uids": uids})))
        assert found == [["a", "b", "c"], ["a", "b", "c", "d"], ["a", "b", "e"]]  # padding repeats, never adds, a row
        with db.pipeline() as conn:
            prepared = [row.statement for row in conn.execute(text("SELECT statement FROM pg_prepared_statements"))]
        assert sum("FROM pod_ledgers" in statement for statement in prepared) == 1
    finally:
        db.dispose()


def test_the_pipeline_raises_a_dropped_connection_as_a_database_error_and_discards_it(
    dropping_server: tuple[str, PostgresServer], caplog: pytest.LogCaptureFixture
) -> None:
    url, server = dropping_server
    db = Database(url)
    try:
        with db.pipeline() as conn:
            list(conn.execute(select(pod_ledgers)))
        with psycopg.connect(
            f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres", autocommit=True
        ) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'dropped_connections'"
            )
        with pytest.raises(DBAPIError) as raised:
            with db.pipeline() as conn:
                list(conn.execute(select(pod_ledgers)))
        assert isinstance(raised.value.orig, psycopg.OperationalError)
        with db.pipeline() as conn:  # a new connection: the dropped one was not put back
            assert list(conn.execute(select(pod_ledgers))) == []
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "the pool had to discard it itself"
    finally:
        db.dispose()


def test_a_statement_that_runs_too_long_is_cancelled_by_the_server(postgres_database: str) -> None:
    db = Database(postgres_database, statement_timeout_ms=200)
    try:
        with pytest.raises(OperationalError, match="statement timeout"):
            with db.read() as conn:
                conn.execute(text("SELECT pg_sleep(5)"))
    finally:
        db.dispose()
