"""Objects of one kind kept in memory by a LIST and then a WATCH (the informer pattern, without client-go): every
role's one list-and-watch, so that a request or a pass reads the cluster from memory instead of asking the API server.
docs/design/core.md tells how it recovers from failures and why it keeps only what its caller extracts.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from gpusharing.decoded import as_mapping
from gpusharing.outage import Outage

log = logging.getLogger(__name__)

WATCH_SECONDS = 300  # the API server ends a watch after this; the thread resumes from where it was
BACKOFF_FIRST_SECONDS = 0.8  # client-go's reflector: 800 ms, doubled up to 30 s
BACKOFF_MAX_SECONDS = 30.0
LIST_PAGE = 500  # objects per list request, as client-go's informers ask

Key = tuple[str, str]  # namespace, name
T = TypeVar("T")


def backoff_seconds(failures: int, uniform: Callable[[], float] = random.random) -> float:
    """Seconds to wait after `failures` (>= 1) failures in a row: doubling from BACKOFF_FIRST_SECONDS up to
    BACKOFF_MAX_SECONDS, each wait between half and all of that (jitter: caches of many processes that lost the
    API server together do not come back to it together)."""
    ceiling = min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2 ** min(failures - 1, 16))
    return float(ceiling / 2 + uniform() * ceiling / 2)


def key_of(obj: Mapping[str, Any]) -> Key:
    metadata = as_mapping(obj.get("metadata"))
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


class PlainEvents(watch.Watch):
    """The official client's watch, each event read once into plain dicts: its model classes (V1Pod), built field by
    field from every event, cost a busy watch dearly."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # the client's, as every call of it (pyproject.toml)

    def get_return_type(self, func: Callable[..., Any]) -> str | None:
        return None  # no type: the client keeps each event as read, {"type", "object", "raw_object"}


class WatchedObjects(Generic[T]):
    """`extract(obj)` of every object a `list_for_all_namespaces` call of the official client serves (None: not kept),
    followed by a background thread that lists, watches, and lists again when the watch expires or breaks, backing off
    after failures; readers on other threads see each entry before or after a change, never half of one.

    `items` is None until the first list succeeded; `broken_since` is the time (time.monotonic) the list or watch
    failed, while it has not listed again since. `on_sync(ok)` is told of each list or watch that succeeded or
    failed (metrics); every `on_change()` subscribed, of every change to the items; every `on_delete(value)`, of
    each kept object the watch saw deleted, as it last was (a deletion while no watch ran is only seen as its
    absence from the next list). `list_options` narrow the list and the watch on the server (label_selector, ...).
    """

    def __init__(
        self,
        kind: str,
        list_all: Callable[..., Any],
        extract: Callable[[Mapping[str, Any]], T | None],
        on_sync: Callable[[bool], None] | None = None,
        on_change: Callable[[], None] | None = None,
        on_delete: Callable[[T], None] | None = None,
        **list_options: str,
    ):
        self.kind = kind
        self._list_all = list_all
        self._list_options = list_options
        self._extract = extract
        self._on_sync = on_sync
        self._on_change: list[Callable[[], None]] = []
        self._on_delete: list[Callable[[T], None]] = []
        self.subscribe(on_change, on_delete)
        self.items: dict[Key, T] | None = None
        self.broken_since: float | None = None
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread: threading.Thread | None = None
        self._outage = Outage(log, f"the list and watch of {kind}", "lists")

    @property
    def synced(self) -> bool:
        return self.items is not None

    def subscribe(
        self, on_change: Callable[[], None] | None = None, on_delete: Callable[[T], None] | None = None
    ) -> None:
        """Adds a reader's handlers; each is called on the watch's thread, so it must return quickly."""
        if on_change is not None:
            self._on_change.append(on_change)
        if on_delete is not None:
            self._on_delete.append(on_delete)

    def start(self) -> None:
        """Follows the objects (again, after stop(): a timekeeper that leads again lists anew)."""
        self._stop.clear()
        if self._thread is None or not self._thread.is_alive():  # one still stopping carries on instead
            self._thread = threading.Thread(target=self._run, name=f"watch-{self.kind}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stops following; what was known is forgotten (unknown until the next start has listed)."""
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.items = None

    def list_now(self) -> None:
        """Lists every object again, in this thread, as the watch's thread does before it watches."""
        self._relist()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self._relist()
                for _ in self._follow(version):
                    failures = 0  # the watch delivers: recovered
            except Exception as exc:  # the API may be down, forbid us, or time out: keep what we have, try again
                if self._stop.is_set():  # stop() ended the watch under way
                    return
                if self.broken_since is None:
                    self.broken_since = time.monotonic()
                failures += 1
                wait = backoff_seconds(failures)
                self._outage.failed(
                    _reason(exc),
                    f"the last known {self.kind} stay in force, listed again with backoff "
                    f"(up to {BACKOFF_MAX_SECONDS:g} s, jittered)",
                )
                self._report(False)
                self._stop.wait(wait)

    def _relist(self) -> str:
        """Lists every object, a page at a time (as informers do: a large cluster's pods are never one body)."""
        items: dict[Key, T] = {}
        page: dict[str, Any] = {}
        while True:
            response = self._list_all(
                limit=LIST_PAGE, _preload_content=False, _request_timeout=60, **self._list_options, **page
            )
            body = json.loads(response.data)
            for obj in body.get("items", []):
                value = self._extract(obj)
                if value is not None:
                    items[key_of(obj)] = value
            metadata = as_mapping(body.get("metadata"))
            if not metadata.get("continue"):
                break
            page = {"_continue": metadata["continue"]}
        self.items = items  # one reference swap: readers never see a half-built table
        self.broken_since = None
        self._report(True)
        self._changed()
        if self._outage.ongoing:
            self._outage.succeeded(f"{len(items)} {self.kind} listed")
        else:
            log.info("%d %s listed", len(items), self.kind)
        return str(metadata.get("resourceVersion", ""))

    def _follow(self, version: str) -> Iterator[None]:
        """Applies watch events until the watch ends; raises (to relist) on an expired version or a broken stream."""
        # Events as plain dicts: no model classes to build (nor to lack: this client has none for resource.k8s.io/v1).
        stream: watch.Watch = PlainEvents()
        self._watch = stream
        while not self._stop.is_set():
            for event in stream.stream(
                self._list_all, resource_version=version, timeout_seconds=WATCH_SECONDS, **self._list_options,
                allow_watch_bookmarks=True, _request_timeout=WATCH_SECONDS + 30,
            ):
                kind, obj = event["type"], as_mapping(event["raw_object"])
                version = str(as_mapping(obj.get("metadata")).get("resourceVersion", version))
                items = self.items
                assert items is not None
                # One dict operation at a time: a reader on another thread sees the entry before or after.
                if kind in ("ADDED", "MODIFIED"):
                    value = self._extract(obj)
                    if value is not None:
                        items[key_of(obj)] = value
                    else:
                        items.pop(key_of(obj), None)
                elif kind == "DELETED":
                    items.pop(key_of(obj), None)
                    last = self._extract(obj) if self._on_delete else None
                    if last is not None:
                        for on_delete in self._on_delete:
                            on_delete(last)
                if kind != "BOOKMARK":
                    self._changed()
                yield

    def _report(self, ok: bool) -> None:
        if self._on_sync is not None:
            self._on_sync(ok)

    def _changed(self) -> None:
        for on_change in self._on_change:
            on_change()


def _reason(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status}: {exc.reason}"
    return f"{type(exc).__name__}: {exc}"
