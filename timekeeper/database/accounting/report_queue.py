"""Reports of concurrent requests handed to one thread, which charges them together in one transaction."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import TimeoutError as FutureTimeout

from gpusharing.report import MeterReport
from timekeeper.database.accounting.charging import ReportLedger, ReportResult, ReportTerms


class _Pending:
    """A submitted report until its transaction ends: the ledger thread leaves the result and releases `done`, a bare
    lock rather than a Future, whose Condition costs the ledger thread several times the work per report."""

    __slots__ = ("report", "terms", "done", "result")

    def __init__(self, report: MeterReport, terms: ReportTerms | None):
        self.report = report
        self.terms = terms
        self.result: ReportResult | BaseException | None = None
        self.done = threading.Lock()
        self.done.acquire()


class ReportQueue:
    """Hands the reports of concurrent requests to one thread, which accounts them together in one transaction.

    Under load, reports that arrive while a transaction runs are accounted in the next one: a transaction's fixed
    cost (round trips, commit) is shared by many reports. Alone, a report is accounted at once.
    """

    def __init__(self, ledger: ReportLedger, max_batch: int = 256, timeout_seconds: float = 30.0):
        self.ledger = ledger
        self.max_batch = max_batch
        self.timeout = timeout_seconds
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="report-ledger", daemon=True)
        self._thread.start()

    def submit(self, report: MeterReport, terms: ReportTerms | None) -> ReportResult:
        """The report's result once its transaction committed; raises ReportError, or what the database raised, or
        concurrent.futures.TimeoutError when the transaction did not end within the timeout."""
        pending = _Pending(report, terms)
        self._queue.put(pending)
        if not pending.done.acquire(timeout=self.timeout):
            raise FutureTimeout(f"the report's transaction did not end within {self.timeout:g} s")
        if isinstance(pending.result, BaseException):
            raise pending.result
        assert pending.result is not None
        return pending.result

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def account(self, reports: list[tuple[MeterReport, ReportTerms | None]]) -> list[ReportResult | BaseException]:
        """Accounts reports together; when their transaction fails, each report's failure is its own."""
        try:
            return list(self.ledger.record(reports))
        except Exception as failed:  # the transaction failed and accounted nothing
            if len(reports) == 1:
                return [failed]
        # Again one by one, so that whatever made it fail fails its own report only.
        return [self.account([report])[0] for report in reports]

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # close after this batch
                    break
                batch.append(item)
            for pending, result in zip(batch, self.account([(p.report, p.terms) for p in batch])):
                pending.result = result
            for pending in batch:  # every result left before the first request thread wakes to compete for the GIL
                pending.done.release()
