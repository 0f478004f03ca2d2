"""The controller's task scheduler: named periodic tasks driven by a fake Clock through run_due (no threads), and
with real threads, one task's slow run never delaying another's."""

from __future__ import annotations

import datetime as dt
import threading
import time

from gpusharing.scheduling import Task, TaskScheduler


class FakeClock:
    def __init__(self) -> None:
        self.elapsed = 100.0

    def now(self) -> dt.datetime:
        return dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=self.elapsed)

    def monotonic(self) -> float:
        return self.elapsed

    def advance(self, seconds: float) -> None:
        self.elapsed += seconds


def counting(runs: list[str], name: str) -> Task:
    return Task(name, 10.0, lambda: runs.append(name) or len(runs))


def test_tasks_run_at_their_interval_by_the_clock() -> None:
    clock, runs = FakeClock(), []
    scheduler = TaskScheduler(clock)
    scheduler.add(counting(runs, "often"))
    scheduler.add(Task("seldom", 30.0, lambda: runs.append("seldom")))
    assert scheduler.run_due() == {"often": 1, "seldom": None}  # due at once when added; what each returned
    assert scheduler.run_due() == {} and scheduler.last("often") == 1
    clock.advance(9.9)
    assert scheduler.run_due() == {}
    clock.advance(0.1)
    assert list(scheduler.run_due()) == ["often"]
    clock.advance(20)
    assert list(scheduler.run_due()) == ["often", "seldom"]
    assert runs == ["often", "seldom", "often", "often", "seldom"]


def test_a_late_run_is_not_made_up_for() -> None:
    clock, runs = FakeClock(), []
    scheduler = TaskScheduler(clock)
    scheduler.add(counting(runs, "often"))
    scheduler.run_due()
    clock.advance(55)  # five runs missed: one run now, not five
    assert list(scheduler.run_due()) == ["often"] and scheduler.run_due() == {}
    clock.advance(9.9)  # the next is due an interval after the late one began, not sooner
    assert scheduler.run_due() == {}
    clock.advance(0.1)
    assert list(scheduler.run_due()) == ["often"] and runs == ["often"] * 3


def test_a_woken_task_runs_at_once_and_only_it() -> None:
    clock, runs = FakeClock(), []
    scheduler = TaskScheduler(clock)
    for name in ("budgets", "statuses"):
        scheduler.add(counting(runs, name))
    scheduler.run_due()
    clock.advance(1)
    scheduler.wake("budgets")
    assert list(scheduler.run_due()) == ["budgets"]
    scheduler.wake()  # every task
    assert list(scheduler.run_due()) == ["budgets", "statuses"]


def test_leader_only_tasks_skip_while_not_leading() -> None:
    clock, runs, leading = FakeClock(), [], [False]
    scheduler = TaskScheduler(clock, leading=lambda: leading[0])
    scheduler.add(Task("lease", 10.0, lambda: runs.append("lease"), leader_only=False))
    scheduler.add(counting(runs, "evictions"))
    assert list(scheduler.run_due()) == ["lease"] and runs == ["lease"]
    leading[0] = True
    clock.advance(10)  # skipped runs are not owed: it runs at its next time
    assert list(scheduler.run_due()) == ["lease", "evictions"]


def test_one_tasks_exception_does_not_stop_the_others_nor_its_next_run() -> None:
    clock, runs = FakeClock(), []

    def failing() -> None:
        runs.append("failing")
        raise RuntimeError("the database is away")

    scheduler = TaskScheduler(clock)
    scheduler.add(Task("failing", 10.0, failing))
    scheduler.add(counting(runs, "after"))
    assert scheduler.run_due() == {"failing": None, "after": 2}
    clock.advance(10)
    scheduler.run_due()
    assert runs == ["failing", "after", "failing", "after"]


def test_observe_gets_each_runs_duration_and_lateness() -> None:
    clock = FakeClock()
    seen: list[tuple[str, float, float]] = []
    scheduler = TaskScheduler(clock, observe=lambda name, took, late: seen.append((name, took, late)))
    scheduler.add(Task("slow", 10.0, lambda: clock.advance(2.5)))
    scheduler.run_due()
    clock.advance(10.5)  # 3 s late: due at 12.5 s after the first began (an interval later), run at 13
    scheduler.run_due()
    assert seen == [("slow", 2.5, 0.0), ("slow", 2.5, 3.0)]


def test_with_threads_a_slow_task_does_not_delay_another() -> None:
    """Real threads, bounded waits, no assertion on how long anything took."""
    release, ran_fast = threading.Event(), threading.Event()
    slow_started = threading.Event()

    def slow() -> None:
        slow_started.set()
        release.wait(10)  # held until the other has run

    class Monotonic(FakeClock):
        def monotonic(self) -> float:
            return time.monotonic()

    scheduler = TaskScheduler(Monotonic())
    scheduler.add(Task("slow", 3600.0, slow))
    scheduler.add(Task("fast", 3600.0, ran_fast.set))
    scheduler.start()
    try:
        assert slow_started.wait(10)
        scheduler.wake("fast")
        assert ran_fast.wait(10)  # while the slow one still runs
        assert not release.is_set()
    finally:
        release.set()
        scheduler.stop()


def test_a_task_never_runs_twice_at_a_time() -> None:
    inside, release = threading.Event(), threading.Event()
    clock, runs = FakeClock(), []

    def long_run() -> None:
        runs.append(1)
        inside.set()
        release.wait(10)

    scheduler = TaskScheduler(clock)
    scheduler.add(Task("long", 10.0, long_run))
    first = threading.Thread(target=scheduler.run_due)
    first.start()
    try:
        assert inside.wait(10)
        scheduler.wake("long")
        assert scheduler.run_due() == {}  # under way in the other thread: not run again beside it
    finally:
        release.set()
        first.join(10)
    assert runs == [1]
