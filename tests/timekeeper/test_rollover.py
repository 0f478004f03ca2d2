"""A monthly period boundary end to end: `gpusharing timekeeper serve` (two workers, each with its demoter) on
SQLite and PostgreSQL, its clock moved by the test (TIMEKEEPER_CLOCK), reports arriving late, twice and across
the boundary, Events written to the HTTP fake of the Kubernetes API.

Every GPU-second is charged to exactly one period (that of the UTC day the report is received), the namespace
flips back to in-budget at the boundary, and each change of state gets one Event.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import create_engine, select

from demo.kubeapi import FakeKube
from gpusharing.settings.env import ConfigError
from testbed.timekeeper_processes import ControllerProcess, TimekeeperProcess
from tests.timekeeper.conftest import ADMIN, METER
from tests.timekeeper.fake_clock import FileClock
from timekeeper.app import create_app
from timekeeper.config import TimekeeperConfig
from timekeeper.database.tables import namespace_usage, pod_ledgers

UTC = dt.timezone.utc
BOUNDARY = dt.datetime(2028, 3, 1, tzinfo=UTC)  # the end of a leap February
BUDGET_SECONDS = 3600  # 60 GPU-minutes a month


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Polls until `condition` holds; the deadline only stops a broken run from hanging (not a speed check)."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def test_a_monthly_rollover_charges_every_gpu_second_to_one_period_and_flips_back_once(
    database_url: str, fake_kube: FakeKube, tokens_file: str, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(fake_kube.kubeconfig())
    clock = FileClock(tmp_path / "now", BOUNDARY - dt.timedelta(hours=1))
    env = {**clock.env(), "TIMEKEEPER_KUBECONFIG": str(kubeconfig), "TIMEKEEPER_DEMOTION_INTERVAL_SECONDS": "0.1"}
    answers: list[tuple[str, dict[str, Any]]] = []  # (period, answer)

    with TimekeeperProcess(database_url, tokens_file, tmp_path / "timekeeper.log", **env) as timekeeper, \
            ControllerProcess(database_url, tmp_path / "controller.log", **env) as controller:
        session = requests.Session()

        def call(method: str, path: str, token: str = ADMIN, **kwargs: Any) -> Any:
            answer = session.request(
                method,
                f"{timekeeper.url}/api/v1/{path}",
                headers={"Authorization": f"Bearer {token}"},
                timeout=30,
                **kwargs,
            )
            assert answer.status_code in (200, 201), answer.text
            return answer.json()

        def report(pod: str, seq: int, cumulative: float) -> float:
            body = {
                "podUid": f"uid-{pod}",
                "namespace": "team-a",
                "pod": pod,
                "gpuShare": 1.0,
                "seq": seq,
                "gpuSeconds": cumulative,
            }
            answer = call("POST", "reports", METER, json=body)
            answers.append(("february" if clock.now < BOUNDARY else "march", answer))
            charged: float = answer["chargedGpuSeconds"]
            return charged

        def events() -> list[str]:
            """The namespace's transition Events (a pass that runs between two reports may also see a warning
            threshold crossed, which has its own Event and tests)."""
            transitions = ("GPUBudgetExhausted", "GPUBudgetRestored")
            return [
                e["reason"]
                for e in fake_kube.events
                if e["involvedObject"]["name"] == "team-a" and e["reason"] in transitions
            ]

        call("PUT", "budgets/team-a", json={"gpuMinutes": BUDGET_SECONDS / 60, "evictOnExhaustion": True})

        # February: duplicates, a late report, and one from the last microsecond of the month.
        assert [report("p1", 1, 1000), report("p1", 1, 1000), report("p2", 1, 1500)] == [1000, 0, 1500]
        clock.set(BOUNDARY - dt.timedelta(minutes=30))
        assert [report("p1", 2, 2000), report("p2", 2, 2500), report("p1", 1, 1000)] == [1000, 1000, 0]
        clock.set(BOUNDARY - dt.timedelta(microseconds=1))
        assert report("p2", 3, 2600) == 100
        february = call("GET", "budgets/team-a")
        assert (february["usedGpuMinutes"], february["state"], february["periodEnd"]) == (
            4600 / 60,
            "over-budget",
            "2028-03-01T00:00:00Z",
        )
        wait_for(lambda: events() == ["GPUBudgetExhausted"], "an Event for February's exhaustion")

        # The boundary: a new period, in budget again at once; the report whose time straddles it is March's.
        clock.set(BOUNDARY)
        march = call("GET", "budgets/team-a")
        assert (march["usedGpuMinutes"], march["state"], march["periodStart"]) == (
            0.0,
            "in-budget",
            "2028-03-01T00:00:00Z",
        )
        # late ones: nothing
        assert [report("p1", 3, 2300), report("p2", 3, 2600), report("p2", 2, 2500)] == [300, 0, 0]
        clock.set(BOUNDARY + dt.timedelta(minutes=10))
        assert [report("p2", 5, 3000), report("p2", 4, 2800)] == [400, 0]  # seq 4 overtaken: its time came with seq 5
        wait_for(lambda: events() == ["GPUBudgetExhausted", "GPUBudgetRestored"], "an Event for the new period")
        assert call("GET", "budgets/team-a")["usedGpuMinutes"] == 700 / 60

        # March is spent in its turn.
        assert [report("p1", 4, 5900), report("p1", 4, 5900)] == [3600, 0]
        assert call("GET", "budgets/team-a")["state"] == "over-budget"
        wait_for(lambda: len(events()) == 3, "an Event for March's exhaustion")
        passes = controller.task_runs("budgets")
        wait_for(
            lambda: controller.task_runs("budgets") >= passes + 10, "ten more runs of the controller's budgets task"
        )
        assert events() == ["GPUBudgetExhausted", "GPUBudgetRestored", "GPUBudgetExhausted"]  # each transition once

    # Every GPU-second in exactly one period: the days' usage is what each period's answers charged, and adds up
    # to the pods' final cumulatives.
    engine = create_engine(database_url)
    with engine.connect() as conn:
        days = {row.day: row.micro_gpu_seconds for row in conn.execute(select(namespace_usage))}
        ledgers = {row.pod_uid: row.micro_gpu_seconds for row in conn.execute(select(pod_ledgers))}
    engine.dispose()
    charged = {
        period: sum(a["chargedGpuSeconds"] for p, a in answers if p == period) for period in ("february", "march")
    }
    assert days == {dt.date(2028, 2, 29): 4600 * 10**6, dt.date(2028, 3, 1): 4300 * 10**6}
    assert charged == {"february": 4600, "march": 4300}
    assert ledgers == {"uid-p1": 5900 * 10**6, "uid-p2": 3000 * 10**6}


def test_the_clock_setting_names_code_and_a_bad_one_stops_the_timekeeper() -> None:
    with pytest.raises(ConfigError, match="TIMEKEEPER_CLOCK='utc_now' must be module:function"):
        TimekeeperConfig.from_env({"TIMEKEEPER_CLOCK": "utc_now"})
    with pytest.raises(ConfigError, match="TIMEKEEPER_CLOCK='tests.timekeeper.fake_clock:later' cannot be loaded"):
        create_app(TimekeeperConfig(auth="none", clock="tests.timekeeper.fake_clock:later"))
