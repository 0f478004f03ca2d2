"""The durable floor, for bench/timekeeper_ingest.py: what a report costs on this stack when it must be on disk before
it is answered, and nothing is accounted. The stack's ceiling (ceiling.py) that first reads each report (MeterReport)
and hands it to the timekeeper's own ReportQueue, whose thread writes each batch's reports as rows, in one durable
transaction of the timekeeper's own Database, on the same database the timekeeper is measured on."""

from __future__ import annotations

import ceiling  # bench/, this module's directory
from flask import Flask
from sqlalchemy import BigInteger, Column, Float, MetaData, Table, Text

from gpusharing.report import MeterReport
from gpusharing.serving.jsonbody import read_json
from timekeeper.database.accounting.report_queue import ReportQueue
from timekeeper.database.connection import Database

# A row a report, keyed as a pod's reports are; created by the benchmark before the floor starts.
DURABLE_REPORTS = Table(
    "durable_reports",
    MetaData(),
    Column("pod_uid", Text, primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("gpu_seconds", Float, nullable=False),
)


class _DurableRows:
    """ReportQueue's ledger here: a batch's reports written as rows in one transaction; each answered alike."""

    def __init__(self, db: Database, answer: bytes):
        self.db = db
        self.answer = answer
        self._insert = db.bulk_insert(
            DURABLE_REPORTS, ["pod_uid", "seq", "gpu_seconds"], lambda insert: insert.on_conflict_do_nothing()
        )

    def record(self, reports: list[tuple[MeterReport, None]]) -> list[bytes]:
        with self.db.pipeline() as conn:
            self._insert.execute(
                conn, [{"pod_uid": r.pod_uid, "seq": r.seq, "gpu_seconds": r.gpu_seconds} for r, _ in reports]
            )
        return [self.answer] * len(reports)


def create_table(database_url: str) -> None:
    db = Database(database_url)
    DURABLE_REPORTS.metadata.create_all(db.engine)
    db.dispose()


def durable_floor_app(path: str, answer: bytes, database_url: str, batched: bool = True) -> Flask:
    """The fixed answer's app, answering each report once it is durable: written in the ReportQueue's batches, or
    (`batched` False) in a transaction of its own, by its request's thread."""
    rows = _DurableRows(Database(database_url), answer)
    if batched:
        reports = ReportQueue(rows)  # type: ignore[arg-type]  (a ledger's shape)

        def durable(body: bytes) -> bytes:
            return reports.submit(MeterReport.from_json(read_json(body)), None)  # type: ignore[return-value]
    else:

        def durable(body: bytes) -> bytes:
            return rows.record([(MeterReport.from_json(read_json(body)), None)])[0]

    return ceiling.fixed_answer_app(path, answer, durable)
