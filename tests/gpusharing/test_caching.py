"""Answers of the Kubernetes API reused for a while: one call for concurrent misses, failures never kept, bounded."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpusharing.caching import TtlCache


class SlowAnswers:
    """compute() for the cache: counts its calls, each held until the test lets it go."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()

    def __call__(self) -> str:
        self.calls += 1
        assert self.release.wait(10)
        return f"answer {self.calls}"


def test_concurrent_misses_of_one_key_make_one_call() -> None:
    cache: TtlCache[str, str] = TtlCache(60)
    slow = SlowAnswers()
    asking = threading.Semaphore(0)

    def ask() -> str:
        asking.release()
        return cache.get("token", slow)

    with ThreadPoolExecutor(8) as pool:
        answers = [pool.submit(ask) for _ in range(8)]
        for _ in range(8):
            assert asking.acquire(timeout=10)
        time.sleep(0.2)  # lets every thread reach the cache while the first call is held
        slow.release.set()
        assert [a.result() for a in answers] == ["answer 1"] * 8
    assert slow.calls == 1


def test_a_failed_call_is_not_kept_and_reaches_every_waiter() -> None:
    cache: TtlCache[str, str] = TtlCache(60)

    def down() -> str:
        raise ConnectionError("could not review a token: HTTP 503")

    with pytest.raises(ConnectionError):
        cache.get("token", down)
    assert cache.get("token", lambda: "up") == "up" and len(cache) == 1


def test_entries_expire_and_the_oldest_go_first_when_full() -> None:
    now = [0.0]
    cache: TtlCache[int, int] = TtlCache(60, max_entries=3, clock=lambda: now[0])
    for key in range(5):
        cache.get(key, lambda: key)
    assert len(cache) == 3 and [cache.get(k, lambda: -1) for k in (2, 3, 4)] == [2, 3, 4]  # 0 and 1 went first
    assert cache.get(0, lambda: -1) == -1  # computed again
    now[0] = 61.0
    assert cache.get(4, lambda: 40) == 40  # expired
    cache.get(5, lambda: 5)
    assert len(cache) == 2  # the expired ones were let go as new ones came
