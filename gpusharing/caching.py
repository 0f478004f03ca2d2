"""Answers of the Kubernetes API reused for a while: the timekeeper's TokenReviews and SubjectAccessReviews, the
webhook's TokenReviews of its callers."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, Future
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


class TtlCache(Generic[K, T]):
    """Answers of the API server reused for `seconds`, so that a request every few seconds costs no API call.

    Concurrent misses of one key make one call while the others wait for its answer; a call that fails is not
    kept (each waiter gets its error, the next miss calls again). Entries go when they expire and, beyond
    max_entries, oldest first: a flood of new keys pushes out the oldest, never everything at once.

    With an `executor`, the call runs there and a caller waits for it at most `wait` seconds
    (concurrent.futures.TimeoutError): a slow API server delays no request longer, and the call goes on, so that a
    caller who tries again finds its answer kept.
    """

    def __init__(self, seconds: float, max_entries: int = 50_000, clock: Callable[[], float] = time.monotonic,
                 executor: Executor | None = None, wait: float | None = None):
        self._seconds = seconds
        self._max = max_entries
        self._clock = clock
        self._executor = executor
        self._wait = wait
        self._entries: OrderedDict[K, tuple[float, T]] = OrderedDict()  # oldest first: in the order they expire
        self._pending: dict[K, Future[T]] = {}
        self._lock = threading.Lock()

    def get(self, key: K, compute: Callable[[], T]) -> T:
        with self._lock:
            now = self._clock()
            hit = self._entries.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
            pending = self._pending.get(key)
            if pending is None:
                pending = self._pending[key] = Future()
                computing = True
            else:
                computing = False
        if computing and self._executor is not None:
            self._executor.submit(self._fill, key, compute, pending)
        elif computing:
            self._fill(key, compute, pending)
        return pending.result(self._wait if self._executor is not None else None)

    def _fill(self, key: K, compute: Callable[[], T], pending: Future[T]) -> None:
        try:
            value = compute()
        except BaseException as failed:
            with self._lock:
                del self._pending[key]
            pending.set_exception(failed)
            return
        with self._lock:
            del self._pending[key]
            self._keep(key, value)
        pending.set_result(value)

    def __len__(self) -> int:
        return len(self._entries)

    def _keep(self, key: K, value: T) -> None:
        now = self._clock()
        self._entries.pop(key, None)
        while self._entries and (len(self._entries) >= self._max or next(iter(self._entries.values()))[0] <= now):
            self._entries.popitem(last=False)
        self._entries[key] = (now + self._seconds, value)
