"""The controller's queue of Events, sent by its `events` task, so that a task with something to tell never waits on
the API server (thousands of `MeterSilent` Events never hold a demotion's evictions back).

An Event that cannot be sent calls its `on_failure`, which gives back the claim that keeps it to one sending, so that
its task queues it again. The queue is bounded: when full, the oldest Event is dropped, counted and logged.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gpusharing.names import is_group
from timekeeper import metrics
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.objects import KubeUnavailable, ObjectRef

log = logging.getLogger(__name__)

QUEUE_SIZE = 20_000


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    warning: bool = True
    about: ObjectRef | None = None  # the object; None: the namespace (below)
    namespace: str | None = None  # an Event about a namespace itself, where `kubectl describe namespace` shows it
    shown_owner: bool = False  # about a pod's owner: sent on the object `kubectl describe` shows for it
    related: ObjectRef | None = None  # the other object it concerns
    on_failure: Callable[[], None] | None = None


class EventQueue:
    def __init__(self, kube: KubeApi, size: int = QUEUE_SIZE, wake: Callable[[], None] = lambda: None):
        self.kube = kube
        self.wake = wake  # tells the events task there is something to send
        self._queue: deque[Event] = deque()
        self._size = size
        self._lock = threading.Lock()

    def put(self, event: Event) -> None:
        with self._lock:
            if len(self._queue) >= self._size:
                dropped = self._queue.popleft()
                metrics.EVENTS_DROPPED.inc()
                log.warning("the Event queue is full (%d): dropped %s", self._size, dropped.reason)
            self._queue.append(event)
        metrics.EVENTS_QUEUED.set(len(self._queue))
        self.wake()

    def __len__(self) -> int:
        return len(self._queue)

    def send(self) -> int:
        """The `events` task: sends everything queued; how many were sent."""
        sent = 0
        while True:
            with self._lock:
                if not self._queue:
                    break
                event = self._queue.popleft()
            metrics.EVENTS_QUEUED.set(len(self._queue))
            try:
                if self._send(event):
                    sent += 1
                    metrics.EVENTS.labels(event.reason).inc()
            except KubeUnavailable as exc:
                log.warning("%s; the Event %s is made again on a later pass", exc, event.reason)
                if event.on_failure is not None:
                    event.on_failure()
        return sent

    def _send(self, event: Event) -> bool:
        """Whether there was something to record it on (a namespace deleted meanwhile has none)."""
        if event.namespace is not None:
            return not is_group(event.namespace) and self.kube.record_event(
                event.namespace, event.reason, event.message, event.warning
            )
        assert event.about is not None
        about = self.kube.shown_owner(event.about) if event.shown_owner else event.about
        self.kube.record_object_event(about, event.reason, event.message, event.warning, event.related)
        return True
