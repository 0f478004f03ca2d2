"""The node's word on GPU utilisation (issue 31): node agents' readings into the pod ledgers on SQLite and
PostgreSQL, their precedence over the meter's, and `POST /api/v1/node-readings` with its authentication (static
tokens, and TokenReview against the HTTP fake of the API). The real API server: tests/e2e/test_node_readings.py."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from demo.kubeapi import FakeKube
from gpusharing.admin.explain import idle_of, utilisation_source
from gpusharing.contract import fresh_for
from gpusharing.idle.policy import IdlePolicy, PolicyInForce
from gpusharing.idle.verdict import PodFacts, Reading, Streak, verdict
from gpusharing.report import MeterReport
from gpusharing.settings.env import ConfigError
from gpusharing.utilisation import PodUtilisation, UtilisationSource
from tests.timekeeper import test_idle as idle_tests
from tests.timekeeper.conftest import ADMIN, METER, AppFactory, Clock, SpecClient, run_controller
from tests.timekeeper.test_idle import T0, Cluster, first, policy
from timekeeper.accounting.ledger import Observation
from timekeeper.auth import load_static_tokens
from timekeeper.cluster.idling import IDLE_WARNING
from timekeeper.cluster.kube import KubeApi
from timekeeper.config import TimekeeperConfig
from timekeeper.database.accounting.charging import PodObservation, ReportLedger, ReportTerms
from timekeeper.database.accounting.pods import PodRecord
from timekeeper.database.accounting.readings import RecordedReadings, UtilisationLedger
from timekeeper.database.accounting.streaks import IdleLedger
from timekeeper.database.tables import pod_usage

UTC = dt.timezone.utc
INTERVAL = 30.0  # the meters report every 30 s
WINDOW = 10.0  # the node agent reads every 10 s: its readings are fresh for 20 s
NODE = UtilisationSource.NODE


# The report path's fixtures, and the controller against the HTTP fake of the API, as test_idle has them.
store, ledger, leader = idle_tests.store, idle_tests.ledger, idle_tests.leader


@pytest.fixture
def readings(ledger: ReportLedger) -> UtilisationLedger:
    return UtilisationLedger.of(ledger)


class Pod:
    """A running pod as the timekeeper sees it: its meter's reports, the node agent's readings, the watch's passes."""

    def __init__(self, ledger: ReportLedger, readings: UtilisationLedger, clock: Clock, uid: str, name: str,
                 namespace: str = "ml", share: float = 0.5):
        self.ledger, self.readings, self.clock = ledger, readings, clock
        self.uid, self.name, self.namespace, self.share = uid, name, namespace, share
        self.seq = 0
        self.started = clock.at

    def meter(self, utilisation: float | None) -> None:
        self.seq += 1
        gpu_seconds = self.share * (self.clock.at - self.started).total_seconds()
        report = MeterReport(self.uid, self.namespace, self.name, self.share, self.seq, gpu_seconds,
                             gpu_utilization_percent=utilisation)
        (result,) = self.ledger.record([(report, ReportTerms(self.share, None, started_at=self.started))])
        assert result.outcome.value == "charged"

    def node(self, utilisation: float | None, window: float = WINDOW, memory: float | None = None) -> RecordedReadings:
        reading = PodUtilisation(self.uid, self.namespace, self.name, utilisation, memory)
        return self.readings.record_utilisation(NODE, [reading], window, self.clock.at)

    def observe(self) -> None:
        self.ledger.observe([PodObservation(self.uid, self.namespace, self.name, self.share,
                                            Observation(self.share, self.started, self.clock.at, False))])

    def record(self) -> PodRecord:
        return next(pod for pod in self.ledger.pods(self.namespace) if pod.pod_uid == self.uid)

    def idle_seconds(self) -> tuple[float, float]:
        """(metered, idle) GPU-seconds of its daily usage: the part charged with a reading, and what of it was idle."""
        with self.ledger.db.read() as conn:
            metered, idle = conn.execute(select(func.sum(pod_usage.c.metered_micro_gpu_seconds),
                                                func.sum(pod_usage.c.idle_micro_gpu_seconds))
                                         .where(pod_usage.c.pod_uid == self.uid)).one()
        return int(metered or 0) / 1e6, int(idle or 0) / 1e6

    def later(self, seconds: float) -> "Pod":
        self.clock.advance(seconds=seconds)
        return self


def test_a_node_reading_takes_the_pods_place_and_moves_its_streak(ledger: ReportLedger, readings: UtilisationLedger,
                                                                   clock: Clock) -> None:
    pod = Pod(ledger, readings, clock, "uid-nb", "nb")
    pod.meter(80)
    assert pod.record().utilisation_source == "meter"
    assert pod.later(5).node(0.2, memory=1024) == RecordedReadings(1)
    began = clock.at
    record = pod.record()
    assert (record.utilisation_source, record.gpu_utilization_percent, record.gpu_memory_used_mib) == (
        "node",
        0.2,
        1024,
    )
    assert record.utilisation_at == began and record.utilisation_fresh_until == began + dt.timedelta(
        seconds=fresh_for(WINDOW)
    )
    assert record.streak.since == began  # the meter's busy word does not carry over: a streak of the node's alone
    for _ in range(3):
        pod.later(WINDOW).node(0.0)
        assert pod.record().streak.since == began
    pod.later(WINDOW).node(35.0)
    assert pod.record().streak.since is None


def test_while_the_node_reports_the_meters_busy_word_changes_nothing_but_the_bill(
    ledger: ReportLedger, readings: UtilisationLedger, clock: Clock,
) -> None:
    pod = Pod(ledger, readings, clock, "uid-nb", "nb")
    pod.meter(None)
    pod.later(5).node(0.0)
    began = clock.at
    for _ in range(6):  # a tenant's meter claiming a busy GPU every interval, the node reading idle every window
        pod.later(WINDOW).node(0.0)
        pod.later(WINDOW).node(0.0)
        pod.later(WINDOW).node(0.0)
        pod.meter(99.0)
        record = pod.record()
        assert record.streak.since == began and record.utilisation_source == "node"
        assert record.gpu_utilization_percent == 0.0
    # Billed exactly as ever, share × time since the start, and idle as the node read it.
    billed = 0.5 * (clock.at - pod.started).total_seconds()
    assert pod.record().micro_gpu_seconds == round(billed * 1e6)
    assert pod.idle_seconds() == (billed, billed)


def test_once_the_node_falls_silent_the_meters_reading_counts_again(
    ledger: ReportLedger, readings: UtilisationLedger, clock: Clock,
) -> None:
    pod = Pod(ledger, readings, clock, "uid-nb", "nb")
    assert [ignored.reason for ignored in pod.node(0.0).ignored] == [  # no ledger yet: the watch or the meter opens it
        "unknown pod: the timekeeper bills no pod of this uid (yet)"]
    pod.meter(0.0)
    pod.later(1).node(0.0)
    assert pod.record().utilisation_source == "node"
    pod.later(fresh_for(WINDOW) - 1).meter(70.0)  # still fresh: ignored
    assert pod.record().gpu_utilization_percent == 0.0 and pod.record().streak.since is not None
    pod.later(2).meter(0.5)  # the node's reading is 21 s old, more than two windows: the meter is heard
    record = pod.record()
    assert (record.utilisation_source, record.gpu_utilization_percent, record.streak.since) == ("meter", 0.5, clock.at)
    assert pod.later(1).node(2.0) == RecordedReadings(1)  # and the node, back, outranks it again at once
    assert pod.record().utilisation_source == "node"


def test_a_reading_the_ledger_cannot_take_is_ignored_with_the_reason(
    ledger: ReportLedger, readings: UtilisationLedger, clock: Clock,
) -> None:
    billed = Pod(ledger, readings, clock, "uid-a", "a")
    billed.meter(10)
    ended = Pod(ledger, readings, clock, "uid-b", "b")
    ended.meter(10)
    ledger.observe([PodObservation("uid-b", "ml", "b", 0.5, Observation(0.5, T0, T0 + dt.timedelta(seconds=1), True))])
    batch = [PodUtilisation("uid-a", "ml", "a", 3.0), PodUtilisation("uid-x", "ml", "x", 3.0),
             PodUtilisation("uid-b", "ml", "b", 3.0), PodUtilisation("uid-a2", "other", "a", 3.0)]
    clock.advance(seconds=5)
    recorded = readings.record_utilisation(NODE, batch, WINDOW, clock.at)
    assert recorded.accepted == 1
    assert [(ignored.pod_uid, ignored.reason) for ignored in recorded.ignored] == [
        ("uid-x", "unknown pod: the timekeeper bills no pod of this uid (yet)"),
        ("uid-b", "the pod's bill is closed"),
        ("uid-a2", "unknown pod: the timekeeper bills no pod of this uid (yet)"),
    ]
    wrong_namespace = readings.record_utilisation(NODE, [PodUtilisation("uid-a", "other", "a", 3.0)], WINDOW, clock.at)
    assert [ignored.reason for ignored in wrong_namespace.ignored] == [
        "the pod of this uid is billed in namespace ml, not other"
    ]
    # Prometheus's word is of the node's rank: it takes the place of a fresh node reading (and the node of its).
    assert readings.record_utilisation(UtilisationSource.PROMETHEUS, [PodUtilisation("uid-a", "ml", "a", 4.0)], 60,
                                       clock.at).accepted == 1
    assert billed.record().utilisation_source == "prometheus"


def test_a_retried_batch_counts_nothing_twice(ledger: ReportLedger, readings: UtilisationLedger, clock: Clock) -> None:
    pod = Pod(ledger, readings, clock, "uid-nb", "nb")
    pod.meter(None)
    pod.later(5).node(25.0)
    pod.node(25.0)  # the agent's retry of the same batch
    pod.later(WINDOW).meter(None)
    charged = 0.5 * (5 + WINDOW)
    assert pod.idle_seconds() == (charged, charged * 0.75)  # the charge, 75 % idle as the node read it: once


def test_an_observed_interval_is_idle_as_the_node_read_it(ledger: ReportLedger, readings: UtilisationLedger,
                                                          clock: Clock) -> None:
    pod = Pod(ledger, readings, clock, "uid-nb", "nb")
    pod.observe()  # the watch opens its ledger; no meter reports at all (the meter sees no GPU)
    pod.later(1).node(0.0)
    pod.later(WINDOW).observe()
    pod.later(WINDOW).node(40.0)
    pod.later(WINDOW).observe()
    # Each observed interval is idle as the node's reading in force when it is billed: 11 s at 0 %, then 20 s at 40 %.
    assert pod.idle_seconds() == (0.5 * (WINDOW + 1) + 0.5 * 2 * WINDOW, 0.5 * (WINDOW + 1) + 0.5 * 2 * WINDOW * 0.6)


# -- the endpoint -----------------------------------------------------------------------------------------------------

AGENT_A, AGENT_B = "agent-a-token", "agent-b-token"


@pytest.fixture
def agent_tokens(tmp_path: Path) -> str:
    path = tmp_path / "tokens"
    path.write_text(f"{ADMIN} admin alice\n{METER} meter\n{AGENT_A} node-agent agent-a node=node-a\n"
                    f"{AGENT_B} node-agent node=node-b\n")
    return str(path)


def batch(node: str, *readings: dict[str, Any], window: float = WINDOW) -> dict[str, Any]:
    return {"node": node, "windowSeconds": window, "readings": list(readings)}


def reading(uid: str, pod: str, utilisation: float | None = None, namespace: str = "ml") -> dict[str, Any]:
    return {"podUid": uid, "namespace": namespace, "pod": pod,
            **({} if utilisation is None else {"utilisationPercent": utilisation})}


def report(uid: str, pod: str, seq: int, gpu_seconds: float, utilisation: float | None) -> dict[str, Any]:
    return {"podUid": uid, "namespace": "ml", "pod": pod, "gpuShare": 0.5, "seq": seq, "gpuSeconds": gpu_seconds,
            **({} if utilisation is None else {"gpuUtilizationPercent": utilisation})}


def test_a_static_node_agent_sends_its_nodes_readings_and_outranks_the_meter(
    make_app: AppFactory, agent_tokens: str, clock: Clock,
) -> None:
    api = SpecClient(make_app(static_tokens_file=agent_tokens).test_client(), ADMIN)
    meter, agent = api.as_(METER), api.as_(AGENT_A)
    assert meter.post("/api/v1/reports", json=report("uid-nb", "nb", 1, 0, 90)).status_code == 200
    answer = agent.post(
        "/api/v1/node-readings", json=batch("node-a", reading("uid-nb", "nb", 0.0), reading("uid-no", "x", 0.0))
    )
    assert answer.status_code == 200
    assert answer.json == {"accepted": 1, "ignored": [
        {"podUid": "uid-no", "reason": "unknown pod: the timekeeper bills no pod of this uid (yet)"}]}
    clock.advance(seconds=WINDOW)
    assert meter.post("/api/v1/reports", json=report("uid-nb", "nb", 2, 5, 90)).status_code == 200  # "busy"
    (pod,) = api.get("/api/v1/pods").json["items"]
    assert (pod["utilisationSource"], pod["gpuUtilizationPercent"], pod["idleSince"]) == (
        "node",
        0.0,
        "2028-02-28T23:00:00Z",
    )
    assert pod["utilisationAt"] == "2028-02-28T23:00:00Z" and pod["gpuSeconds"] == 5.0


@pytest.mark.parametrize(("token", "body", "status", "error"), [
    (None, batch("node-a"), 401, "a bearer token is required"),
    ("nobody-token", batch("node-a"), 401, "the bearer token is not known to the timekeeper"),
    (METER, batch("node-a"), 403, "static-meter-line-2 is not a node agent's token"),
    (ADMIN, batch("node-a"), 403, "alice is not a node agent's token"),
    (AGENT_B, batch("node-a"), 403, "static-node-agent-line-4 is the node agent of node node-b, not of node node-a"),
    (AGENT_A, {"node": "node-a", "readings": []}, 400, "the node's readings: missing field(s): windowSeconds"),
    (AGENT_A, batch("node-a", window=0), 400, "windowSeconds"),
    (AGENT_A, batch("node-a", {"podUid": "u", "namespace": "ml", "pod": "p", "utilisationPercent": 101}), 400,
     "utilisationPercent"),
    (AGENT_A, batch("node-a", reading("u", "p"), reading("u", "p")), 400, "readings: each pod at most once"),
    (AGENT_A, batch("Node_A"), 400, "node 'Node_A' is not a"),
    (AGENT_A, [], 400, "the node's readings must be a JSON object"),
])
def test_a_batch_the_timekeeper_may_not_take_is_refused_with_the_reason(
    make_app: AppFactory, agent_tokens: str, token: str | None, body: Any, status: int, error: str,
) -> None:
    api = SpecClient(make_app(static_tokens_file=agent_tokens).test_client(), token)
    answer = api.post("/api/v1/node-readings", json=body)
    assert answer.status_code == status, answer.json
    assert error in answer.json["error"]


def test_an_oversized_batch_is_413_and_a_full_one_is_read(make_app: AppFactory, agent_tokens: str) -> None:
    api = SpecClient(make_app(static_tokens_file=agent_tokens).test_client(), AGENT_A)
    full = batch("node-a", *(reading(f"uid-{n:04d}-{'x' * 200}", f"pod-{n}-{'y' * 200}", 50.0) for n in range(1000)))
    answer = api.post("/api/v1/node-readings", json=full)
    assert answer.status_code == 200 and answer.json["accepted"] == 0 and len(answer.json["ignored"]) == 1000
    huge = api.post("/api/v1/node-readings", data=b'{"node": "' + b"a" * (2 * 1024 * 1024) + b'"}',
                    headers={"Content-Type": "application/json"})
    assert huge.status_code == 413 and "1048576 bytes" in huge.json["error"]
    # Elsewhere the timekeeper's own bound stands.
    assert api.post("/api/v1/reports", data=b"{" + b" " * (100 * 1024) + b"}",
                    headers={"Content-Type": "application/json"}).status_code == 413


def test_a_static_node_agent_line_names_its_node(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("t1 node-agent gpu-7 node=gpu-7\n")
    assert load_static_tokens(str(path)).caller("t1").node == "gpu-7"  # type: ignore[union-attr]
    for line, error in (("t1 node-agent gpu-7", "a node-agent token, and only one, is bound to the node"),
                        ("t1 meter node=gpu-7", "a node-agent token, and only one, is bound to the node"),
                        ("t1 node-agent node=GPU_7", "node 'GPU_7' is not a")):
        path.write_text(line + "\n")
        with pytest.raises(ConfigError, match=error):
            load_static_tokens(str(path))


# -- through TokenReview, against the HTTP fake of the API ------------------------------------------------------------

AGENTS = "gpusharing-node-agent"  # the chart's node agent's namespace, whose ServiceAccount is the default


@pytest.fixture
def cluster(make_app: AppFactory, fake_kube: FakeKube) -> tuple[SpecClient, FakeKube]:
    app = make_app(kube=KubeApi(fake_kube.api_client()), auth="tokenreview")
    return SpecClient(app.test_client()), fake_kube


def bound(kube: FakeKube, namespace: str, name: str, node: str, share: str | None = "0.5") -> dict[str, Any]:
    pod = kube.add_pod(namespace, name, share=share)
    pod["spec"]["nodeName"] = node
    return pod


def agent_token(kube: FakeKube, pod: dict[str, Any], node_name: str | None = None) -> str:
    metadata = pod["metadata"]
    extra = {"authentication.kubernetes.io/pod-name": [metadata["name"]],
             "authentication.kubernetes.io/pod-uid": [metadata["uid"]]}
    if node_name is not None:
        extra["authentication.kubernetes.io/node-name"] = [node_name]
    return kube.user_token(f"system:serviceaccount:{metadata['namespace']}:gpusharing-node-agent",
                           ["system:serviceaccounts"], extra)


def of(pod: dict[str, Any], utilisation: float) -> dict[str, Any]:
    metadata = pod["metadata"]
    return reading(metadata["uid"], metadata["name"], utilisation, metadata["namespace"])


def test_an_agents_pod_token_speaks_for_its_nodes_pods_only(cluster: tuple[SpecClient, FakeKube]) -> None:
    api, kube = cluster
    agent = bound(kube, AGENTS, "agent-x1", "node-a", share=None)
    mine, theirs = bound(kube, "ml", "mine", "node-a"), bound(kube, "ml", "theirs", "node-b")
    tenant = api.as_(kube.pod_token(mine))
    assert tenant.post("/api/v1/reports", json=report(mine["metadata"]["uid"], "mine", 1, 0, 90)).status_code == 200
    assert tenant.post("/api/v1/reports", json=report(theirs["metadata"]["uid"], "theirs", 1, 0, 90)).status_code == 403
    api.as_(kube.pod_token(theirs)).post("/api/v1/reports", json=report(theirs["metadata"]["uid"], "theirs", 1, 0, 90))
    speaker = api.as_(agent_token(kube, agent, node_name="node-a"))
    answer = speaker.post("/api/v1/node-readings", json=batch("node-a", of(mine, 0.0), of(theirs, 0.0)))
    assert answer.status_code == 200
    assert answer.json == {
        "accepted": 1,
        "ignored": [
            {
                "podUid": theirs["metadata"]["uid"],
                "reason": "no pod of this uid is bound to node node-a (another node's, or unknown)",
            }
        ],
    }
    # Speaking for node B outright is refused; so is a tenant's own pod token, of a pod of node A.
    refused = speaker.post("/api/v1/node-readings", json=batch("node-b", of(theirs, 0.0)))
    assert refused.status_code == 403 and "runs on node node-a, not on node node-b" in refused.json["error"]
    refused = tenant.post("/api/v1/node-readings", json=batch("node-a", of(mine, 0.0)))
    assert refused.status_code == 403 and "is not a node agent's token" in refused.json["error"]
    # A uid of node A's claimed under another name is not taken either.
    renamed = speaker.post(
        "/api/v1/node-readings", json=batch("node-a", reading(mine["metadata"]["uid"], "other", 0.0))
    )
    assert renamed.json["ignored"][0]["reason"] == "the pod of this uid on node node-a is ml/mine, not ml/other"
    kube.admins.add("admin@example.com")
    pods = {p["pod"]: p for p in api.as_(kube.user_token("admin@example.com")).get("/api/v1/pods").json["items"]}
    assert pods["mine"]["utilisationSource"] == "node" and pods["theirs"]["utilisationSource"] == "meter"
    # The agent's pod is read once, its node kept with the token's answer.
    assert kube.count("GET", f"/api/v1/namespaces/{AGENTS}/pods/agent-x1") == 1


def test_an_agent_token_of_another_identity_node_or_pod_is_refused(cluster: tuple[SpecClient, FakeKube]) -> None:
    api, kube = cluster
    agent = bound(kube, AGENTS, "agent-x1", "node-a", share=None)
    # the agent's ServiceAccount name, in a tenant's namespace
    impostor = bound(kube, "ml", "agent-x1", "node-a", share=None)
    answer = api.as_(agent_token(kube, impostor)).post("/api/v1/node-readings", json=batch("node-a"))
    assert (
        answer.status_code == 403
        and "system:serviceaccount:ml:gpusharing-node-agent is not a node agent's token" in answer.json["error"]
    )
    disagreeing = api.as_(agent_token(kube, agent, node_name="node-b")).post(
        "/api/v1/node-readings", json=batch("node-a")
    )
    assert disagreeing.status_code == 403
    assert f"issued on node node-b, but its pod {AGENTS}/agent-x1 is bound to node node-a" in disagreeing.json["error"]
    old = agent_token(kube, agent)
    kube.delete_pod(AGENTS, "agent-x1")
    bound(kube, AGENTS, "agent-x1", "node-a", share=None)  # re-created under the same name: a new uid
    answer = api.as_(old).post("/api/v1/node-readings", json=batch("node-a"))
    assert answer.status_code == 403 and "no longer exists" in answer.json["error"]
    unbound = kube.user_token(f"system:serviceaccount:{AGENTS}:gpusharing-node-agent")  # not bound to a pod
    answer = api.as_(unbound).post("/api/v1/node-readings", json=batch("node-a"))
    assert answer.status_code == 403 and "not bound to a pod" in answer.json["error"]


# -- what is shown of it
# ------------------------------------------------------------------------------------------------

def test_a_pod_idle_by_the_node_counts_as_idle_now_while_its_meter_is_silent(
    ledger: ReportLedger, readings: UtilisationLedger, clock: Clock,
) -> None:
    pod = Pod(ledger, readings, clock, "uid-nb", "nb")
    pod.meter(None)
    idle = IdleLedger(ledger.db)
    pod.later(5).node(0.0, window=600)
    pod.later(10 * INTERVAL)  # the meter long silent, the node's reading fresh for 20 minutes
    assert idle.idle_now(clock.at, ledger.fresh_seconds) == {"ml": (1, 0)}
    pod.later(1200)
    assert idle.idle_now(clock.at, ledger.fresh_seconds) == {}


@pytest.mark.parametrize(
    ("reading", "why"),
    [
        (
            Reading(0.0, T0, NODE, T0 + dt.timedelta(seconds=20)),
            "idle for 0s: every reading of the node agent since 2026-11-27T09:00:00Z read GPU utilisation under 1 %",
        ),
        (
            Reading(40.0, T0, NODE, T0 + dt.timedelta(seconds=20)),
            "busy: the node agent's last reading read 40 % GPU utilisation",
        ),
        (Reading(None, T0, NODE, T0 + dt.timedelta(seconds=20)), "unknown: the node agent reads no GPU utilisation"),
        (
            Reading(0.0, T0, NODE, T0 + dt.timedelta(seconds=5)),
            "unknown: the node agent has not reported since 2026-11-27T09:00:00Z (silent)",
        ),
    ],
)
def test_the_verdict_says_whose_reading_it_stands_on(reading: Reading, why: str) -> None:
    policy = PolicyInForce(IdlePolicy(3600), "ml")  # warned of nothing, idle under 1 %
    judged = verdict(Streak(T0), reading, policy, PodFacts(T0), T0 + dt.timedelta(seconds=10), fresh_seconds=3600)
    assert judged.why.startswith(why)


def test_explain_shows_whose_word_the_utilisation_is() -> None:
    ledger = {"utilisationSource": "node", "gpuUtilizationPercent": 0.0, "utilisationAt": "2026-11-27T09:00:00Z",
              "utilisationFreshUntil": "2026-11-27T09:00:20Z", "lastReportAt": "2026-11-27T08:00:00Z"}
    assert utilisation_source(ledger) == (
        "node: 0 %, read at 2026-11-27T09:00:00Z, fresh until 2026-11-27T09:00:20Z, by "
        "the node agent, on the node (outranks the meter's while fresh)"
    )
    meter = {"utilisationSource": "meter", "gpuUtilizationPercent": None, "utilisationAt": "2026-11-27T09:00:00Z"}
    assert utilisation_source(meter) == ("meter: unknown, read at 2026-11-27T09:00:00Z, by its meter, inside the pod "
                                         "(counted only where no node agent or Prometheus reports)")
    assert utilisation_source({"utilisationSource": None}) == "none: nothing has read the pod's GPU utilisation yet"
    # The idle verdict explain shows reads the node's freshness, not the meter's silence.
    pod = {"startTime": "2026-11-27T08:00:00Z", "idleExempt": False}
    silent_meter = {**ledger, "meterSilentSince": "2026-11-27T08:30:00Z", "idleSince": "2026-11-27T08:59:00Z"}
    shown = idle_of(pod, None, silent_meter, dt.datetime(2026, 11, 27, 9, 0, 10, tzinfo=UTC))
    assert shown["state"] == "idle" and "every reading of the node agent since" in shown["why"]
    assert idle_of(pod, None, silent_meter, dt.datetime(2026, 11, 27, 9, 0, 30, tzinfo=UTC))["state"] == "unknown"


# -- the idle policy, acted on by the controller (against the HTTP fake of the API)
# -------------------------------------

def test_the_idle_policy_acts_on_the_nodes_word_alone(
    leader: Cluster, readings: UtilisationLedger, clock: Clock,
) -> None:
    policy(leader.store, after="5m", warnBefore="2m")
    busy_claims = leader.pod("nb-0", owner="nb-7d9")  # its tenant's meter says busy at every report
    unseen = leader.pod("nb-1")  # no node reading: its meter's "busy" counts
    passes = []
    for _ in range(12):
        clock.advance(seconds=INTERVAL)
        busy_claims.report(99.0, after=0)
        unseen.report(99.0, after=0)
        readings.record_utilisation(NODE, [PodUtilisation(busy_claims.uid, "ml", "nb-0", 0.0)], INTERVAL, clock.at)
        passes.append(run_controller(leader.controller).idle)
    # The streak begins at the node's first reading; 3 min (6 intervals) later it is warned of, at 5 min acted on.
    assert first(passes, "warned") == 7 and first(passes, "acted") == 11
    warnings = leader.events(IDLE_WARNING)
    assert [(kind, name) for kind, name, _ in warnings] == [("Pod", "nb-0"), ("ReplicaSet", "nb-7d9")]
    assert "(every node agent reading under 1 % utilisation)" in warnings[0][2]


def test_whose_tokens_send_node_readings_is_a_setting_defaulting_to_the_agents_account() -> None:
    # The chart's agent, in its own namespace (whatever the timekeeper's).
    agent = {"system:serviceaccount:gpusharing-node-agent:gpusharing-node-agent"}
    assert TimekeeperConfig.from_env({}).node_agents == agent
    assert TimekeeperConfig.from_env({"TIMEKEEPER_LEASE_NAMESPACE": "gpu-ops"}).node_agents == agent
    users = "system:serviceaccount:gpu-ops:agent, system:serviceaccount:dcgm:agent ,"
    assert TimekeeperConfig.from_env({"TIMEKEEPER_NODE_AGENT_USERS": users}).node_agents == {
        "system:serviceaccount:gpu-ops:agent", "system:serviceaccount:dcgm:agent"}


def test_the_model_a_node_agent_reads_is_kept_as_evidence_and_a_disagreement_counted(
    ledger: ReportLedger, readings: UtilisationLedger, clock: Clock,
) -> None:
    pod = Pod(ledger, readings, clock, "uid-t4", "t4")
    running = Observation(0.5, pod.started, clock.at, False)
    ledger.observe([PodObservation(pod.uid, pod.namespace, pod.name, 0.5, running, model="Tesla T4")])  # its node's
    said = PodUtilisation(pod.uid, pod.namespace, pod.name, 50.0, None, "NVIDIA H100 80GB HBM3")
    readings.record_utilisation(NODE, [said], WINDOW, pod.later(5).clock.at)
    record = pod.record()
    assert (record.model, record.device_model) == ("Tesla T4", "NVIDIA H100 80GB HBM3")
    assert ledger.model_disagreements() == 1  # never the bill: only counted, and shown by explain
    pod.later(5).node(50.0)  # a reading that names no model leaves the last one said
    assert pod.record().device_model == "NVIDIA H100 80GB HBM3"
    readings.record_utilisation(NODE, [replace(said, gpu_model="Tesla T4")], WINDOW, pod.later(5).clock.at)
    assert (pod.record().device_model, ledger.model_disagreements()) == ("Tesla T4", 0)
