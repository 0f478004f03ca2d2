"""The list half of a list+watch cache: every page of a paginated list, only what the caller keeps."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

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
