"""Budget states: polled in the background, never fetched per request, kept when the timekeeper is away."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from gpusharing.contract import MIN_BUDGET_REFRESH_SECONDS, BudgetState
from tests.webhook.conftest import FakeTimekeeper
from webhook.caches.budgets import BudgetStateCache, states_from_listing


def test_states_are_read_from_the_listing(timekeeper: FakeTimekeeper) -> None:
    timekeeper.set_states(a="in-budget", b="over-budget", c="unlimited", d="something-new")
    cache = BudgetStateCache(timekeeper.url)
    assert cache.refresh()
    assert [cache.state_of(ns) for ns in "abcde"] == [
        BudgetState.IN_BUDGET,
        BudgetState.OVER_BUDGET,
        BudgetState.UNLIMITED,
        BudgetState.UNKNOWN,
        BudgetState.UNKNOWN,
    ]


@pytest.mark.parametrize(
    ("default", "unlisted"),
    [
        ({"gpuMinutes": 0, "period": "monthly", "state": "over-budget"}, BudgetState.OVER_BUDGET),  # 0 allows nothing
        ({"gpuMinutes": 600, "period": "weekly", "state": "in-budget"}, BudgetState.IN_BUDGET),
        ({"gpuMinutes": None, "period": "monthly", "state": "unlimited"}, BudgetState.UNLIMITED),
        (None, BudgetState.UNKNOWN),  # a timekeeper that does not tell its default
    ],
)
def test_the_default_budget_applies_to_every_namespace_the_listing_leaves_out(
    timekeeper: FakeTimekeeper, default: dict[str, object] | None, unlisted: BudgetState
) -> None:
    timekeeper.set_states(heavy="over-budget", light="in-budget")
    timekeeper.default = default
    cache = BudgetStateCache(timekeeper.url)
    assert cache.refresh()
    assert (cache.state_of("newteam"), cache.state_of("heavy"), cache.state_of("light")) == (
        unlisted, BudgetState.OVER_BUDGET, BudgetState.IN_BUDGET)


def test_last_known_states_stay_in_force_when_the_timekeeper_is_down(timekeeper: FakeTimekeeper) -> None:
    timekeeper.set_states(a="over-budget")
    cache = BudgetStateCache(timekeeper.url)
    assert cache.refresh()
    timekeeper.up = False
    assert not cache.refresh()
    assert cache.state_of("a") is BudgetState.OVER_BUDGET


def test_an_outage_is_one_line_when_it_starts_and_one_when_it_ends(
    timekeeper: FakeTimekeeper, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a line per poll (every few seconds, in every worker): one saying how admission carries on, one saying how
    long it lasted."""
    now = [1000.0]
    cache = BudgetStateCache(timekeeper.url, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="webhook.caches.budgets")
    timekeeper.set_states(a="over-budget")
    assert cache.refresh()
    timekeeper.up = False
    for _ in range(50):
        now[0] += 5
        assert not cache.refresh() and cache.state_of("a") is BudgetState.OVER_BUDGET
    timekeeper.up = True
    now[0] += 5
    assert cache.refresh() and cache.refresh()
    listing = f"the timekeeper's budget listing {timekeeper.url}/api/v1/budgets"
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"{listing} is unavailable: HTTP 503; GPU pods are admitted on the budget states it last listed "
                    "(logged again when it is back)"),
        ("INFO", f"{listing} is back after 4 min 10 s (50 polls failed): budget states are current again"),
    ]


def test_an_outage_from_the_start_says_that_no_state_is_known(caplog: pytest.LogCaptureFixture) -> None:
    cache = BudgetStateCache("http://127.0.0.1:9")
    caplog.set_level(logging.INFO, logger="webhook.caches.budgets")
    assert not cache.refresh() and not cache.refresh()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (
        "the timekeeper's budget listing http://127.0.0.1:9/api/v1/budgets is unavailable: connection refused by "
        "127.0.0.1:9: is the server running there?; no budget state is known yet: every namespace is unknown, "
        "its GPU pods admitted as in budget (logged again when it is back)"
    )


def test_unreachable_timekeeper_is_survived() -> None:
    cache = BudgetStateCache("http://127.0.0.1:9")  # discard port: nothing listens
    assert not cache.refresh()
    assert cache.state_of("a") is BudgetState.UNKNOWN


def test_without_a_timekeeper_every_namespace_is_unknown() -> None:
    cache = BudgetStateCache(None)
    cache.start()
    assert not cache.refresh() and cache.state_of("a") is BudgetState.UNKNOWN


def test_background_refresh_follows_changes(timekeeper: FakeTimekeeper) -> None:
    timekeeper.set_states(a="in-budget")
    cache = BudgetStateCache(timekeeper.url, refresh_seconds=0.05)
    cache.start()
    try:
        _wait_for(lambda: cache.state_of("a") is BudgetState.IN_BUDGET)
        timekeeper.set_states(a="over-budget")
        _wait_for(lambda: cache.state_of("a") is BudgetState.OVER_BUDGET)
    finally:
        cache.stop()


def test_token_is_read_afresh_for_each_poll(timekeeper: FakeTimekeeper, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    cache = BudgetStateCache(timekeeper.url, token_file=str(token))
    cache.refresh()
    token.write_text("rotated")
    cache.refresh()
    assert timekeeper.authorizations == ["Bearer first", "Bearer rotated"]


@pytest.mark.parametrize("body", [[], {"items": "x"}, {}])
def test_malformed_listing_is_refused(body: object) -> None:
    with pytest.raises(ValueError):
        states_from_listing(body)


def _wait_for(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_an_unforeseen_failure_does_not_end_the_polling(timekeeper: FakeTimekeeper) -> None:
    cache = BudgetStateCache(timekeeper.url, refresh_seconds=0.01)
    polls: list[int] = []
    real_refresh = cache.refresh

    def refresh(refresh_seconds: float | None = None) -> bool:
        polls.append(1)
        if len(polls) == 1:
            raise RuntimeError("a bug in one poll")
        return real_refresh(refresh_seconds)

    cache.refresh = refresh  # type: ignore[method-assign]
    cache.start()
    try:
        deadline = time.monotonic() + 30  # only stops a broken test from hanging
        while len(polls) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        cache.stop()
    assert len(polls) >= 3


def test_each_poll_tells_the_timekeeper_which_listing_this_process_holds(timekeeper: FakeTimekeeper) -> None:
    cache = BudgetStateCache(timekeeper.url, refresh_seconds=0.5)
    assert cache.refresh() and cache.refresh()
    first, second = timekeeper.polls
    assert first == {"webhook": cache.name, "inForce": "0.0", "refreshSeconds": "0.5"}  # none yet
    assert second == {**first, "inForce": "1.0"}  # the listing stamped 1.0, put in force by the first poll


def test_a_stopping_process_says_so_with_a_last_poll_at_the_shortest_interval(timekeeper: FakeTimekeeper) -> None:
    """So that a crossing's evictions wait for it a few seconds at most, not a few of its poll intervals."""
    cache = BudgetStateCache(timekeeper.url, refresh_seconds=30)
    cache.start()
    deadline = time.monotonic() + 30  # only stops a broken test from hanging
    while not timekeeper.polls and time.monotonic() < deadline:
        time.sleep(0.01)
    cache.stop()
    assert [poll["refreshSeconds"] for poll in timekeeper.polls] == ["30", str(MIN_BUDGET_REFRESH_SECONDS)]
    assert timekeeper.polls[-1]["inForce"] == "1.0"  # the listing it held, to the last
