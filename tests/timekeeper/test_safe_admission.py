"""Safe admission end to end on each database: the timekeeper publishes what every namespace has left uncommitted,
the webhook (the real app, polling the real timekeeper over HTTP) reserves against it, and concurrent bursts of
pods never commit more than it. The cluster's pods are the one part played here: the pods the webhook admitted
are handed to the timekeeper's pod index as its watch would deliver them."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from prometheus_client import REGISTRY

from admin.commands import format_statuses
from demo.apiserver import admission_review, api_server_pod
from gpusharing.contract import ANNOTATION_ADMISSION_ID
from gpusharing.gpu.dra import no_claims
from tests.timekeeper.conftest import ADMIN, METER, READER, AppFactory, SpecClient, served
from tests.webhook.test_admission import patch_of
from timekeeper.budgets.commitments import CommittedPod, committed_pod
from timekeeper.cluster.pods import PodCommitments
from timekeeper.metrics import LedgerCollector
from webhook.app import create_app as create_webhook
from webhook.caches.budgets import BudgetStateCache
from webhook.caches.jobs import no_jobs
from webhook.caches.reservations import Reservations
from webhook.config import WebhookConfig

NAMESPACE = "ml"
OVER_BUDGET_CLASS = WebhookConfig().priority_class_over_budget


class PodIndex:
    """The timekeeper's pods, as its watch would keep them (`items` of gpusharing.kube.watching.WatchedObjects)."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], CommittedPod] = {}

    def stop(self) -> None:
        pass


class System:
    def __init__(self, timekeeper: SpecClient, pods: PodIndex, webhook: Any, cache: BudgetStateCache, metrics: LedgerCollector):
        self.timekeeper, self.pods, self.webhook, self.cache, self.metrics = timekeeper, pods, webhook, cache, metrics
        self.created = 0

    def burst(self, count: int, deadline: int) -> list[dict[str, Any]]:
        """`count` pods of one GPU each, sent to /mutate at once; the pods as stored, with the responses."""
        start = threading.Barrier(count)
        answers: list[tuple[dict[str, Any], dict[str, Any]]] = []
        lock = threading.Lock()

        def one(pod: dict[str, Any]) -> None:
            client = self.webhook.test_client()
            start.wait()
            response = client.post("/mutate", json=admission_review(pod)).get_json()["response"]
            with lock:
                answers.append((pod, response))

        threads = [threading.Thread(target=one, args=(self.pod(deadline),)) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return [{"response": r, "pod": jsonpatch.apply_patch(p, patch_of(r)) if r["allowed"] else None} for p, r in answers]

    def pod(self, deadline: int) -> dict[str, Any]:
        self.created += 1
        return api_server_pod({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"train-{self.created}"},
            "spec": {"activeDeadlineSeconds": deadline,
                     "containers": [{"name": "train", "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
        }, NAMESPACE)

    def created_in_cluster(self, admitted: list[dict[str, Any]]) -> None:
        for result in admitted:
            pod = result["pod"]
            committed = committed_pod(pod, WebhookConfig().gpu_request.catalogue)
            assert committed is not None
            self.pods.items[(NAMESPACE, pod["metadata"]["name"])] = committed

    def uncommitted_minutes(self) -> float:
        return self.timekeeper.get(f"/api/v1/budgets/{NAMESPACE}").json["uncommitted"]["gpuMinutes"]


def verdicts(verdict: str) -> float:
    return REGISTRY.get_sample_value("gpusharing_webhook_safe_admissions_total", {"verdict": verdict}) or 0.0


def committed_gauge(system: System) -> dict[str, float]:
    (family,) = [f for f in system.metrics.collect() if f.name == "gpusharing_timekeeper_committed_gpu_seconds"]
    return {sample.labels["namespace"]: sample.value for sample in family.samples}


def in_budget(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in results if r["response"]["allowed"] and r["pod"]["spec"].get("priorityClassName") != OVER_BUDGET_CLASS]


@pytest.fixture
def system(make_app: AppFactory, tmp_path: Path) -> Iterator[System]:
    pods = PodIndex()
    commitments = PodCommitments(pods, lambda: dt.datetime.now(dt.timezone.utc))  # type: ignore[arg-type]
    app = make_app(commitments=commitments)
    timekeeper = SpecClient(app.test_client(), ADMIN)
    token = tmp_path / "token"
    token.write_text(READER)
    with served(app) as url:
        cache = BudgetStateCache(url, str(token), reservations=Reservations())
        webhook = create_webhook(WebhookConfig(timekeeper_url=url), cache, no_claims, no_jobs)
        yield System(timekeeper, pods, webhook, cache, LedgerCollector(app.extensions["ledger"], commitments))


def test_bursts_of_pods_never_commit_more_than_is_left_uncommitted(system: System) -> None:
    api = system.timekeeper
    assert api.put(f"/api/v1/budgets/{NAMESPACE}", json={"gpuMinutes": 70, "admission": "safe"}).status_code == 201
    # 10 GPU-minutes used, and a pod committing 20 more: 40 left uncommitted.
    report = {"podUid": "used-1", "namespace": NAMESPACE, "pod": "done", "gpuShare": 1, "seq": 1, "gpuSeconds": 600, "final": True}
    assert api.as_(METER).post("/api/v1/reports", json=report).status_code == 200
    system.pods.items[(NAMESPACE, "running")] = CommittedPod(NAMESPACE, 0.5, 1000, 2400, None, None)
    assert system.uncommitted_minutes() == 40.0
    assert system.cache.refresh()

    reserved, demoted_before = verdicts("reserved"), verdicts("demoted")
    first = system.burst(40, deadline=120)  # each commits 2 GPU-minutes
    admitted = in_budget(first)
    assert len(admitted) == 20 and all(r["response"]["allowed"] for r in first)
    assert (verdicts("reserved") - reserved, verdicts("demoted") - demoted_before) == (20, 20)
    demoted = [r for r in first if r not in admitted]
    assert all(ANNOTATION_ADMISSION_ID not in r["pod"]["metadata"]["annotations"] for r in demoted)
    assert "cannot cover this pod's deadline: the pod commits 2.00 GPU-minutes (1 GPU x weight 1 x 120 s), and its " \
           "budget has 0.00 left uncommitted (60.00 remaining, less 20.00 committed by running pods' deadlines and 40.00 " \
           "by pods just admitted or held for other webhook processes)" in demoted[0]["response"]["warnings"][0]

    # Until the timekeeper has seen the pods, the webhook holds their reservations across refreshes.
    assert system.cache.refresh() and system.cache.reservations.held(NAMESPACE) == 40 * 60_000_000
    assert in_budget(system.burst(5, deadline=60)) == []
    # Once it has, the listing counts them and the webhook gives its reservations up: still nothing is left.
    system.created_in_cluster(admitted)
    assert system.uncommitted_minutes() == 0.0
    assert committed_gauge(system) == {NAMESPACE: 60 * 60.0}  # 20 + 40 GPU-minutes, in GPU-seconds
    wide = format_statuses([system.timekeeper.get(f"/api/v1/budgets/{NAMESPACE}").json], wide=True).splitlines()
    assert wide[0].split()[-2:] == ["COMMITTED", "UNCOMMITTED"] and wide[1].split()[-4:] == ["safe", "demote", "60.0", "0.0"]
    assert system.cache.refresh() and system.cache.reservations.held(NAMESPACE) == 0
    assert in_budget(system.burst(5, deadline=60)) == []

    # Five pods end: their 10 GPU-minutes are uncommitted again, for five more of the next burst.
    for result in admitted[:5]:
        del system.pods.items[(NAMESPACE, result["pod"]["metadata"]["name"])]
    assert system.uncommitted_minutes() == 10.0
    assert system.cache.refresh()
    assert len(in_budget(system.burst(12, deadline=120))) == 5


def test_a_budget_that_refuses_on_shortfall_refuses_with_the_numbers(system: System) -> None:
    api = system.timekeeper
    assert api.put(f"/api/v1/budgets/{NAMESPACE}", json={"gpuMinutes": 3, "admission": "strict", "onShortfall": "refuse"}).status_code == 201
    assert system.cache.refresh()
    assert len(in_budget(system.burst(3, deadline=60))) == 3  # 3 x 1 GPU-minute: exactly the budget
    [extra] = system.burst(1, deadline=60)
    assert not extra["response"]["allowed"]
    assert extra["response"]["status"] == {"code": 403, "message": (
        "namespace 'ml' cannot cover this pod's deadline: the pod commits 1.00 GPU-minutes (1 GPU x weight 1 x 60 s), and "
        "its budget has 0.00 left uncommitted (3.00 remaining, less 0.00 committed by running pods' deadlines and 3.00 by "
        "pods just admitted or held for other webhook processes)")}
    [no_deadline] = system.burst(1, deadline=0)  # 0 is not a deadline: strict refuses
    assert "admits only GPU pods with a deadline" in no_deadline["response"]["status"]["message"]
