"""The list half of a list+watch cache: every page of a paginated list, only what the caller keeps."""

from __future__ import annotations

import json
import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpusharing.kube import watching
from gpusharing.kube.watching import WatchedObjects


def test_a_list_is_read_a_page_at_a_time_and_only_what_is_extracted_is_kept(monkeypatch: Any) -> None:
    monkeypatch.setattr(watching, "LIST_PAGE", 2)
    pods = [{"metadata": {"namespace": "ml", "name": f"p{i}"}, "spec": {"keep": i % 2 == 0}} for i in range(5)]
    calls: list[dict[str, Any]] = []

    def list_all(**kwargs: Any) -> SimpleNamespace:
        calls.append(kwargs)
        start = int(kwargs.get("_continue", 0))
        end = start + kwargs["limit"]
        metadata = {"resourceVersion": "42", **({"continue": str(end)} if end < len(pods) else {})}
        return SimpleNamespace(data=json.dumps({"items": pods[start:end], "metadata": metadata}).encode())

    changes: list[bool] = []
    watched = WatchedObjects("pods", list_all, lambda pod: pod["metadata"]["name"] if pod["spec"]["keep"] else None,
                             on_sync=changes.append)
    assert watched.items is None and not watched.synced
    assert watched._relist() == "42"
    assert watched.items == {("ml", "p0"): "p0", ("ml", "p2"): "p2", ("ml", "p4"): "p4"}
    assert [call.get("_continue") for call in calls] == [None, "2", "4"] and all(call["limit"] == 2 for call in calls)
    assert changes == [True]


def test_an_outage_is_one_line_when_it_starts_and_one_when_it_ends(monkeypatch: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Not a line per list retried (every few seconds, for as long as the API server is away)."""
    monkeypatch.setattr(watching, "backoff_seconds", lambda failures: 0.0)
    failures = iter(range(12))

    def list_all(**kwargs: Any) -> SimpleNamespace:
        if kwargs.get("watch"):  # listed again: the test ends as the watch begins
            watched._stop.set()
            raise ApiException(status=0, reason="stopped")
        if next(failures, None) is not None:
            raise ApiException(status=503, reason="Service Unavailable")
        return SimpleNamespace(data=json.dumps({"items": [], "metadata": {"resourceVersion": "7"}}).encode())

    watched = WatchedObjects("pods", list_all, lambda pod: pod)
    caplog.set_level(logging.INFO, logger="gpusharing.kube.watching")
    watched._run()
    (started, ended) = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert started == ("WARNING", "the list and watch of pods is unavailable: HTTP 503: Service Unavailable; the last known "
                                  "pods stay in force, listed again with backoff (up to 30 s, jittered) (logged again when it is back)")
    assert ended[0] == "INFO" and ended[1].startswith("the list and watch of pods is back after ")
    assert ended[1].endswith(" (12 lists failed): 0 pods listed")  # how long it lasted: tests/gpusharing/test_outage.py


def test_a_failed_list_marks_the_watch_broken_until_it_lists_again() -> None:
    failing = [True]

    def list_all(**kwargs: Any) -> SimpleNamespace:
        if failing[0]:
            raise ConnectionError("the API server is away")
        return SimpleNamespace(data=json.dumps({"items": [], "metadata": {"resourceVersion": "1"}}).encode())

    syncs: list[bool] = []
    watched = WatchedObjects("pods", list_all, lambda pod: pod, on_sync=syncs.append)
    watched._follow = lambda version: iter(())  # type: ignore[method-assign]  # no watch stream: list, and list again
    watched.start()
    try:
        wait = time.monotonic() + 10
        while not syncs and time.monotonic() < wait:
            time.sleep(0.01)
        assert watched.broken_since is not None and watched.items is None and syncs[0] is False
        failing[0] = False
        while watched.items is None and time.monotonic() < wait:
            time.sleep(0.01)
        assert watched.items == {} and watched.broken_since is None
    finally:
        watched.stop()


def test_backoff_doubles_to_its_cap_with_jitter() -> None:
    lowest = [watching.backoff_seconds(n, lambda: 0.0) for n in range(1, 10)]
    highest = [watching.backoff_seconds(n, lambda: 1.0) for n in range(1, 10)]
    assert highest[:4] == [0.8, 1.6, 3.2, 6.4] and highest[-1] == watching.BACKOFF_MAX_SECONDS
    assert lowest == [h / 2 for h in highest]  # every wait between half and all of its ceiling


def test_a_list_that_succeeds_while_every_watch_fails_backs_off_further_each_time(monkeypatch: Any) -> None:
    def list_all(**kwargs: Any) -> SimpleNamespace:
        return SimpleNamespace(data=json.dumps({"items": [], "metadata": {"resourceVersion": "1"}}).encode())

    watched = WatchedObjects("pods", list_all, lambda pod: pod)
    failures: list[int] = []

    def backoff(n: int) -> float:
        failures.append(n)
        if len(failures) == 4:
            watched._stop.set()
        return 0.0

    def follow(version: str) -> Any:
        raise RuntimeError("HTTP 403: watch forbidden")

    monkeypatch.setattr(watching, "backoff_seconds", backoff)
    monkeypatch.setattr(watched, "_follow", follow)
    watched._run()
    assert failures == [1, 2, 3, 4]  # the successful lists between them do not count as recovered


def test_a_watch_stopped_and_started_again_forgets_what_it_knew_and_lists_anew() -> None:
    """A timekeeper that loses its Lease stops its watches and, leading again, starts them: they must follow again."""
    lists: list[int] = []

    def list_all(**kwargs: Any) -> SimpleNamespace:
        lists.append(1)
        pods = [{"metadata": {"namespace": "ml", "name": f"p{len(lists)}"}}]
        return SimpleNamespace(data=json.dumps({"items": pods, "metadata": {"resourceVersion": "1"}}).encode())

    watched = WatchedObjects("pods", list_all, lambda pod: pod["metadata"]["name"])
    watched._follow = lambda version: iter(()) if watched._stop.wait(0.05) else iter(())  # type: ignore[method-assign]
    deadline = time.monotonic() + 10  # stops a broken test from hanging; not a speed check
    watched.start()
    try:
        while watched.items is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watched.items is not None
        watched.stop()
        assert watched.items is None  # unknown while stopped
        listed = len(lists)
        watched.start()
        while (watched.items is None or len(lists) == listed) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watched.items is not None and len(lists) > listed
    finally:
        watched.stop()
