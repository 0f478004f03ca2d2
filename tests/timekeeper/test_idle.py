"""Idle GPUs in the timekeeper: idle policies on budgets (a group's for the namespaces below it, the default budget's
for the rest), each pod's idle streak kept from its meter's readings on SQLite and PostgreSQL, what the policy in
force says of a pod, and the leader acting on it against an HTTP fake of the API (Events on the pod and its owner,
demotion and eviction within PodDisruptionBudgets, owners held out of budget). The real API server:
tests/e2e/test_idle.py."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from demo.kubeapi import FakeKube
from gpusharing.contract import Period
from gpusharing.idle.policy import IdleAction, IdlePolicy, IdlePolicyError, PolicyInForce, idle_policy_from_json
from gpusharing.idle.verdict import IdleState, PodFacts, Reading, Streak, next_streak, outlook, verdict
from gpusharing.kube.owners import Owner
from gpusharing.report import MeterReport
from sidecar.client import TimekeeperClient
from sidecar.config import MeterConfig
from sidecar.meter import Meter as MeterLoop
from sidecar.nvml import MIB, NvmlReader
from sidecar.state import StateFile
from tests.sidecar.fake_nvml import POD_PID, FakeDevice, FakeNvml, pod_proc
from tests.timekeeper.conftest import (
    ADMIN,
    METER,
    READER,
    AppFactory,
    Clock,
    ControllerFactory,
    SpecClient,
    run_controller,
    served,
)
from tests.timekeeper.test_kubectl_plugin import cluster, plugin  # noqa: F401 (cluster: a fixture)
from timekeeper.budgets.status import Budget
from timekeeper.cluster.idling import IDLE, IDLE_WARNING, IdlePass, budget_idle
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.manager import ControllerManager
from timekeeper.cluster.resources import resource_status
from timekeeper.database.accounting.charging import ReportLedger, ReportTerms
from timekeeper.database.accounting.streaks import IdleLedger
from timekeeper.database.budgets.store import BudgetStore
from timekeeper.database.cluster.fencing import STALE_CLAIM_SECONDS
from timekeeper.database.connection import Database
from timekeeper.database.tables import eviction_claims

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
INTERVAL = 30  # the meters report every 30 s


# -- the policy ---------------------------------------------------------------------------------------------------

def test_a_policy_reads_durations_as_kubernetes_writes_them() -> None:
    policy = idle_policy_from_json({"after": "4h", "action": "evict", "warnBefore": "30m", "utilisationPercent": 0.5,
                                    "minAge": "1h"})
    assert policy == IdlePolicy(4 * 3600, IdleAction.EVICT, 1800, 0.5, 3600)
    assert policy.to_json() == {
        "after": "4h",
        "action": "evict",
        "warnBefore": "30m",
        "utilisationPercent": 0.5,
        "minAge": "1h",
    }
    assert idle_policy_from_json(policy.to_json()) == policy
    # warn, at 1 %, any age
    assert idle_policy_from_json({"after": "90s"}) == IdlePolicy(90, IdleAction.WARN, 0, 1.0, 0)
    assert idle_policy_from_json(None) is None
    assert policy.describe() == "evict after 4h idle (under 0.5 % utilisation), warned 30m before, pods older than 1h"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "idle.after is missing: how long a GPU may stay idle, e.g. 4h"),
        (
            {"after": "4 hours"},
            "idle.after must be a duration as Kubernetes writes it, e.g. 4h, 30m, 90s or 1h30m, not '4 hours'",
        ),
        ({"after": "0s"}, "idle.after must be from 1s to 8760h, not 0s"),
        (
            {"after": "1h", "warnBefore": "2h"},
            "idle.warnBefore (2h) must be shorter than idle.after (1h): the warning comes before the action",
        ),
        ({"after": "1h", "action": "delete"}, "idle.action must be one of warn, demote, evict, not 'delete'"),
        (
            {"after": "1h", "utilisationPercent": 0},
            "idle.utilisationPercent must be a number above 0 and at most 100, not 0",
        ),
        (
            {"after": "1h", "utilisationPercent": True},
            "idle.utilisationPercent must be a number above 0 and at most 100, not True",
        ),
        ({"after": "1h", "minAge": -1}, "idle.minAge must be a duration as Kubernetes writes it"),
        ({"after": "1h", "exempt": True}, "idle has unknown field(s): exempt"),
        ("4h", "idle must be an object with after (e.g. 4h)"),
    ],
)
def test_a_policy_that_cannot_be_one_is_refused_in_one_line(body: object, message: str) -> None:
    with pytest.raises(IdlePolicyError) as refused:
        idle_policy_from_json(body)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_a_budget_carries_its_idle_policy_and_says_which_one_is_in_force(api: SpecClient) -> None:
    evict = {"after": "4h", "action": "evict", "warnBefore": "30m", "utilisationPercent": 1, "minAge": "0s"}
    assert api.put("/api/v1/budgets/team.vision", json={"gpuMinutes": 1000, "idle": evict}).status_code == 201
    answer = api.put("/api/v1/budgets/ml-team", json={"gpuMinutes": 100, "parent": "team.vision"}).json
    assert answer["idle"] is None and answer["idleInForce"] == {**evict, "from": "team.vision"}
    warn = {"after": "2h", "action": "warn", "warnBefore": "0s", "utilisationPercent": 5.0, "minAge": "10m"}
    answer = api.patch(
        "/api/v1/budgets/ml-team", json={"idle": {"after": "2h", "utilisationPercent": 5, "minAge": "10m"}}
    ).json
    assert answer["idle"] == warn and answer["idleInForce"] == {**warn, "from": "ml-team"}
    assert api.patch("/api/v1/budgets/ml-team", json={"idle": None}).json["idleInForce"]["from"] == "team.vision"
    refused = api.put("/api/v1/budgets/ml-team", json={"gpuMinutes": 100, "idle": {"after": "forever"}})
    assert refused.status_code == 400
    assert refused.json["error"].startswith("idle.after must be a duration as Kubernetes writes it")


def test_the_default_budgets_policy_is_in_force_where_no_budget_up_the_chain_sets_one(make_app: AppFactory) -> None:
    default = IdlePolicy(3600, IdleAction.DEMOTE)
    api = SpecClient(make_app(default_idle=default).test_client(), "admin-token")
    assert api.get("/api/v1/budgets/anyone").json["idleInForce"] == {**default.to_json(), "from": None}
    api.put("/api/v1/budgets/team.vision", json={"gpuMinutes": 10, "idle": {"after": "2h"}})
    api.put("/api/v1/budgets/ml-team", json={"gpuMinutes": 10, "parent": "team.vision"})
    assert api.get("/api/v1/budgets/ml-team").json["idleInForce"]["from"] == "team.vision"


# -- streaks, through the report path ---------------------------------------------------------------------------------

@pytest.fixture
def store(database_url: str, clock: Clock) -> Iterator[BudgetStore]:
    clock.at = T0
    db = Database(database_url)
    yield BudgetStore(db, clock=clock)
    db.dispose()


@pytest.fixture
def ledger(store: BudgetStore) -> ReportLedger:
    return ReportLedger(store, policy_refresh_seconds=0)


class Meter:
    """A pod's meter as the timekeeper sees it: a report every INTERVAL seconds carrying the utilisation read."""

    def __init__(
        self, ledger: ReportLedger, clock: Clock, uid: str, name: str, namespace: str = "ml", share: float = 0.5
    ):
        self.ledger, self.clock, self.uid, self.name, self.namespace, self.share = (
            ledger,
            clock,
            uid,
            name,
            namespace,
            share,
        )
        self.seq = 0
        self.started = clock.at

    def report(self, utilisation: float | None, after: float = INTERVAL) -> None:
        self.clock.advance(seconds=after)
        self.seq += 1
        gpu_seconds = self.share * (self.clock.at - self.started).total_seconds()
        report = MeterReport(self.uid, self.namespace, self.name, self.share, self.seq, gpu_seconds,
                             gpu_utilization_percent=utilisation)
        (result,) = self.ledger.record([(report, ReportTerms(self.share, None, started_at=self.started))])
        assert result.outcome.value == "charged"

    def streak(self) -> Streak:
        return next(pod.streak for pod in self.ledger.pods(self.namespace) if pod.pod_uid == self.uid)


def test_a_streak_lasts_while_every_report_reads_idle(ledger: ReportLedger, clock: Clock) -> None:
    meter = Meter(ledger, clock, "uid-nb", "nb")
    meter.report(50)
    assert meter.streak().since is None
    meter.report(0.5)
    began = clock.at
    for utilisation in (0, 0.99, 0):
        meter.report(utilisation)
        assert meter.streak().since == began
    meter.report(1.0)  # 1 % is not under 1 %
    assert meter.streak().since is None


@pytest.mark.parametrize("breaks", ["no NVML data", "a silence of three intervals"])
def test_unknown_utilisation_and_a_silent_meter_end_a_streak(ledger: ReportLedger, clock: Clock, breaks: str) -> None:
    meter = Meter(ledger, clock, "uid-nb", "nb")
    meter.report(0)
    meter.report(0)
    if breaks == "no NVML data":
        meter.report(None)
        assert meter.streak().since is None
        meter.report(0)
    else:
        meter.report(0, after=3 * INTERVAL)  # the meter was silent for two intervals: what happened then is unknown
    assert meter.streak().since == clock.at  # a new streak, from this report


def test_the_threshold_is_the_policy_in_force(ledger: ReportLedger, store: BudgetStore, clock: Clock) -> None:
    store.set_budget(
        Budget("team.vision", None, Period.MONTHLY, idle=IdlePolicy(3600, utilisation_percent=10)), "admin"
    )
    store.set_budget(Budget("ml", None, Period.MONTHLY, parent="team.vision"), "admin")
    meter = Meter(ledger, clock, "uid-serve", "serve")
    meter.report(7)  # an inference replica answering a request now and then: idle under the group's 10 %
    assert meter.streak().since == clock.at
    meter.report(12)
    assert meter.streak().since is None


# -- what the policy says of a pod ----------------------------------------------------------------------------------

EVICT = PolicyInForce(IdlePolicy(4 * 3600, IdleAction.EVICT, 1800, 1.0, 3600), "ml")


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


@pytest.mark.parametrize(
    ("streak", "reading", "now", "state", "why"),
    [
        (
            Streak(),
            Reading(None, None),
            at(1),
            IdleState.UNKNOWN,
            "unknown: its meter has not reported yet; never treated as idle",
        ),
        (
            Streak(),
            Reading(None, at(0)),
            at(1),
            IdleState.UNKNOWN,
            "unknown: its meter reads no GPU utilisation (no NVML data",
        ),
        (
            Streak(at(0)),
            Reading(0.0, at(0)),
            at(2),
            IdleState.UNKNOWN,
            "unknown: its meter has not reported since 2026-11-27T09:00:00Z (silent); never treated as idle",
        ),
        (
            Streak(),
            Reading(37.0, at(0)),
            at(1),
            IdleState.BUSY,
            "busy: its last report read 37 % GPU utilisation (idle is under 1 %)",
        ),
        (
            Streak(at(0)),
            Reading(0.0, at(250)),
            at(250.5),
            IdleState.IDLE,
            "idle for 4h10m: every report since 2026-11-27T09:00:00Z read GPU utilisation under 1 %",
        ),
    ],
)
def test_the_state_of_a_pod(streak: Streak, reading: Reading, now: dt.datetime, state: IdleState, why: str) -> None:
    judged = verdict(streak, reading, EVICT, PodFacts(at(-120)), now, fresh_seconds=60)
    assert judged.state is state and judged.why.startswith(why)
    assert judged.action_due is (state is IdleState.IDLE)


def test_warned_before_and_acted_on_when_the_reports_prove_the_streak_long_enough() -> None:
    pod = PodFacts(at(-120))
    early = verdict(Streak(at(0)), Reading(0.0, at(209)), EVICT, pod, at(209), 60)
    assert (early.warn_at, early.act_at) == (at(210), at(240)) and not early.warning_due
    warned = verdict(Streak(at(0)), Reading(0.0, at(210)), EVICT, pod, at(211), 60)
    assert warned.warning_due and not warned.action_due
    # Between the reports the streak does not grow: a meter about to fall silent proves nothing more.
    assert not verdict(Streak(at(0)), Reading(0.0, at(239.5)), EVICT, pod, at(240.5), 60).action_due
    assert verdict(Streak(at(0)), Reading(0.0, at(240)), EVICT, pod, at(240), 60).action_due
    assert outlook(warned, Streak(at(0), warned_at=at(210))) == (
        "warned at 2026-11-27T12:30:00Z; to be acted on (evict) once idle to 2026-11-27T13:00:00Z")


def test_young_and_exempt_pods() -> None:
    young = verdict(Streak(at(0)), Reading(0.0, at(240)), EVICT, PodFacts(at(-10)), at(240), 60)
    assert young.act_at == at(240) and young.action_due  # started 4h10m ago: older than the hour asked
    younger = verdict(Streak(at(0)), Reading(0.0, at(240)), EVICT, PodFacts(at(200)), at(240), 60)
    assert younger.act_at == at(260) and younger.warn_at == at(230) and not younger.action_due and younger.warning_due
    exempt = verdict(Streak(at(0)), Reading(0.0, at(600)), EVICT, PodFacts(at(-120), exempt=True), at(600), 60)
    assert exempt.state is IdleState.IDLE and not exempt.action_due and not exempt.warning_due
    assert exempt.why.endswith('exempt (gpusharing.io/idle-exempt: "true"): never acted on')
    assert outlook(exempt, Streak(at(0))) is None


def test_a_streak_is_a_plain_function_of_its_reports() -> None:
    busy, idle = 50.0, 0.0
    assert next_streak(Streak(), None, idle, 1.0, at(0), 60) == Streak(at(0))
    assert next_streak(Streak(at(0), at(1)), at(1), idle, 1.0, at(1.5), 60) == Streak(at(0), at(1))
    assert next_streak(Streak(at(0), at(1)), at(1), busy, 1.0, at(1.5), 60) == Streak()
    assert next_streak(Streak(at(0), at(1)), at(1), idle, 1.0, at(3), 60) == Streak(at(3))  # after a gap: afresh


# -- the leader acting on it, against an HTTP fake of the API ---------------------------------------------------------

IN_BUDGET, OVER_BUDGET = "gpusharing-in-budget", "gpusharing-over-budget"


class Cluster:
    """The fake API's pods, their meters, and the controller (its tasks run as run_controller runs them)."""

    def __init__(
        self, fake: FakeKube, ledger: ReportLedger, store: BudgetStore, clock: Clock, controller: ControllerManager
    ):
        self.fake, self.ledger, self.store, self.clock, self.controller = fake, ledger, store, clock, controller
        self.idle = IdleLedger(store.db)
        self.meters: dict[str, Meter] = {}
        self.before_run: Callable[[], None] = lambda: None  # what happens before each run (a webhook polls)

    def pod(self, name: str, owner: str | None = None, labels: dict[str, str] | None = None,
            demoted: bool = False, age: dt.timedelta = dt.timedelta(0)) -> Meter:
        """A running pod, started `age` before its meter's first report (the record's start, which it is billed
        from)."""
        obj = self.fake.add_pod("ml", name, share="0.5", priority_class=OVER_BUDGET if demoted else IN_BUDGET)
        if demoted:  # the webhook's record: admitted out of budget
            obj["metadata"]["annotations"]["gpusharing.io/budget-state"] = "over-budget"
        obj["metadata"]["labels"] = labels or {}
        if owner:
            obj["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner,
                                                   "uid": f"uid-{owner}", "controller": True}]
        obj["status"]["startTime"] = (self.clock.at - age).strftime("%Y-%m-%dT%H:%M:%SZ")
        meter = Meter(self.ledger, self.clock, obj["metadata"]["uid"], name)
        self.meters[name] = meter
        return meter

    def gone(self, name: str) -> None:
        self.fake.pods.pop(("ml", name), None)

    def play(self, utilisations: dict[str, float | None], steps: int = 1,
             controllers: Sequence[ControllerManager] = ()) -> list[IdlePass | None]:
        """Every meter reports (a name left out stays silent), then the controller's tasks run (`controllers`, in
        turn: the idle pass of the last); `steps` times."""
        passes: list[IdlePass | None] = []
        for _ in range(steps):
            self.clock.advance(seconds=INTERVAL)
            for name, utilisation in utilisations.items():
                self.meters[name].report(utilisation, after=0)
            self.before_run()
            for controller in controllers or (self.controller,):
                done = run_controller(controller).idle
            passes.append(done)
        return passes

    def events(self, reason: str) -> list[tuple[str, str, str]]:
        return [(e["involvedObject"]["kind"], e["involvedObject"]["name"], e["message"]) for e in self.fake.events
                if e["reason"] == reason]


@pytest.fixture
def leader(fake_kube: FakeKube, ledger: ReportLedger, store: BudgetStore, clock: Clock,
           make_controller: ControllerFactory) -> Cluster:
    return Cluster(fake_kube, ledger, store, clock, make_controller(KubeApi(fake_kube.api_client()), identity="first",
                                                                    meter_interval_seconds=INTERVAL))


def policy(store: BudgetStore, **idle: Any) -> None:
    store.set_budget(Budget("ml", None, Period.MONTHLY, idle=idle_policy_from_json(idle)), "admin")


def first(passes: Sequence[IdlePass | None], kind: str) -> int | None:
    """The step (from 1) of the first pass that did `kind` (warned, acted, evicted, held, ...)."""
    return next((i + 1 for i, done in enumerate(passes) if done is not None and getattr(done, kind)), None)


def total(passes: Sequence[IdlePass | None], kind: str) -> int:
    return sum(len(getattr(done, kind)) for done in passes if done is not None)


def test_warnings_come_at_the_right_interval_on_the_pod_and_its_owner_once_per_streak(leader: Cluster) -> None:
    policy(leader.store, after="5m", warnBefore="2m")
    leader.pod("nb-0", owner="nb-7d9")
    passes = leader.play({"nb-0": 0}, steps=12)
    # The streak begins at the first report; 3 min (6 intervals) later it is warned of, at 5 min it is acted on.
    assert first(passes, "warned") == 7 and first(passes, "acted") == 11
    assert total(passes, "warned") == 1 and total(passes, "acted") == 1
    warnings = leader.events(IDLE_WARNING)
    assert [(kind, name) for kind, name, _ in warnings] == [("Pod", "nb-0"), ("ReplicaSet", "nb-7d9")]
    assert warnings[0][2].startswith(
        "the GPU of pod nb-0 has been idle for 3m (every meter reading under 1 % "
        "utilisation): it will be reported idle at 2026-11-27T09:05:30Z unless it uses its GPU "
        "(the idle policy of the budget of ml: warn after 5m idle (under 1 % utilisation), "
        "warned 2m before)"
    )
    assert "nothing else is done" in leader.events(IDLE)[0][2] and leader.fake.evicted == []
    # A busy interval ends the streak; the next one is warned of again.
    passes = leader.play({"nb-0": 60}) + leader.play({"nb-0": 0}, steps=7)
    assert first(passes, "warned") == 8


def test_demotion_holds_the_owner_first_then_evicts_within_pod_disruption_budgets(
    leader: Cluster, make_app: AppFactory, fake_kube: FakeKube,
) -> None:
    policy(leader.store, after="2m", action="demote")
    leader.pod("nb-0", owner="nb-7d9")
    fake_kube.refuse_evictions.add(("ml", "nb-0"))  # a PodDisruptionBudget allows no disruption now
    leader.controller.evictions.retry_seconds = 0.0  # nor asked again within a run (tests/timekeeper/test_evictions.py)
    passes = leader.play({"nb-0": 0}, steps=5)
    # New by design: no warning before (warnBefore 0), so the owner is held when the action is due, and with no
    # webhook process to acknowledge the hold the eviction is asked for in the same run (here refused).
    assert first(passes, "held") == 5 and first(passes, "refused") == 5 and total(passes, "evicted") == 0
    (hold,) = leader.idle.holds()
    assert (hold.owner.kind, hold.owner.name, hold.pod) == ("ReplicaSet", "nb-7d9", "nb-0")
    # The webhook learns of the hold from the listing it polls, before the pod is evicted.
    listing = SpecClient(make_app().test_client(), READER).get("/api/v1/budgets").json["items"]
    assert [item["idleHolds"] for item in listing if item["namespace"] == "ml"] == [
        [{"kind": "ReplicaSet", "name": "nb-7d9", "uid": "uid-nb-7d9", "pod": "nb-0", "heldAt": "2026-11-27T09:02:30Z"}]
    ]
    passes = leader.play({"nb-0": 0}, steps=2)
    assert total(passes, "refused") == 2 and total(passes, "evicted") == 0  # tried again each run
    fake_kube.refuse_evictions.clear()
    (done,) = leader.play({"nb-0": 0})
    assert done is not None and done.evicted == ["ml/nb-0"] and fake_kube.evicted == [("ml", "nb-0")]
    (_, _, message), owner_event = leader.events(IDLE)
    assert message.endswith(
        "; evicted; ReplicaSet nb-7d9's next pods are admitted out of budget until one uses its GPU"
    )
    assert owner_event[:2] == ("ReplicaSet", "nb-7d9")
    # Its replacement, admitted out of budget, uses its GPU: the owner is back in budget.
    leader.gone("nb-0")
    leader.pod("nb-1", owner="nb-7d9", demoted=True)
    (done,) = leader.play({"nb-1": 80})
    assert done is not None and done.released == ["ml/ReplicaSet/nb-7d9"] and leader.idle.holds() == []


def test_demote_leaves_bare_pods_and_pods_already_out_of_budget_running(leader: Cluster) -> None:
    policy(leader.store, after="2m", action="demote")
    leader.pod("debug")
    leader.pod("nb-1", owner="nb-7d9", demoted=True)
    passes = leader.play({"debug": 0, "nb-1": 0}, steps=8)
    assert leader.fake.evicted == [] and leader.idle.holds() == []
    told = {name: message for kind, name, message in leader.events(IDLE) if kind == "Pod"}
    assert told["debug"].endswith(
        "it is not evicted: it has no owner to re-create it demoted (the action evict would stop it)"
    )
    assert told["nb-1"].endswith("it is not evicted: it already runs out of budget (the webhook admitted it demoted)")
    assert total(passes, "acted") == 2  # once each


def test_evict_stops_a_bare_pod_at_once(leader: Cluster) -> None:
    policy(leader.store, after="2m", action="evict")
    leader.pod("debug")
    passes = leader.play({"debug": 0}, steps=5)
    assert first(passes, "evicted") == 5 and leader.fake.evicted == [("ml", "debug")] and leader.idle.holds() == []


def test_a_deposed_leader_evicts_no_idle_pod_and_its_successor_does(
    leader: Cluster, make_controller: ControllerFactory,
) -> None:
    policy(leader.store, after="2m", action="evict")
    leader.pod("debug")
    leader.play({"debug": 0})  # the first controller takes the Lease
    successor = make_controller(KubeApi(leader.fake.api_client()), identity="second", meter_interval_seconds=INTERVAL)
    # The first stops renewing (paused); the second takes the Lease once it has seen it unrenewed for its duration.
    taking = leader.play({"debug": 0}, steps=2, controllers=[successor])
    assert taking[0] is None and taking[1] is not None and taking[1].evicted == []  # not due yet
    # From now on both run at each step, the deposed one first: it acts on nothing, the successor evicts on time.
    deposed: list[IdlePass | None] = []
    evicted_by_deposed: list[tuple[str, str]] = []
    for _ in range(3):  # the deadline comes at the second of these steps
        before = len(leader.fake.evicted)
        deposed += leader.play({"debug": 0}, controllers=[leader.controller])
        evicted_by_deposed += leader.fake.evicted[before:]
        run_controller(successor)
    assert deposed == [None, None, None] and evicted_by_deposed == [] and leader.fake.evicted == [("ml", "debug")]


def test_an_eviction_claimed_by_a_leader_that_died_is_taken_over_once_stale(
    leader: Cluster, make_controller: ControllerFactory,
) -> None:
    policy(leader.store, after="2m", action="evict")
    meter = leader.pod("debug")
    leader.play({"debug": 0})  # the first controller (term 0) leads
    # It claims the pod's eviction and dies before asking for it (its claim, made now by the database's clock).
    db = leader.store.db
    with db.write() as conn:
        conn.execute(eviction_claims.insert().values(pod_uid=meter.uid, namespace="ml", pod="debug", term=0,
                                                     claimed_at=db.clock()))
    successor = make_controller(KubeApi(leader.fake.api_client()), identity="second", meter_interval_seconds=INTERVAL)
    passes = leader.play({"debug": 0}, steps=5, controllers=[successor])  # takes the Lease (term 1) at the second
    assert first(passes, "acted") is None and leader.fake.evicted == []  # the dead leader's claim stands, fresh
    # The fence reckons by the database's clock (db.clock() in SQL), which the test's Clock does not move: the claim
    # is aged through the table instead, as if STALE_CLAIM_SECONDS had passed.
    with db.write() as conn:
        conn.execute(eviction_claims.update().where(eviction_claims.c.pod_uid == meter.uid)
                     .values(claimed_at=eviction_claims.c.claimed_at - STALE_CLAIM_SECONDS - 1))
    (done,) = leader.play({"debug": 0}, controllers=[successor])
    assert done is not None and done.evicted == ["ml/debug"] and leader.fake.evicted == [("ml", "debug")]


def webhook(api: SpecClient, name: str, in_force: float) -> float:
    """A webhook process's poll, saying which listing it holds in force; the listedAt of the listing it gets."""
    listed: float = api.get(f"/api/v1/budgets?webhook={name}&inForce={in_force}&refreshSeconds=60").json["listedAt"]
    return listed


def test_an_idle_eviction_waits_for_a_webhook_holding_an_old_listing_and_comes_on_the_first_run_after_it_acknowledges(
    leader: Cluster, make_app: AppFactory,
) -> None:
    policy(leader.store, after="2m", action="demote")
    leader.pod("nb-0", owner="nb-7d9")
    api = SpecClient(make_app().test_client(), ADMIN)
    old = webhook(api, "replica-1", 0)  # a listing from before the hold
    webhook(api, "replica-1", old)
    passes = leader.play({"nb-0": 0}, steps=7)
    assert first(passes, "held") == 5 and first(passes, "waiting") == 5 and total(passes, "evicted") == 0
    assert leader.fake.evicted == [] and len(leader.idle.holds()) == 1
    webhook(api, "replica-1", webhook(api, "replica-1", old))  # it reads the listing with the hold, and holds it
    (done,) = leader.play({"nb-0": 0})
    assert done is not None and done.evicted == ["ml/nb-0"] and leader.fake.evicted == [("ml", "nb-0")]


def test_an_idle_eviction_comes_within_one_idle_run_of_its_deadline_when_no_webhook_lags(
    leader: Cluster, make_app: AppFactory,
) -> None:
    policy(leader.store, after="2m", warnBefore="1m", action="demote")
    leader.pod("nb-0", owner="nb-7d9")
    api = SpecClient(make_app().test_client(), ADMIN)
    held = [webhook(api, "replica-1", 0)]

    def poll() -> None:  # before each run the webhook polls, holding the listing its last poll got
        held.append(webhook(api, "replica-1", held[-1]))

    leader.before_run = poll
    passes = leader.play({"nb-0": 0}, steps=6)
    # Held from the warning on (step 3), acknowledged by the next poll: evicted at the deadline (step 5).
    assert first(passes, "warned") == 3 and first(passes, "held") == 3
    assert (
        first(passes, "evicted") == 5 and first(passes, "waiting") is None and leader.fake.evicted == [("ml", "nb-0")]
    )


@pytest.mark.parametrize("case", ["exempt", "no NVML data", "silent meter", "too young"])
def test_what_the_policy_never_acts_on(leader: Cluster, case: str) -> None:
    policy(leader.store, after="2m", action="evict", minAge="70m")
    meter = leader.pod("nb-0", labels={"gpusharing.io/idle-exempt": "true"} if case == "exempt" else None,
                       age=dt.timedelta(hours=1))
    if case == "silent meter":
        meter.report(0)
        meter.report(0)
        passes = leader.play({}, steps=10)  # the pod runs on, its meter says nothing: unknown
    else:
        passes = leader.play({"nb-0": None if case == "no NVML data" else 0}, steps=10)
    assert not any(done.warned or done.acted or done.held for done in passes)
    assert leader.fake.evicted == [] and leader.events(IDLE) == []
    if case == "too young":  # started an hour before the first report: acted on once 70 minutes old
        passes = leader.play({"nb-0": 0}, steps=12)
        assert first(passes, "evicted") == 10  # ten minutes after the first report: the ten passes above, ten more


def test_a_budget_status_shows_idle_gpu_hours_and_the_pods_idle_beyond_their_warning(leader: Cluster) -> None:
    policy(leader.store, after="2m")
    leader.pod("nb-0")
    passes = leader.play({"nb-0": 0}, steps=6)
    statuses = {status.namespace: status for status in leader.store.statuses()}
    assert passes[-1] is not None
    idle = budget_idle(statuses, passes[-1])
    # 0.5 GPU idle for 6 intervals of 30 s: 90 GPU-seconds.
    assert idle["ml"].idle_gpu_hours == pytest.approx(90 / 3600) and idle["ml"].idle_pods == ("ml/nb-0 (idle 2m30s)",)
    obj = {"metadata": {"name": "budget", "namespace": "ml", "generation": 1}}
    status = resource_status(obj, statuses["ml"], None, [], leader.clock.at, idle["ml"])
    assert status["idleGpuHours"] == 0.03
    (condition,) = [c for c in status["conditions"] if c["type"] == "Idle"]
    assert (condition["status"], condition["reason"]) == ("True", "PodsIdle")
    assert condition["message"] == "1 GPU pod(s) idle beyond the warning of their idle policy: ml/nb-0 (idle 2m30s)"


def test_the_metrics_count_idle_pods_and_idle_gpu_time_per_namespace(leader: Cluster, make_app: AppFactory) -> None:
    policy(leader.store, after="2m")
    leader.pod("nb-0")
    leader.pod("train")
    leader.play({"nb-0": 0, "train": 90}, steps=6)
    app: Flask = make_app()  # on the same database and clock
    text = app.test_client().get("/metrics").get_data(as_text=True)
    assert 'gpusharing_timekeeper_idle_pods{namespace="ml"} 1.0' in text
    assert 'gpusharing_timekeeper_idle_pods_warned{namespace="ml"} 1.0' in text
    # 0.5 GPU x 180 s idle, and 0.5 x 180 x 10 % of the busy pod's.
    assert 'gpusharing_timekeeper_idle_gpu_seconds{namespace="ml"} 99.0' in text


# -- explained: `gpusharing explain` and `kubectl gpusharing explain`
# ----------------------------------------------------

def test_explain_tells_a_pods_idle_streak_when_it_is_acted_on_and_why(
    cluster: FakeKube,  # noqa: F811 (the fixture imported above)
    app: Flask,
    clock: Clock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    admin = {"Authorization": "Bearer admin-token"}
    policy_json = {"after": "4h", "action": "evict", "warnBefore": "30m", "minAge": "1h"}
    assert (
        app.test_client()
        .put("/api/v1/budgets/team-a", headers=admin, json={"gpuMinutes": 6000, "idle": policy_json})
        .status_code
        == 201
    )
    pods = {}
    for name, labels in (("nb-0", {}), ("nb-1", {"gpusharing.io/idle-exempt": "true"}), ("blind", {})):
        pod = cluster.add_pod("team-a", name, share="0.5")
        pod["metadata"]["labels"] = labels
        pod["metadata"]["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "nb-7d9", "uid": "uid-nb-7d9", "controller": True}
        ]
        pod["status"]["startTime"] = "2028-02-28T20:00:00Z"
        pods[name] = pod
    began = clock.at
    for seq in range(1, 8):  # three minutes of reports, every 30 s
        for name, utilisation in (("nb-0", 0.2), ("nb-1", 0), ("blind", None)):
            body = {
                "podUid": pods[name]["metadata"]["uid"],
                "namespace": "team-a",
                "pod": name,
                "gpuShare": 0.5,
                "seq": seq,
                "gpuSeconds": 15.0 * seq,
                **({} if utilisation is None else {"gpuUtilizationPercent": utilisation}),
            }
            assert (
                app.test_client()
                .post("/api/v1/reports", headers={"Authorization": f"Bearer {METER}"}, json=body)
                .status_code
                == 200
            )
        clock.advance(seconds=INTERVAL)
    IdleLedger(app.extensions["database"]).hold(
        "team-a", Owner("apps/v1", "ReplicaSet", "nb-7d9", "uid-nb-7d9"), "nb-old", began
    )

    capsys.readouterr()  # what the timekeeper logged while the budget and reports were set up is not the plugin's

    def explained(name: str) -> dict[str, str]:
        code, out, err = plugin(capsys, "explain", f"pod/{name}")
        assert (code, err) == (0, "")
        return {key: value.strip() for key, value in (line.split(":", 1) for line in out.splitlines())}

    fields = explained("nb-0")
    assert fields["Idle"] == "idle for 3m: every report since 2028-02-28T23:00:00Z read GPU utilisation under 1 %"
    assert (
        fields["Idle policy"]
        == "evict after 4h idle (under 1 % utilisation), warned 30m before, pods older than 1h: the budget of team-a"
    )
    assert fields["Idle outlook"] == ("to be warned (GPUIdleWarning) once idle to 2028-02-29T02:30:00Z; "
                                      "to be acted on (evict) once idle to 2028-02-29T03:00:00Z")
    assert fields["Owner held"] == (
        "ReplicaSet nb-7d9 since 2028-02-28T23:00:00Z (its pod nb-old was evicted idle): its new "
        "pods are admitted out of budget until one uses its GPU"
    )
    fields = explained("nb-1")
    assert (
        fields["Idle"].endswith('exempt (gpusharing.io/idle-exempt: "true"): never acted on')
        and "Idle outlook" not in fields
    )
    fields = explained("blind")
    assert (
        fields["Idle"].startswith("unknown: its meter reads no GPU utilisation (no NVML data")
        and "Idle outlook" not in fields
    )
    code, out, _ = plugin(capsys, "explain", "pod/nb-0", "-o", "json")
    idle = json.loads(out)["idle"]
    assert (idle["state"], idle["idleSeconds"], idle["actAt"]) == ("idle", 180.0, "2028-02-29T03:00:00Z")


# -- measured: the usage report's idle column, from a trace played through the meter's NVML seam ----------------------

TRACE = [0, 0, 50, 100, 0, 25, 0, 0, 80, 0, 3, 0]  # the pod's GPU utilisation in each interval, percent


def test_the_usage_reports_idle_columns_are_the_trace_played_through_the_meter(
    app: Flask, clock: Clock, tmp_path: Path,
) -> None:
    """The real meter reads a fake NVML playing TRACE and reports to the timekeeper (static tokens: its reports are the
    bill); the usage report's idle GPU-minutes are the share x each interval x (1 - its utilisation), to the
    micro-GPU-second, and the idle streak is the trace's last idle run."""
    uid = "0b8a3c1e-2f4d-4c55-9d0e-6a7b8c9d0e1f"
    (tmp_path / "token").write_text(METER)
    nvml = FakeNvml([FakeDevice("NVIDIA H100 80GB HBM3", [(POD_PID, 4096 * MIB)], TRACE)])
    gpu = NvmlReader(nvml, uid, pod_proc(tmp_path / "proc", uid))
    meter_clock = [1_700_000_000.0]
    with served(app) as url:
        config = MeterConfig(namespace="ml", pod_name="nb-0", pod_uid=uid, gpu_share=0.5, timekeeper_url=url,
                             token_path=tmp_path / "token", state_dir=tmp_path, interval_seconds=INTERVAL)
        meter = MeterLoop(
            config, TimekeeperClient(url, config.token_path), StateFile(tmp_path), gpu, lambda: meter_clock[0]
        )
        for _ in TRACE:  # the first report, at the start, bills nothing; each later one the interval before it
            assert meter.report(final=False, timeout=5).delivery.value == "accepted"
            meter_clock[0] += INTERVAL
            clock.advance(seconds=INTERVAL)
    usage = (
        SpecClient(app.test_client(), "admin-token").get("/api/v1/usage?from=2028-02-28&to=2028-03-01&groupBy=pod").json
    )
    (row,) = usage["items"]
    idle = sum(0.5 * INTERVAL * (100 - utilisation) / 100 for utilisation in TRACE[1:])
    assert row["gpuSeconds"] == 0.5 * INTERVAL * (len(TRACE) - 1) and row["meteredGpuMinutes"] == row["gpuMinutes"]
    assert round(row["idleGpuMinutes"] * 60 * 1_000_000) == round(idle * 1_000_000)
    # The H100's billing weight (2.5 in the shipped catalogue) prices the idle part as it priced the bill.
    assert row["idleBilledGpuMinutes"] == pytest.approx(
        row["idleGpuMinutes"] * row["billedGpuMinutes"] / row["gpuMinutes"]
    )
    (pod,) = SpecClient(app.test_client(), "admin-token").get("/api/v1/pods?namespace=ml").json["items"]
    assert pod["gpuUtilizationPercent"] == TRACE[-1]
    assert pod["idleSince"] == "2028-02-28T23:05:30Z"  # the last report's: the one before it read 3 %, not idle
