"""Named periodic tasks, each on a thread of its own, as a controller manager runs its controllers: no task's slow
run delays another's. docs/design/core.md tells how runs are timed and why.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from gpusharing.clock import Clock

log = logging.getLogger(__name__)

Observer = Callable[[str, float, float], None]  # task name, seconds the run took, seconds it began late


@dataclass
class Task:
    """A named periodic run; a `leader_only` task runs only while the scheduler's process leads."""

    name: str
    interval_seconds: float
    run: Callable[[], object]
    leader_only: bool = True


@dataclass
class _Slot:
    task: Task
    due: float  # by the Clock's monotonic time
    woken: threading.Event = field(default_factory=threading.Event)
    running: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None
    last: object = None  # what its last run returned


class TaskScheduler:
    """Runs each task every `interval_seconds` by the Clock's monotonic time, at once when woken, never twice at a time,
    and a leader-only task only while `leading()`. A late run is not made up for; an exception in a run is logged and
    the task runs again at its next time. `observe` is told each run's duration and lateness (metrics)."""

    def __init__(self, clock: Clock, leading: Callable[[], bool] = lambda: True, observe: Observer | None = None):
        self.clock = clock
        self.leading = leading
        self.observe = observe
        self._slots: dict[str, _Slot] = {}
        self._stop = threading.Event()

    def add(self, task: Task) -> None:
        if task.name in self._slots:
            raise ValueError(f"a task named {task.name!r} is scheduled already")
        self._slots[task.name] = _Slot(task, self.clock.monotonic())

    @property
    def names(self) -> list[str]:
        return list(self._slots)

    def last(self, name: str) -> object:
        """What the task's last run returned (None before its first)."""
        return self._slots[name].last

    def wake(self, *names: str) -> None:
        """Runs the named tasks (every task, without names) as soon as their threads can."""
        for name in names or tuple(self._slots):
            slot = self._slots[name]
            slot.due = min(slot.due, self.clock.monotonic())
            slot.woken.set()

    def run_due(self) -> dict[str, object]:
        """Runs every task that is due now, here, in the order they were added; what each that ran returned, by name.
        Tests advance the Clock and call this instead of waiting on threads."""
        ran: dict[str, object] = {}
        for slot in list(self._slots.values()):
            if self.clock.monotonic() >= slot.due and self._run(slot):
                ran[slot.task.name] = slot.last
        return ran

    def start(self) -> None:
        self._stop.clear()
        for slot in self._slots.values():
            if slot.thread is None or not slot.thread.is_alive():
                slot.thread = threading.Thread(
                    target=self._loop, args=(slot,), name=f"task-{slot.task.name}", daemon=True
                )
                slot.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stops every task after the run under way, waiting up to `timeout` seconds in all."""
        self._stop.set()
        for slot in self._slots.values():
            slot.woken.set()
        deadline = self.clock.monotonic() + timeout
        for slot in self._slots.values():
            if slot.thread is not None:
                slot.thread.join(max(0.0, deadline - self.clock.monotonic()))

    def _loop(self, slot: _Slot) -> None:
        while not self._stop.is_set():
            wait = slot.due - self.clock.monotonic()
            if wait > 0:
                slot.woken.wait(wait)
            slot.woken.clear()
            if self._stop.is_set():
                return
            if self.clock.monotonic() >= slot.due:
                self._run(slot)

    def _run(self, slot: _Slot) -> bool:
        """One run of the slot's task, unless it is running (or it leads and this process does not); whether it ran."""
        task = slot.task
        if not slot.running.acquire(blocking=False):
            return False
        try:
            began = self.clock.monotonic()
            late = max(0.0, began - slot.due)
            following = slot.due + task.interval_seconds
            # no run made up for: due an interval after the late one was due, or, when that has passed, after it began
            slot.due = following if following > began else began + task.interval_seconds
            if task.leader_only and not self.leading():
                return False
            slot.last = None
            try:
                slot.last = task.run()
            except Exception:  # the task runs again at its next time
                log.exception("task %s failed; it runs again in %g s", task.name, task.interval_seconds)
            if self.observe is not None:
                self.observe(task.name, self.clock.monotonic() - began, late)
            return True
        finally:
            slot.running.release()
