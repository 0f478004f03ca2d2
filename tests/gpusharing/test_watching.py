"""The list-and-watch cache: every page of a paginated list, only what the caller keeps, the watch's changes and
deletions told to every subscribed reader, and the thread's backoff, outages and restarts. Driven through the public
seams (list_now, start/stop, subscribe) with the official client's watch reading fake responses."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpusharing.kube import watching
from gpusharing.kube.watching import PlainEvents, WatchedObjects


class WatchResponse:
    """What the client reads a watch from: `events`, one JSON line each, then the end of the stream."""

    status = 200

    def __init__(self, *events: dict[str, Any]):
        self.lines = [json.dumps(event).encode() + b"\n" for event in events]

    def stream(self, amt: Any = None, decode_content: Any = None) -> Iterator[bytes]:
        return iter(self.lines)

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


def listed(*items: dict[str, Any], version: str = "1") -> SimpleNamespace:
    return SimpleNamespace(data=json.dumps({"items": list(items), "metadata": {"resourceVersion": version}}).encode())


def quiet_watch() -> WatchResponse:
    """A watch that ends without an event, a little later (the thread watches again: no loop that spins)."""
    time.sleep(0.02)
    return WatchResponse()


def wait_for(condition: Callable[[], object]) -> None:
    deadline = time.monotonic() + 10  # stops a broken test from hanging; not a speed check
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


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
    watched.list_now()
    assert watched.items == {("ml", "p0"): "p0", ("ml", "p2"): "p2", ("ml", "p4"): "p4"}
    assert [call.get("_continue") for call in calls] == [None, "2", "4"] and all(call["limit"] == 2 for call in calls)
    assert changes == [True]


def test_an_outage_is_one_line_when_it_starts_and_one_when_it_ends(
    monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a line per list retried (every few seconds, for as long as the API server is away)."""
    monkeypatch.setattr(watching, "backoff_seconds", lambda failures: 0.0)
    failures = iter(range(12))
    watching_now = threading.Event()

    def list_all(**kwargs: Any) -> Any:
        if kwargs.get("watch"):  # listed again: watching
            watching_now.set()
            return quiet_watch()
        if next(failures, None) is not None:
            raise ApiException(status=503, reason="Service Unavailable")
        return listed(version="7")

    watched = WatchedObjects("pods", list_all, lambda pod: pod)
    caplog.set_level(logging.INFO, logger="gpusharing.kube.watching")
    watched.start()
    try:
        wait_for(watching_now.is_set)
    finally:
        watched.stop()
    (started, ended) = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "gpusharing.kube.watching"]
    assert started == (
        "WARNING",
        "the list and watch of pods is unavailable: HTTP 503: Service Unavailable; the last known "
        "pods stay in force, listed again with backoff (up to 30 s, jittered) (logged again when it is back)",
    )
    assert ended[0] == "INFO" and ended[1].startswith("the list and watch of pods is back after ")
    assert ended[1].endswith(" (12 lists failed): 0 pods listed")  # how long it lasted: tests/gpusharing/test_outage.py


def test_a_failed_list_marks_the_watch_broken_until_it_lists_again() -> None:
    failing = [True]

    def list_all(**kwargs: Any) -> Any:
        if failing[0]:
            raise ConnectionError("the API server is away")
        return quiet_watch() if kwargs.get("watch") else listed()

    syncs: list[bool] = []
    watched = WatchedObjects("pods", list_all, lambda pod: pod, on_sync=syncs.append)
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
    def list_all(**kwargs: Any) -> Any:
        if kwargs.get("watch"):
            raise ApiException(status=403, reason="watch forbidden")
        return listed()

    watched = WatchedObjects("pods", list_all, lambda pod: pod)
    failures: list[int] = []

    def backoff(n: int) -> float:
        failures.append(n)
        return 0.0 if len(failures) < 4 else 60.0  # then waits (stop() ends the wait)

    monkeypatch.setattr(watching, "backoff_seconds", backoff)
    watched.start()
    try:
        wait_for(lambda: len(failures) >= 4)
    finally:
        watched.stop()
    assert failures == [1, 2, 3, 4]  # the successful lists between them do not count as recovered


def test_a_watch_stopped_and_started_again_forgets_what_it_knew_and_lists_anew() -> None:
    """A timekeeper that loses its Lease stops its watches and, leading again, starts them: they must follow again."""
    lists: list[int] = []

    def list_all(**kwargs: Any) -> Any:
        if kwargs.get("watch"):
            return quiet_watch()
        lists.append(1)
        return listed({"metadata": {"namespace": "ml", "name": f"p{len(lists)}"}})

    watched = WatchedObjects("pods", list_all, lambda pod: pod["metadata"]["name"])
    deadline = time.monotonic() + 10  # stops a broken test from hanging; not a speed check
    watched.start()
    try:
        while watched.items is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watched.items is not None
        watched.stop()
        assert watched.items is None  # unknown while stopped
        before = len(lists)
        watched.start()
        while (watched.items is None or len(lists) == before) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watched.items is not None and len(lists) > before
    finally:
        watched.stop()


def test_every_reader_subscribed_is_told_of_changes_and_of_deletions_as_the_object_last_was() -> None:
    pod = {"metadata": {"namespace": "ml", "name": "p0", "resourceVersion": "2"}, "spec": {"gpu": "0.5"}}
    modified = {**pod, "metadata": {**pod["metadata"], "resourceVersion": "3"}, "spec": {"gpu": "0.25"}}
    deleted = {**modified, "metadata": {**modified["metadata"], "resourceVersion": "4"}}
    watches: list[dict[str, Any]] = []
    stream = iter([WatchResponse({"type": "MODIFIED", "object": modified}, {"type": "BOOKMARK", "object": modified},
                                 {"type": "DELETED", "object": deleted})])

    def list_all(**kwargs: Any) -> Any:
        if kwargs.get("watch"):
            watches.append(kwargs)
            return next(stream, None) or quiet_watch()
        return listed(pod)

    changes: list[str] = []
    deletions: list[tuple[str, str]] = []
    watched = WatchedObjects(
        "pods",
        list_all,
        lambda obj: obj["spec"]["gpu"],
        on_change=lambda: changes.append("first"),
        on_delete=lambda gpu: deletions.append(("first", gpu)),
    )
    watched.subscribe(
        on_change=lambda: changes.append("second"), on_delete=lambda gpu: deletions.append(("second", gpu))
    )
    watched.subscribe(on_change=lambda: changes.append("third"))
    watched.start()
    try:
        wait_for(lambda: len(deletions) == 2)
        assert watched.items == {}
    finally:
        watched.stop()
    assert watches[0]["resource_version"] == "1"  # from the list's version
    # Each reader, in the order subscribed, of the list, the change and the deletion (not of the bookmark).
    assert changes == ["first", "second", "third"] * 3
    assert deletions == [("first", "0.25"), ("second", "0.25")]  # as the object last was


def test_list_options_narrow_the_list_and_the_watch_on_the_server() -> None:
    calls: list[dict[str, Any]] = []

    def list_all(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return quiet_watch() if kwargs.get("watch") else listed()

    watched = WatchedObjects("pods", list_all, lambda pod: pod, label_selector="gpusharing.io/governed=true",
                             field_selector="status.phase=Running")
    watched.list_now()
    assert watched.synced and calls[0]["label_selector"] == "gpusharing.io/governed=true"
    watched.start()
    try:
        wait_for(lambda: any(call.get("watch") for call in calls))
    finally:
        watched.stop()
    watch = next(call for call in calls if call.get("watch"))
    assert (watch["label_selector"], watch["field_selector"]) == ("gpusharing.io/governed=true", "status.phase=Running")


def test_a_watch_event_is_read_once_into_the_plain_object_it_keeps() -> None:
    """No model class (the client would build a V1Pod from every pod event), and no second reading of the object."""
    from kubernetes import client

    events = PlainEvents()
    pod = {"metadata": {"name": "train-0", "namespace": "ml-team", "resourceVersion": "7"}, "spec": {"containers": []}}
    line = json.dumps({"type": "MODIFIED", "object": pod})
    event = events.unmarshal_event(line, events.get_return_type(client.CoreV1Api().list_pod_for_all_namespaces))
    assert event["type"] == "MODIFIED" and event["raw_object"] == pod
    assert event["object"] is event["raw_object"]  # one reading: the object is not read again from written-back JSON
