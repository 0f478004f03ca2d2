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
