"""The list half of a list+watch cache: every page of a paginated list, only what the caller keeps."""

from __future__ import annotations

import json
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
