"""The controller's one eviction path on the real control plane, for both of its reasons, across its two replicas.

- A crossing: a Deployment of 40 whole-GPU pods behind a PodDisruptionBudget runs out of a budget that evicts on
  exhaustion; once the first evictions were granted, the controller replica that holds the Lease is killed (SIGKILL:
  nothing given back) and another started in its place. The API server's audit log shows each pod admitted in budget
  evicted exactly once (its workload takes minutes to stop, so a second eviction would be granted and show), and every
  replacement admitted over budget. The dead leader's claims on the pods it had not finished are taken over once the
  successor's term is older than any answer is waited for (TERM_SETTLED_SECONDS, 15 s): the crossing resumes then,
  each pod taken over read before it is asked again, and none evicted twice.
- An idle `demote`: a Deployment's pod whose meter reads 0 % GPU utilisation is warned of, the leader is killed
  between the warning and the deadline, and its successor demotes the pod once, within one `idle` run of the deadline
  (and the Lease's takeover); the replacement is admitted out of budget under the owner's hold, and once idle past
  its own deadline is told so and left running (it already runs out of budget).
- The same demotion, without the kill, with the webhook polling the timekeeper every second and every 30 s: the hold
  taken at the warning is acknowledged before the deadline either way, so the eviction comes within one `idle` run of
  it, never before.

The bounds are the protocol's, not the machine's speed: never before the deadline (the streak's start, `idleSince`,
plus `after`) by the API server's audit log, and on the first `idle` run that found it due, as the evicting controller
says.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from demo.processes import Service
from tests.cluster.conftest import LEASE_SECONDS, WEBHOOK_REFRESH_SECONDS
from tests.cluster.nodes import METER, STOPS_AFTER, UTILISATION, NodeSimulator
from tests.cluster.workloads import delete_namespaces, pod_template
from tests.e2e.controlplane import EvictionAnswer
from tests.e2e.system import SYSTEM_NAMESPACE, TASK_INTERVALS, GpuSharing, wait_for
from timekeeper.cluster.leader import LEASE_NAME
from timekeeper.cluster.manager import LEASE_RETRY_SECONDS
from timekeeper.database.cluster.fencing import STALE_CLAIM_SECONDS

LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/{LEASE_NAME}"
IN_BUDGET, OVER_BUDGET = "gpusharing-in-budget", "gpusharing-over-budget"
IDLE_INTERVAL = float(TASK_INTERVALS["TIMEKEEPER_IDLE_INTERVAL_SECONDS"])
# A successor takes the Lease once it has seen the record unchanged for the Lease's duration, asking every fifth of it.
TAKEOVER_SECONDS = LEASE_SECONDS + 2 * min(LEASE_RETRY_SECONDS, LEASE_SECONDS / 5)

TRAINERS = 40
MIN_AVAILABLE = TRAINERS - 3  # the disruption budget allows 3 disruptions, more only as replacements run
STOPS_IN = 300  # seconds an evicted trainer takes to stop: it stays, terminating, for the whole test


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def events(cluster: GpuSharing, namespace: str, reason: str, uid: str) -> list[dict[str, Any]]:
    """The Events of `reason` on the object of `uid`."""
    return [e for e in cluster.rest("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
            if e["reason"] == reason and e["involvedObject"].get("uid") == uid]


def granted(cluster: GpuSharing, namespace: str) -> list[EvictionAnswer]:
    return [answer for answer in cluster.plane.eviction_answers(namespace) if answer.code == 201]


def crossing_progress(cluster: GpuSharing, namespace: str, trainers: set[str]) -> str:
    """How far a crossing got: the trainers evicted, the disruption budget's refusals, the replacements running."""
    answers = cluster.plane.eviction_answers(namespace)
    evicted = {a.pod for a in answers if a.code == 201} & trainers
    replacements = [p for p in running(cluster, namespace, "app=train") if p["metadata"]["name"] not in trainers]
    pods = {p["metadata"]["name"]: p for p in cluster.pods(namespace, "app=train")}
    left = [  # each trainer not granted an eviction: where it stands, and every answer the API server gave for it
        f"{name} {pods[name]['status'].get('phase') if name in pods else 'gone'}"
        f"{' deleting' if 'deletionTimestamp' in pods.get(name, {}).get('metadata', {}) else ''}, answered "
        f"{[a.code for a in answers if a.pod == name]}"
        for name in sorted(trainers - evicted)
    ]
    return (f"{len(evicted)} of {len(trainers)} trainers evicted, {sum(a.code == 429 for a in answers)} evictions "
            f"refused by the disruption budget, {len(replacements)} replacements running; not evicted: {left}")


def running(cluster: GpuSharing, namespace: str, selector: str) -> list[dict[str, Any]]:
    return [p for p in cluster.pods(namespace, selector)
            if p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]]


def deployment(name: str, replicas: int, template: dict[str, Any]) -> dict[str, Any]:
    template["metadata"]["labels"]["app"] = name
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template}}


# --- the Lease's holder ---------------------------------------------------------------------------------------------


def holder(cluster: GpuSharing) -> str:
    return str(cluster.rest("GET", LEASE_PATH)["spec"].get("holderIdentity") or "")


def leader(cluster: GpuSharing, replicas: list[Service]) -> Service:
    """The replica that holds the Lease (its identity names its process: host-pid-random)."""
    def find() -> Service | None:
        held = holder(cluster)
        found = [
            s for s in replicas if s.process is not None and s.process.poll() is None and f"-{s.process.pid}-" in held
        ]
        return found[0] if found else None
    return wait_for(find, "a controller replica to hold the Lease")


@dataclass
class Kill:
    at: dt.datetime  # when the leader was killed
    successor_seen: dt.datetime  # when this test saw another replica hold the Lease
    killed: Service


def kill_leader(cluster: GpuSharing, replicas: list[Service], label: str) -> Kill:
    """SIGKILL to the Lease's holder (it gives nothing back: not the Lease, not its claims), a successor awaited, and
    a new replica started in its place (the dead one's log kept beside it)."""
    victim = leader(cluster, replicas)
    assert victim.process is not None
    was = holder(cluster)
    at = now()
    os.kill(victim.process.pid, signal.SIGKILL)
    victim.process.wait()
    wait_for(lambda: holder(cluster) not in ("", was), "another controller replica to take the Lease")
    seen = now()
    shutil.copy(victim.log_path, victim.log_path.with_name(f"{victim.log_path.stem}.killed-{label}.log"))
    victim.__enter__()  # a replica in its place, as the Deployment would start one
    return Kill(at, seen, victim)


# --- an idle pod ----------------------------------------------------------------------------------------------------


def idle_namespace(cluster: GpuSharing, pool: str, prefix: str, after: int, warn_before: int) -> str:
    """A namespace whose budget demotes pods idle for `after` seconds (warned `warn_before` ahead), with a Deployment
    of one pod whose simulated meter reads 0 % GPU utilisation in every report."""
    namespace = cluster.namespace(prefix)
    idle = {"after": f"{after}s", "action": "demote", "warnBefore": f"{warn_before}s", "utilisationPercent": 1}
    answer = cluster.timekeeper_call("PUT", f"/api/v1/budgets/{namespace}", cluster.budget_admin_token(),
                                     {"gpuMinutes": 6000, "period": "monthly", "idle": idle})
    assert answer.status_code in (200, 201), answer.text
    template = pod_template("whole", pool, {METER: "simulated", UTILISATION: "0"}, {})
    cluster.create(namespace, deployment("nb", 1, template))
    return namespace


def idle_since(cluster: GpuSharing, namespace: str, uid: str) -> dt.datetime | None:
    """The start of the pod's idle streak as the timekeeper keeps it (what `gpusharing explain` shows)."""
    answer = cluster.timekeeper_call("GET", f"/api/v1/pods?namespace={namespace}", cluster.budget_admin_token())
    assert answer.status_code == 200, answer.text
    since = next((item["idleSince"] for item in answer.json()["items"] if item["podUid"] == uid), None)
    return dt.datetime.fromisoformat(since.replace("Z", "+00:00")) if since else None


@dataclass
class Demotion:
    pod: dict[str, Any]
    since: dt.datetime  # the streak's start, as the API writes it
    deadline: dt.datetime  # since + after
    warned: dict[str, Any]  # the GPUIdleWarning Event


def warned_of(cluster: GpuSharing, namespace: str, after: int, timeout: float = 60) -> Demotion:
    """The Deployment's pod, in budget and running, once it has been warned of."""
    (pod,) = wait_for(lambda: running(cluster, namespace, "app=nb"), "the idle Deployment's pod running")
    assert pod["spec"]["priorityClassName"] == IN_BUDGET
    (warning,) = wait_for(
        lambda: events(cluster, namespace, "GPUIdleWarning", pod["metadata"]["uid"]),
        "the GPUIdleWarning Event",
        timeout,
    )
    assert "it will be demoted at" in warning["message"], warning["message"]
    since = idle_since(cluster, namespace, pod["metadata"]["uid"])
    assert since is not None
    return Demotion(pod, since, since + dt.timedelta(seconds=after), warning)


def demoted_once(cluster: GpuSharing, namespace: str, demotion: Demotion, timeout: float) -> EvictionAnswer:
    """The pod's one granted eviction, once its replacement runs: admitted out of budget under its owner's hold."""
    name, uid = demotion.pod["metadata"]["name"], demotion.pod["metadata"]["uid"]
    (evicted,) = wait_for(lambda: granted(cluster, namespace), f"the eviction of {namespace}/{name}", timeout)
    (replacement,) = wait_for(lambda: [p for p in running(cluster, namespace, "app=nb") if p["metadata"]["uid"] != uid],
                              "the Deployment's replacement running")
    owner = demotion.pod["metadata"]["ownerReferences"][0]
    assert replacement["spec"]["priorityClassName"] == OVER_BUDGET
    assert replacement["metadata"]["annotations"]["gpusharing.io/idle-hold"] == f"ReplicaSet/{owner['name']}"
    (told,) = wait_for(lambda: events(cluster, namespace, "GPUIdle", uid), "the GPUIdle Event")
    assert "; evicted; ReplicaSet" in told["message"], told["message"]
    time.sleep(4 * IDLE_INTERVAL)  # a few more idle passes, each of which could have evicted again
    assert [(a.pod, a.code) for a in cluster.plane.eviction_answers(namespace)] == [(name, 201)]
    return evicted


def within_one_pass(evicted: EvictionAnswer, demotion: Demotion, controllers: list[Service]) -> None:
    """The protocol's bounds, in idle runs rather than seconds: never before the deadline (the API server's audit
    log), and on the first idle run that found it due (a report showing the streak past `after`), as the evicting
    controller says in its log: no run waited for the webhooks' acknowledgement of the hold, taken at the warning."""
    at = evicted.received
    assert at >= demotion.deadline, f"evicted at {at}, before the deadline {demotion.deadline}"
    name = f"{demotion.pod['metadata']['namespace']}/{demotion.pod['metadata']['name']}"
    said = [line for service in controllers for line in service.log_path.read_text(errors="replace").splitlines()
            if f"idle pod {name} evicted" in line]
    assert len(said) == 1, said
    assert "on the first idle run it was due" in said[0], said[0]
    print(f"\nidle demotion: deadline {demotion.deadline:%H:%M:%S}, evicted "
          f"{(at - demotion.deadline).total_seconds():.2f} s after it: {said[0].split(' evicted ', 1)[1]}")


# --- the tests ------------------------------------------------------------------------------------------------------


def test_a_crossing_and_an_idle_demotion_each_survive_their_leader_killed_midway(
    cluster: GpuSharing, nodes: NodeSimulator
) -> None:
    cluster.require_controllers()
    nodes.add_pool("ctl-crossing", (2 * TRAINERS + 7) // 8, "whole")  # room for every trainer and its replacement
    nodes.add_pool("ctl-idle", 1, "whole")
    second = cluster.controller_service("controller-2", cluster.database)
    replicas = [cluster.controller, second]
    after, warn_before = 20, 10
    idle = idle_namespace(cluster, "ctl-idle", "ctl-idle", after, warn_before)
    crossing = cluster.namespace("ctl-crossing")
    try:
        # The crossing's namespace, in budget for now: 40 trainers behind a disruption budget.
        cluster.set_budget(crossing, gpu_minutes=10_000, evict=True)
        cluster.create(
            crossing,
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "train"},
                "spec": {"minAvailable": MIN_AVAILABLE, "selector": {"matchLabels": {"app": "train"}}},
            },
        )
        trainers = pod_template("whole", "ctl-crossing", {METER: "simulated", STOPS_AFTER: str(STOPS_IN)}, {})
        cluster.create(crossing, deployment("train", TRAINERS, trainers))

        # The idle pod is warned of; its leader dies before the deadline; the successor demotes it on time.
        demotion = warned_of(cluster, idle, after)
        assert now() < demotion.deadline - dt.timedelta(seconds=TAKEOVER_SECONDS), (
            "warned too late to kill its leader before the deadline"
        )
        kill_leader(cluster, replicas, "idle")
        evicted = demoted_once(cluster, idle, demotion, timeout=after + 60)
        within_one_pass(evicted, demotion, replicas)

        # The crossing: every trainer running in budget, then the budget runs out by use.
        originals = wait_for(
            lambda: (pods := running(cluster, crossing, "app=train")) and len(pods) == TRAINERS and pods,
            f"{TRAINERS} trainers running",
            timeout=180,
        )
        assert {p["spec"]["priorityClassName"] for p in originals} == {IN_BUDGET}
        names = {p["metadata"]["name"] for p in originals}
        used = cluster.timekeeper_call("GET", f"/api/v1/budgets/{crossing}", cluster.budget_admin_token()).json()[
            "usedGpuMinutes"
        ]
        cluster.set_budget(crossing, gpu_minutes=used + 0.5, evict=True)  # half a GPU-minute left: a second of 40 GPUs

        wait_for(lambda: len(granted(cluster, crossing)) >= 3, "the crossing's first evictions", timeout=120)
        kill = kill_leader(cluster, replicas, "crossing")
        # Claims the dead leader left unfinished are taken over once its successor's term has settled (or they are
        # stale, whichever comes first).
        # Each eviction past the disruption budget's three waits for a replacement to be admitted, scheduled and run:
        # minutes on a loaded machine (CI runs the cluster tier beside the e2e tier).
        wait_for(lambda: {a.pod for a in granted(cluster, crossing)} >= names, "every trainer evicted",
                 timeout=STALE_CLAIM_SECONDS + 360, found=lambda: crossing_progress(cluster, crossing, names))
        replacements = lambda: [  # noqa: E731
            p for p in cluster.pods(crossing, "app=train") if p["metadata"]["name"] not in names
        ]
        wait_for(lambda: len(replacements()) >= TRAINERS, "a replacement for every trainer")
        # the successor's passes after the last eviction have had every chance to evict again
        time.sleep(3 * LEASE_SECONDS)

        answers = cluster.plane.eviction_answers(crossing)
        times = Counter(a.pod for a in answers if a.code == 201)
        assert set(times) == names, "only the trainers admitted in budget are evicted, every one of them"
        assert [name for name, count in times.items() if count > 1] == [], (
            "the API server granted no pod's eviction twice"
        )
        assert any(a.code == 429 for a in answers), "the disruption budget held some back"
        assert any(a.code == 201 and a.received < kill.at for a in answers) and any(
            a.code == 201 and a.received > kill.at for a in answers
        ), "the leader was killed in the middle of the crossing"
        # The first request the API server received after the kill is the successor's (answered 201, or 429 while the
        # disruption budget waits for slow-stopping trainers): when the crossing resumed.
        resumed = min(a.received for a in answers if a.received > kill.at)
        print(
            f"\ncrossing: the successor's first eviction request {(resumed - kill.at).total_seconds():.1f} s after the "
            f"leader was killed"
        )
        for pod in replacements():
            assert pod["spec"]["priorityClassName"] == OVER_BUDGET, pod["metadata"]["name"]
            assert pod["metadata"]["annotations"]["gpusharing.io/budget-state"] == "over-budget", pod["metadata"][
                "name"
            ]
        assert {p.priority_class for p in nodes.pods.values() if p.namespace == crossing and p.name not in names} == {
            OVER_BUDGET
        }

        # Meanwhile the idle pod's replacement, out of budget, has been idle past its own deadline: told so, left
        # running.
        (replacement,) = running(cluster, idle, "app=nb")
        (told,) = wait_for(
            lambda: events(cluster, idle, "GPUIdle", replacement["metadata"]["uid"]), "the replacement's GPUIdle Event"
        )
        assert told["message"].endswith(
            "it is not evicted: it already runs out of budget (the webhook admitted it demoted)"
        )
        assert [(a.pod, a.code) for a in cluster.plane.eviction_answers(idle)] == [
            (demotion.pod["metadata"]["name"], 201)
        ]
    finally:
        second.stop()
        if cluster.controller.process is None or cluster.controller.process.poll() is not None:
            cluster.controller.__enter__()  # the system's controller for the tests after this one
        delete_namespaces(cluster, idle, crossing)


# The webhook acknowledges a hold at its second poll after it: a poll says which listing the webhook held in force
# while it asked (`inForce`), so the first after the hold still names the listing before it; the warning comes that
# much and more before the deadline at the slowest poll tested.
SLOWEST_POLL = 30
WARN_BEFORE = 2 * SLOWEST_POLL + 10
AFTER = WARN_BEFORE + 5


@pytest.mark.parametrize("refresh", [1, SLOWEST_POLL], ids=["webhook-polls-every-1s", "webhook-polls-every-30s"])
def test_an_idle_demotion_comes_within_one_pass_of_its_deadline_however_often_the_webhook_polls(
    cluster: GpuSharing, nodes: NodeSimulator, refresh: int,
) -> None:
    cluster.require_controllers()
    pool = f"ctl-idle-{refresh}s"
    nodes.add_pool(pool, 1, "whole")
    webhook = cluster.webhook
    setting = "GPUSHARING_BUDGET_REFRESH_SECONDS"
    own = webhook.env.get(setting, str(WEBHOOK_REFRESH_SECONDS))
    webhook.stop()
    webhook.env[setting] = str(refresh)
    webhook.__enter__()
    namespace = ""
    try:
        namespace = idle_namespace(cluster, pool, f"ctl-idle-{refresh}s", AFTER, WARN_BEFORE)
        demotion = warned_of(cluster, namespace, AFTER)
        assert "deletionTimestamp" not in (cluster.pod(namespace, demotion.pod["metadata"]["name"]) or {}).get(
            "metadata", {}
        )
        evicted = demoted_once(cluster, namespace, demotion, timeout=AFTER + 60)
        within_one_pass(evicted, demotion, [cluster.controller])
    finally:
        # The cluster's own setting again. The stopped process stays live for the controller until three of its polls
        # and 5 s after its last one (up to 95 s after a 30 s poll): evictions of the tests after this one wait that
        # long at most, as a cluster's wait while a rolled webhook's process ages out.
        webhook.stop()
        webhook.env[setting] = own
        webhook.__enter__()
        if namespace:
            delete_namespaces(cluster, namespace)
