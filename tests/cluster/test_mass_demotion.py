"""A crossing at scale: a namespace of 500 running GPU pods (Deployments), one Deployment behind a
PodDisruptionBudget, runs out of a budget that evicts on exhaustion. Every pod admitted in budget is evicted once
(the API server's audit log counts each eviction it granted), the budget's Deployment is never more disrupted than
it allows (its 429s asked again until allowed), and every replacement runs demoted. It prints how long that took
from the crossing: to the last eviction and to the last replacement running; the time is printed, never asserted
(this machine is shared; bench/demotion.py runs it beside evictions one at a time).

GPUSHARING_DEMOTION_PODS sets the pods (500); GPUSHARING_EVICTION_CONCURRENCY, when set, runs the controller with
that TIMEKEEPER_EVICTION_CONCURRENCY in place of the system's (the controller's default).

GPUSHARING_DEMOTION_BASELINE=client runs the baseline of bench/demotion.py --cluster: no crossing, the same pods
evicted by a plain client (this test, as the cluster's admin, that many at a time, or 16; each 429, or 409 of a
budget's status written concurrently, asked again after a second), and their replacements admitted in budget. It
prints the control plane's own time for the evictions and the replacements (webhook, kube-scheduler, the node
simulator), with none of the controller's work in it.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.cluster.nodes import METER, NodeSimulator
from tests.cluster.test_controller import IN_BUDGET, OVER_BUDGET, deployment, granted, running
from tests.cluster.workloads import AdmissionProbe, delete_namespaces, pod_template
from tests.e2e.system import ApiError, GpuSharing, wait_for

PODS = int(os.environ.get("GPUSHARING_DEMOTION_PODS", "500"))
CONCURRENCY = os.environ.get("GPUSHARING_EVICTION_CONCURRENCY", "").strip()
BY_CLIENT = os.environ.get("GPUSHARING_DEMOTION_BASELINE", "").strip() == "client"
DEPLOYMENTS = 10
REPLICAS = PODS // DEPLOYMENTS
MAX_UNAVAILABLE = 5  # the guarded Deployment's disruption budget
PODS_PER_NODE = 80  # hami: ten pods to each of a node's 8 GPUs (gpucores 10 of 100)
REPORT_SECONDS = 10.0  # the simulated meters report this often here: 500 pods, 50 reports a second


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions") or []
    return "deletionTimestamp" not in pod["metadata"] and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def evict_as_a_client(cluster: GpuSharing, namespace: str, names: set[str], concurrency: int) -> None:
    """The baseline's evictions: every pod asked for, `concurrency` at a time, each 429 or 409 asked again after a
    second."""
    def evict(name: str) -> None:
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        while True:
            try:
                cluster.rest("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", eviction)
                return
            except ApiError as exc:
                if exc.status not in (409, 429):  # 409: the budget's status changed under the API server's write
                    raise
                time.sleep(1.0)

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(evict, sorted(names)))


def test_a_namespace_of_running_pods_is_demoted_each_evicted_once_within_its_disruption_budget(
    cluster: GpuSharing, nodes: NodeSimulator, capsys: pytest.CaptureFixture[str],
) -> None:
    cluster.require_controllers()
    nodes.add_pool("mass-demotion", -(-2 * PODS // PODS_PER_NODE), "hami")  # room for every pod and its replacement
    namespace = cluster.namespace("mass-demotion")
    probed = cluster.namespace("mass-demotion-probe")  # another team's creates, timed while the demotion runs
    interval, nodes.meter_interval = nodes.meter_interval, REPORT_SECONDS
    replaced = None
    if CONCURRENCY:  # the system's controller, replaced by one evicting this many at a time
        cluster.controller.stop()
        replaced = cluster.controller_service("controller-demotion", cluster.database,
                                              TIMEKEEPER_EVICTION_CONCURRENCY=CONCURRENCY)
    figures: list[str] = []
    lowest: list[int] = []  # the guarded Deployment's ready pods, sampled through the demotion
    sampling = threading.Event()
    try:
        cluster.set_budget(namespace, gpu_minutes=1_000_000, evict=True)
        cluster.create(
            namespace,
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "guarded"},
                "spec": {"maxUnavailable": MAX_UNAVAILABLE, "selector": {"matchLabels": {"app": "train-0"}}},
            },
        )
        for index in range(DEPLOYMENTS):
            template = pod_template("hami", "mass-demotion", {METER: "simulated"}, {})
            cluster.create(namespace, deployment(f"train-{index}", REPLICAS, template))
        def every_pod_running() -> list[dict[str, Any]]:
            pods = running(cluster, namespace, "")
            return pods if len(pods) == PODS else []

        originals = wait_for(every_pod_running, f"{PODS} pods running", timeout=900)
        assert {p["spec"]["priorityClassName"] for p in originals} == {IN_BUDGET}
        names = {p["metadata"]["name"] for p in originals}
        guarded = {p["metadata"]["name"] for p in originals if p["metadata"]["labels"]["app"] == "train-0"}
        def used() -> float:  # 0 while the timekeeper, busy with the pods' reports, answers 503
            answer = cluster.timekeeper_call("GET", f"/api/v1/budgets/{namespace}", cluster.budget_admin_token())
            return float(answer.json()["usedGpuMinutes"]) if answer.status_code == 200 else 0.0

        wait_for(lambda: used() > 2, "the pods' use, billed from the record, past 2 GPU-minutes", timeout=300)

        def sample() -> None:
            while not sampling.wait(0.5):
                lowest.append(sum(ready(p) for p in cluster.pods(namespace, "app=train-0")))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        with AdmissionProbe(cluster, probed) as probe:
            crossed_at, crossed = dt.datetime.now(dt.timezone.utc), time.monotonic()
            if BY_CLIENT:
                evict_as_a_client(cluster, namespace, names, int(CONCURRENCY or 16))
            else:
                cluster.set_budget(namespace, gpu_minutes=1, evict=True)  # below its use: the crossing

            wait_for(lambda: {a.pod for a in granted(cluster, namespace)} >= names,
                     "every pod admitted in budget evicted", timeout=300)
            last_eviction = max(a.received for a in granted(cluster, namespace) if a.pod in names)
            demoted = lambda: [  # noqa: E731
                p for p in running(cluster, namespace, "") if p["metadata"]["name"] not in names
            ]
            wait_for(lambda: len(demoted()) == PODS, "a replacement running for every pod", timeout=300)
            replacements_running = time.monotonic() - crossed
        sampling.set()
        sampler.join()

        answers = cluster.plane.eviction_answers(namespace)
        times = Counter(a.pod for a in answers if a.code == 201)
        refused = [a for a in answers if a.code == 429]
        what = "evicted by a plain client, replaced in budget (the baseline)" if BY_CLIENT else "demoted"
        figures.append(
            f"{PODS} running pods {what} ({CONCURRENCY or 'default'} evictions at a time): last eviction "
            f"{(last_eviction - crossed_at).total_seconds():.1f} s after the crossing, every replacement "
            f"running after {replacements_running:.1f} s; {sum(times.values())} evictions granted, "
            f"{len(refused)} answered 429 ({sum(a.pod in guarded for a in refused)} of the guarded "
            f"Deployment's); its ready pods at least {min(lowest)} of {REPLICAS} (budget: {REPLICAS - MAX_UNAVAILABLE})"
        )
        figures.append(f"admission meanwhile, in another namespace: {probe.figures()}")
        assert probe.gpu and probe.without, "pods were created while the demotion ran"
        assert set(times) == names, "only the pods admitted in budget are evicted, every one of them"
        assert [name for name, count in times.items() if count > 1] == [], (
            "the API server granted no pod's eviction twice"
        )
        assert any(a.pod in guarded for a in refused), "the disruption budget held some of its pods back"
        assert min(lowest) >= REPLICAS - MAX_UNAVAILABLE, "never more disrupted than its budget allows"
        for pod in [] if BY_CLIENT else demoted():
            assert pod["spec"]["priorityClassName"] == OVER_BUDGET, pod["metadata"]["name"]
            assert pod["metadata"]["annotations"]["gpusharing.io/budget-state"] == "over-budget", pod["metadata"][
                "name"
            ]
    finally:
        sampling.set()
        delete_namespaces(cluster, namespace, probed)
        nodes.meter_interval = interval
        if replaced is not None:
            replaced.stop()
            cluster.controller.__enter__()  # the system's controller for the tests after this one
        with capsys.disabled():
            print("\nmass demotion: " + "\nmass demotion: ".join(figures))
