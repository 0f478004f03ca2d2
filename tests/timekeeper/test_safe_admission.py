"""Safe admission end to end on each database: the webhook (the real app, polling the real timekeeper over HTTP)
reserves each pod's commitment with the timekeeper, which weighs it against every budget on the namespace's path,
and concurrent bursts of pods never commit more than is left. The cluster's pods are the one part played here: the
pods the webhook admitted are published in the database as the timekeeper's controller publishes its watch's (a
CommitmentPublisher, every simulated second), and the web side reads them there."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from prometheus_client import REGISTRY

from demo.apiserver import admission_review, api_server_pod
from gpusharing.admin.commands import format_statuses
from gpusharing.contract import ANNOTATION_ADMISSION_ID
from gpusharing.gpu.dra import no_claims
from tests.timekeeper.conftest import ADMIN, METER, READER, AppFactory, Clock, SpecClient, served
from tests.webhook.conftest import api_server_callers, as_api_server
from tests.webhook.test_admission import patch_of
from timekeeper.api.context import SERVICES
from timekeeper.budgets.commitments import CommittedPod, committed_pod
from timekeeper.database.cluster.commitments import CommitmentPublisher
from timekeeper.database.tables import commitment_publications
from timekeeper.metrics import LedgerCollector
from webhook.app import create_app as create_webhook
from webhook.caches.budgets import BudgetStateCache
from webhook.caches.jobs import no_jobs
from webhook.config import WebhookConfig

NAMESPACE = "ml"
OVER_BUDGET_CLASS = WebhookConfig().priority_class_over_budget


class System:
    def __init__(self, timekeeper: SpecClient, publisher: CommitmentPublisher, clock: Clock, webhook: Any,
                 cache: BudgetStateCache, metrics: LedgerCollector):
        self.timekeeper, self.publisher, self.clock, self.webhook, self.cache = (
            timekeeper,
            publisher,
            clock,
            webhook,
            cache,
        )
        self.metrics = metrics
        self.pods: dict[str, CommittedPod] = {}  # the controller's watch's committed pods, by uid
        self.healthy = True  # whether its watch is
        self.created = 0

    def publish(self) -> None:
        """What the controller does every second: the committed pods its watch holds, published in the database."""
        self.publisher.publish(self.pods, self.healthy)

    def elapse(self, seconds: float) -> None:
        """Time passes, the controller publishing every second."""
        while seconds > 0:
            self.clock.advance(seconds=min(1.0, seconds))
            seconds -= 1.0
            self.publish()

    def burst(self, count: int, deadline: int, namespaces: tuple[str, ...] = (NAMESPACE,),
              annotations: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """`count` pods of one GPU each (spread over `namespaces`), sent to /mutate at once; the pods as stored, with
        the responses."""
        start = threading.Barrier(count)
        answers: list[tuple[dict[str, Any], dict[str, Any]]] = []
        lock = threading.Lock()

        def one(pod: dict[str, Any]) -> None:
            client = as_api_server(self.webhook)
            start.wait()
            response = client.post("/mutate", json=admission_review(pod)).get_json()["response"]
            with lock:
                answers.append((pod, response))

        pods = [self.pod(deadline, namespaces[i % len(namespaces)], annotations) for i in range(count)]
        threads = [threading.Thread(target=one, args=(pod,)) for pod in pods]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return [
            {"response": r, "pod": jsonpatch.apply_patch(p, patch_of(r)) if r["allowed"] else None} for p, r in answers
        ]

    def pod(
        self, deadline: int, namespace: str = NAMESPACE, annotations: dict[str, str] | None = None
    ) -> dict[str, Any]:
        self.created += 1
        return api_server_pod(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"train-{self.created}", "annotations": annotations or {}},
                "spec": {
                    "activeDeadlineSeconds": deadline,
                    "containers": [
                        {"name": "train", "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": 1}}}
                    ],
                },
            },
            namespace,
        )

    def created_in_cluster(self, admitted: list[dict[str, Any]]) -> None:
        for result in admitted:
            pod = result["pod"]
            pod["metadata"]["uid"] = uid(pod["metadata"]["namespace"], pod["metadata"]["name"])  # the API server's
            committed = committed_pod(pod, WebhookConfig().gpu_request.catalogue)  # as the controller's watch brings it
            assert committed is not None
            self.pods[committed.uid] = committed
        self.publish()

    def ended(self, admitted: list[dict[str, Any]]) -> None:
        for result in admitted:
            del self.pods[uid(result["pod"]["metadata"]["namespace"], result["pod"]["metadata"]["name"])]
        self.publish()

    def uncommitted_minutes(self, namespace: str = NAMESPACE) -> float:
        return float(self.timekeeper.get(f"/api/v1/budgets/{namespace}").json["uncommitted"]["gpuMinutes"])


def uid(namespace: str, name: str) -> str:
    return f"uid-{namespace}-{name}"


def verdicts(verdict: str) -> float:
    return REGISTRY.get_sample_value("gpusharing_webhook_safe_admissions_total", {"verdict": verdict}) or 0.0


def committed_gauge(system: System) -> dict[str, float]:
    (family,) = [f for f in system.metrics.collect() if f.name == "gpusharing_timekeeper_committed_gpu_seconds"]
    return {sample.labels["namespace"]: sample.value for sample in family.samples}


def in_budget(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        r
        for r in results
        if r["response"]["allowed"] and r["pod"]["spec"].get("priorityClassName") != OVER_BUDGET_CLASS
    ]


@pytest.fixture
def system(make_app: AppFactory, tmp_path: Path, clock: Clock) -> Iterator[System]:
    app = make_app()
    publisher = CommitmentPublisher(app.extensions["database"], clock)  # the controller's, on the same database
    timekeeper = SpecClient(app.test_client(), ADMIN)
    token = tmp_path / "token"
    token.write_text(READER)
    with served(app) as url:
        cache = BudgetStateCache(url, str(token))
        # A reservation not answered in time admits the pod unreserved (safe admission, said so): these tests count
        # what the timekeeper reserves, not how fast, so a burst of 40 on a loaded CI host waits for every answer.
        config = WebhookConfig(timekeeper_url=url, timekeeper_token_file=str(token), reservation_timeout_seconds=60.0)
        webhook = create_webhook(config, cache, no_claims, no_jobs, api_server_callers())
        collector = LedgerCollector(app.extensions["ledger"], app.extensions[SERVICES].commitments)
        system = System(timekeeper, publisher, clock, webhook, cache, collector)
        system.publish()  # the controller's watch has listed the cluster's pods: none yet
        yield system


def test_bursts_of_pods_never_commit_more_than_is_left_uncommitted(system: System) -> None:
    api = system.timekeeper
    assert api.put(f"/api/v1/budgets/{NAMESPACE}", json={"gpuMinutes": 70, "admission": "safe"}).status_code == 201
    # 10 GPU-minutes used, and a pod committing 20 more: 40 left uncommitted.
    report = {
        "podUid": "used-1",
        "namespace": NAMESPACE,
        "pod": "done",
        "gpuShare": 1,
        "seq": 1,
        "gpuSeconds": 600,
        "final": True,
    }
    assert api.as_(METER).post("/api/v1/reports", json=report).status_code == 200
    system.pods[uid(NAMESPACE, "running")] = CommittedPod(
        NAMESPACE, 0.5, 1000, 2400, None, None, "running", uid(NAMESPACE, "running")
    )
    system.publish()
    assert system.uncommitted_minutes() == 40.0
    assert system.cache.refresh()

    reserved, demoted_before = verdicts("reserved"), verdicts("demoted")
    first = system.burst(40, deadline=120)  # each commits 2 GPU-minutes
    admitted = in_budget(first)
    assert len(admitted) == 20 and all(r["response"]["allowed"] for r in first)
    assert (verdicts("reserved") - reserved, verdicts("demoted") - demoted_before) == (20, 20)
    demoted = [r for r in first if r not in admitted]
    assert all(ANNOTATION_ADMISSION_ID not in r["pod"]["metadata"]["annotations"] for r in demoted)
    assert (
        "cannot cover this pod's deadline: the pod commits 2.00 GPU-minutes (1 GPU x weight 1 x 120 s), and its "
        "budget has 0.00 left uncommitted (60.00 remaining, less 20.00 committed by running pods' deadlines and 40.00 "
        "by pods being admitted)" in demoted[0]["response"]["warnings"][0]
    )

    # Until the timekeeper has seen the pods, their reservations hold what they commit (the listing counts them too).
    listed = api.get(f"/api/v1/budgets/{NAMESPACE}").json["uncommitted"]
    assert (listed["gpuMinutes"], listed["committedGpuMinutes"], listed["reservedGpuMinutes"]) == (0.0, 20.0, 40.0)
    assert in_budget(system.burst(5, deadline=60)) == []
    # Once it has, the pods count instead of their reservations: still nothing is left.
    system.created_in_cluster(admitted)
    listed = api.get(f"/api/v1/budgets/{NAMESPACE}").json["uncommitted"]
    assert (listed["gpuMinutes"], listed["committedGpuMinutes"], listed["reservedGpuMinutes"]) == (0.0, 60.0, 0.0)
    assert committed_gauge(system) == {NAMESPACE: 60 * 60.0}  # 20 + 40 GPU-minutes, in GPU-seconds
    wide = format_statuses([system.timekeeper.get(f"/api/v1/budgets/{NAMESPACE}").json], wide=True).splitlines()
    assert wide[0].split()[-2:] == ["COMMITTED", "UNCOMMITTED"] and wide[1].split()[-4:] == [
        "safe",
        "demote",
        "60.0",
        "0.0",
    ]
    assert in_budget(system.burst(5, deadline=60)) == []

    # Five pods end: their 10 GPU-minutes are uncommitted again, for five more of the next burst.
    system.ended(admitted[:5])
    assert system.uncommitted_minutes() == 10.0
    assert len(in_budget(system.burst(12, deadline=120))) == 5


def test_sibling_namespaces_bursting_at_once_never_overrun_their_parent(system: System) -> None:
    """Each reservation is weighed against every budget on its path, one at a time: the siblings share the group's
    10."""
    api = system.timekeeper
    assert api.put("/api/v1/budgets/team.vision", json={"gpuMinutes": 10}).status_code == 201
    siblings = ("ml-a", "ml-b", "ml-c", "ml-d")
    for namespace in siblings:
        body = {"gpuMinutes": 100, "parent": "team.vision", "admission": "strict", "onShortfall": "refuse"}
        assert api.put(f"/api/v1/budgets/{namespace}", json=body).status_code == 201
    assert system.cache.refresh()
    results = system.burst(40, deadline=60, namespaces=siblings)  # 10 per namespace, one GPU-minute each
    assert len([r for r in results if r["response"]["allowed"]]) == 10
    refused = next(r for r in results if not r["response"]["allowed"])["response"]["status"]["message"]
    assert "and the budget of team.vision has 0.00 left uncommitted (10.00 remaining, less 0.00 committed by running " \
           "pods' deadlines and 10.00 by pods being admitted)" in refused


def test_a_reservation_no_pod_came_of_lapses(system: System, clock: Clock) -> None:
    """A review that never became a pod (refused after the webhook, or sent by someone else) holds nothing for long."""
    api = system.timekeeper
    assert (
        api.put(
            f"/api/v1/budgets/{NAMESPACE}", json={"gpuMinutes": 3, "admission": "strict", "onShortfall": "refuse"}
        ).status_code
        == 201
    )
    assert system.cache.refresh()
    assert len(in_budget(system.burst(3, deadline=60))) == 3
    assert in_budget(system.burst(1, deadline=60)) == []
    system.elapse(29)
    assert in_budget(system.burst(1, deadline=60)) == []
    system.elapse(2)  # TIMEKEEPER_RESERVATION_SECONDS (30) after them
    assert len(in_budget(system.burst(3, deadline=60))) == 3


def test_a_dry_run_is_weighed_and_holds_nothing(system: System) -> None:
    api = system.timekeeper
    assert (
        api.put(
            f"/api/v1/budgets/{NAMESPACE}", json={"gpuMinutes": 1, "admission": "strict", "onShortfall": "refuse"}
        ).status_code
        == 201
    )
    assert system.cache.refresh()
    client = as_api_server(system.webhook)
    for _ in range(3):
        dry = client.post("/mutate", json=admission_review(system.pod(60), dry_run=True)).get_json()["response"]
        assert dry["allowed"]
    assert system.uncommitted_minutes() == 1.0
    assert (
        client.post("/mutate", json=admission_review(system.pod(61), dry_run=True)).get_json()["response"]["allowed"]
        is False
    )


def test_a_pod_claiming_another_pods_admission_id_is_refused_and_a_forged_one_replaces_nothing(system: System) -> None:
    """Forty pods carrying one id are forty reservations; the id of a pod the timekeeper sees is refused."""
    api = system.timekeeper
    assert (
        api.put(
            f"/api/v1/budgets/{NAMESPACE}", json={"gpuMinutes": 10, "admission": "strict", "onShortfall": "refuse"}
        ).status_code
        == 201
    )
    assert system.cache.refresh()
    forged = {ANNOTATION_ADMISSION_ID: "a" * 16}
    results = system.burst(40, deadline=60, annotations=forged)
    admitted = [r for r in results if r["response"]["allowed"]]
    assert len(admitted) == 10
    ids = {r["pod"]["metadata"]["annotations"][ANNOTATION_ADMISSION_ID] for r in admitted}
    assert len(ids) == 10 and "a" * 16 not in ids
    system.created_in_cluster(admitted)
    api.put(f"/api/v1/budgets/{NAMESPACE}", json={"gpuMinutes": 100, "admission": "strict", "onShortfall": "refuse"})
    stolen = admitted[0]["pod"]
    (copy,) = system.burst(
        1,
        deadline=60,
        annotations={ANNOTATION_ADMISSION_ID: stolen["metadata"]["annotations"][ANNOTATION_ADMISSION_ID]},
    )
    assert copy["response"]["status"] == {
        "code": 403,
        "message": (
            f"the pod carries gpusharing.io/admission-id "
            f"{stolen['metadata']['annotations'][ANNOTATION_ADMISSION_ID]!r}, the "
            f"admission of pod {NAMESPACE}/{stolen['metadata']['name']}: remove the annotation (the GPU-sharing "
            f"webhook sets it)"
        ),
    }


@pytest.mark.parametrize(("failure", "reason"), [
    ("unpublished", "the timekeeper's controller has not published the cluster's pods yet"),
    ("watch failed", "the timekeeper's controller's watch of the cluster's pods has failed for 60 s"),
    ("controller stopped", "the timekeeper's controller last published the cluster's pods 60 s ago"),
])
def test_what_cannot_be_counted_is_refused_under_strict_and_admitted_saying_so_under_safe(
    system: System, failure: str, reason: str
) -> None:
    api = system.timekeeper
    for namespace, mode in (("strict-ns", "strict"), ("safe-ns", "safe")):
        assert api.put(f"/api/v1/budgets/{namespace}", json={"gpuMinutes": 100, "admission": mode}).status_code == 201
    assert system.cache.refresh()
    if failure == "unpublished":  # a database the controller has not published into yet
        with system.publisher.db.write() as conn:
            conn.execute(commitment_publications.delete())
    elif failure == "watch failed":  # the controller publishes, from a watch failing for a minute
        system.healthy = False
        system.elapse(60)
    else:
        system.clock.advance(seconds=60)
    assert api.get("/api/v1/budgets/strict-ns").json["committedGpuMinutes"] is None
    (strict,) = system.burst(1, deadline=60, namespaces=("strict-ns",))
    assert not strict["response"]["allowed"] and reason in strict["response"]["status"]["message"]
    assert (
        "its budget's admission is strict, so no GPU pod is admitted until it can be"
        in strict["response"]["status"]["message"]
    )
    (safe,) = system.burst(1, deadline=60, namespaces=("safe-ns",))
    assert (
        safe["response"]["allowed"]
        and safe["pod"]["metadata"]["annotations"]["gpusharing.io/safe-admission"] == "unchecked"
    )
    assert reason in safe["response"]["warnings"][0]
    system.healthy = True
    system.publish()
    assert system.burst(1, deadline=60, namespaces=("strict-ns",))[0]["response"]["allowed"]


def test_only_the_webhook_reserves(system: System) -> None:
    body = {"id": "x", "namespace": NAMESPACE, "microGpuSeconds": 1}
    assert system.timekeeper.as_(METER).post("/api/v1/reservations", json=body).status_code == 403
    assert system.timekeeper.as_(None).post("/api/v1/reservations", json=body).status_code == 401
    for hostile in ({**body, "id": "a/b"}, {**body, "microGpuSeconds": 0}, {**body, "namespace": "Not_A_Namespace"},
                    {**body, "dryRun": "yes"}, {**body, "extra": 1}):
        assert system.timekeeper.as_(READER).post("/api/v1/reservations", json=hostile).status_code == 400


def test_without_the_controllers_publications_nothing_is_reserved_and_the_webhook_is_told_why(
    make_app: AppFactory,
) -> None:
    api = SpecClient(make_app().test_client(), READER)  # no controller has published the cluster's pods (none runs)
    answer = api.post("/api/v1/reservations", json={"id": "a-review", "namespace": NAMESPACE, "microGpuSeconds": 1})
    assert (answer.status_code, answer.json) == (
        503,
        {"error": "the timekeeper's controller has not published the cluster's pods yet"},
    )
