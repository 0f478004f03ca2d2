"""TIMEKEEPER_AUTH=tokenreview against a fake Kubernetes API spoken to by the official client; static token files."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from demo.kubeapi import FakeKube
from gpusharing.settings.env import ConfigError
from tests.timekeeper.conftest import ADMIN, AppFactory, SpecClient
from timekeeper.auth import Caller, Role, load_static_tokens
from timekeeper.cluster.kube import KubeApi


@pytest.fixture
def cluster(make_app: AppFactory, fake_kube: FakeKube) -> tuple[SpecClient, FakeKube]:
    app = make_app(kube=KubeApi(fake_kube.api_client()), auth="tokenreview")
    return SpecClient(app.test_client()), fake_kube


@pytest.mark.parametrize(
    ("auth", "made"), [("tokenreview", {"authentication", "authorization", "core"}), ("static", set())]
)
def test_the_clients_a_review_calls_are_made_with_the_app_never_in_a_request(
    make_app: AppFactory, fake_kube: FakeKube, auth: str, made: set[str]
) -> None:
    """Importing a client's models takes longer than a request waits for its review (TIMEKEEPER_AUTH_WAIT_SECONDS):
    they are made with the app where it reviews tokens, and not at all where it does not."""
    kube = KubeApi(fake_kube.api_client())
    make_app(kube=kube, auth=auth)
    groups = {"core", "authentication", "authorization", "coordination", "custom", "resource", "apps"}
    assert groups & set(vars(kube)) == made


def report_of(pod: dict[str, Any], seq: int, gpu_seconds: float, share: float, **extra: Any) -> dict[str, Any]:
    metadata = pod["metadata"]
    return {"podUid": metadata["uid"], "namespace": metadata["namespace"], "pod": metadata["name"], "gpuShare": share,
            "seq": seq, "gpuSeconds": gpu_seconds, **extra}


def test_a_pod_reports_with_its_own_token_and_is_billed_at_its_annotated_share(
    cluster: tuple[SpecClient, FakeKube],
) -> None:
    api, kube = cluster
    pod = kube.add_pod("team-a", "trainer", share="0.5")
    meter = api.as_(kube.pod_token(pod))
    # The meter claims a tenth of a GPU for 600 s (60 GPU-seconds); the webhook recorded half a GPU: 300 GPU-seconds.
    answer = meter.post("/api/v1/reports", json=report_of(pod, 1, 60, share=0.1))
    assert answer.status_code == 200 and answer.json["chargedGpuSeconds"] == 300.0
    meter.post("/api/v1/reports", json=report_of(pod, 2, 120, share=0.1))
    kube.admins.add("reader@example.com")
    admin = api.as_(kube.user_token("reader@example.com"))
    assert admin.get("/api/v1/budgets/team-a").json["usedGpuMinutes"] == 10.0
    assert admin.get("/api/v1/pods").json["items"][0]["gpuShare"] == 0.5
    # The annotation is read once; the TokenReview answer is reused.
    assert kube.count("GET", "/api/v1/namespaces/team-a/pods/trainer") == 1
    assert kube.count("POST", "/apis/authentication.k8s.io/v1/tokenreviews") == 2


def test_a_report_with_zero_share_but_time_is_refused(cluster: tuple[SpecClient, FakeKube]) -> None:
    api, kube = cluster
    pod = kube.add_pod("team-a", "trainer", share="0.5")
    answer = api.as_(kube.pod_token(pod)).post("/api/v1/reports", json=report_of(pod, 1, 60, share=0))
    assert answer.status_code == 400 and "gpuShare is 0" in answer.json["error"]


def test_a_token_reports_for_its_own_pod_only(
    cluster: tuple[SpecClient, FakeKube], caplog: pytest.LogCaptureFixture
) -> None:
    api, kube = cluster
    mine, other = kube.add_pod("team-a", "mine"), kube.add_pod("team-b", "other")
    with caplog.at_level(logging.WARNING, logger="timekeeper.api"):
        answer = api.as_(kube.pod_token(mine)).post("/api/v1/reports", json=report_of(other, 1, 60, share=0.5))
    assert answer.status_code == 403
    [logged] = [r for r in caplog.records if r.getMessage().startswith("report refused (forbidden)")]
    assert (logged.namespace, logged.pod, logged.decision) == ("team-b", "other", "forbidden")
    assert f"the token belongs to pod {mine['metadata']['uid']} in namespace team-a" in answer.json["error"]
    spoofed = {**report_of(mine, 1, 60, share=0.5), "namespace": "team-b"}
    assert api.as_(kube.pod_token(mine)).post("/api/v1/reports", json=spoofed).status_code == 403


def test_only_pod_tokens_report(cluster: tuple[SpecClient, FakeKube]) -> None:
    api, kube = cluster
    pod = kube.add_pod("team-a", "trainer")
    answer = api.as_(kube.user_token("alice")).post("/api/v1/reports", json=report_of(pod, 1, 60, share=0.5))
    assert answer.status_code == 403 and "not a pod's ServiceAccount token" in answer.json["error"]


def test_a_pod_the_webhook_did_not_annotate_cannot_report(cluster: tuple[SpecClient, FakeKube]) -> None:
    api, kube = cluster
    pod = kube.add_pod("team-a", "sneaky", share=None)
    answer = api.as_(kube.pod_token(pod)).post("/api/v1/reports", json=report_of(pod, 1, 60, share=0.5))
    assert answer.status_code == 403 and "no valid gpusharing.io/gpu-share annotation" in answer.json["error"]


def test_requested_memory_comes_from_the_pod_not_the_report(cluster: tuple[SpecClient, FakeKube]) -> None:
    api, kube = cluster
    pod = kube.add_pod("team-a", "trainer", memory_mib="4096")
    body = report_of(pod, 1, 60, share=0.5, gpuMemoryUsedMiB=6000, gpuMemoryRequestedMiB=80000)
    api.as_(kube.pod_token(pod)).post("/api/v1/reports", json=body)
    kube.admins.add("ops")
    over = api.as_(kube.user_token("ops")).get("/api/v1/pods?overMemory=true").json["items"]
    assert [(p["pod"], p["gpuMemoryRequestedMiB"], p["gpuMemoryOverRequestMiB"]) for p in over] == [
        ("trainer", 4096.0, 1904.0)
    ]


def test_unknown_tokens_are_401(cluster: tuple[SpecClient, FakeKube]) -> None:
    api, _ = cluster
    answer = api.as_("forged").get("/api/v1/budgets")
    assert answer.status_code == 401 and "TokenReview" in answer.json["error"]


def test_budget_writes_need_a_subject_access_review(cluster: tuple[SpecClient, FakeKube]) -> None:
    api, kube = cluster
    kube.admins.add("alice")
    alice, bob = api.as_(kube.user_token("alice", ["ml-admins"])), api.as_(kube.user_token("bob"))
    assert alice.put("/api/v1/budgets/team-a", json={"gpuMinutes": 60}).status_code == 201
    refused = bob.put("/api/v1/budgets/team-a", json={"gpuMinutes": 6000})
    assert refused.status_code == 403
    assert refused.json["error"] == (
        "bob may not change budgets: an admin needs verb 'update' on resource 'budgets' in API group 'gpusharing.io'"
    )
    kube.viewers["bob"] = {"team-a"}
    assert bob.get("/api/v1/budgets/team-a").json["gpuMinutes"] == 60.0  # bob may read team-a (RBAC's view role there)
    assert kube.access_reviews[0]["user"] == "alice" and kube.access_reviews[0]["groups"] == ["ml-admins"]
    assert alice.get("/api/v1/budgets/team-a/changes").json["items"][0]["actor"] == "alice"


def test_reads_are_scoped_to_what_kubernetes_lets_the_caller_read(cluster: tuple[SpecClient, FakeKube]) -> None:
    api, kube = cluster
    kube.admins.add("alice")
    alice = api.as_(kube.user_token("alice"))
    for namespace in ("team-a", "team-b"):
        assert alice.put(f"/api/v1/budgets/{namespace}", json={"gpuMinutes": 60}).status_code == 201
    kube.viewers["bob"] = {"team-a"}
    bob = api.as_(kube.user_token("bob"))
    for path in ("/api/v1/budgets/team-a", "/api/v1/budgets/team-a/changes", "/api/v1/pods?namespace=team-a",
                 "/api/v1/usage?from=2028-02-01&to=2028-03-01&namespace=team-a", "/api/v1/gpu-models"):
        assert bob.get(path).status_code == 200, path
    for path in ("/api/v1/budgets/team-b", "/api/v1/budgets/team-b/changes", "/api/v1/pods?namespace=team-b",
                 "/api/v1/usage?from=2028-02-01&to=2028-03-01&namespace=team-b"):
        refused = bob.get(path)
        assert refused.status_code == 403, path
        assert refused.json["error"] == ("bob may not read the budget of team-b: that needs verb 'get' on resource "
                                         "'gpubudgets' in API group 'gpusharing.io' in namespace team-b")
    # What spans every namespace needs cluster-wide permission: a 403, as `kubectl get -A` answers, never a shorter
    # list.
    for path in (
        "/api/v1/budgets",
        "/api/v1/pods",
        "/api/v1/pods?uid=1f3a",
        "/api/v1/usage?from=2028-02-01&to=2028-03-01",
    ):
        refused = bob.get(path)
        assert refused.status_code == 403 and "verb 'list' on resource 'gpubudgets'" in refused.json["error"]
        assert "in all namespaces" in refused.json["error"]
        assert alice.get(path).status_code == 200
    # a group's: its ClusterGPUBudget
    assert "named team.vision" in bob.get("/api/v1/budgets/team.vision").json["error"]
    # Each answer of the API server is reused for a while.
    asked = len(kube.access_reviews)
    assert bob.get("/api/v1/budgets/team-a").status_code == 200 and len(kube.access_reviews) == asked


def test_a_meters_token_reads_nothing(cluster: tuple[SpecClient, FakeKube]) -> None:
    api, kube = cluster
    pod = kube.add_pod("team-a", "trainer")
    kube.admins.add("system:serviceaccount:team-a:default")  # even a pod of an all-powerful ServiceAccount
    meter = api.as_(kube.pod_token(pod))
    for path in ("/api/v1/budgets", "/api/v1/budgets/team-a", "/api/v1/pods?namespace=team-a", "/api/v1/gpu-models"):
        refused = meter.get(path)
        assert refused.status_code == 403 and "is a meter's token (bound to a pod)" in refused.json["error"], path


def test_a_static_admin_token_works_beside_tokenreview(cluster: tuple[SpecClient, FakeKube]) -> None:
    api, kube = cluster
    assert api.as_(ADMIN).put("/api/v1/budgets/team-a", json={"gpuMinutes": 60}).status_code == 201
    assert kube.count("POST", "/apis/authentication.k8s.io/v1/tokenreviews") == 0


def test_an_unreachable_api_server_is_503_not_a_refusal(cluster: tuple[SpecClient, FakeKube]) -> None:
    api, kube = cluster
    token = kube.user_token("alice")
    kube.up = False
    answer = api.as_(token).get("/api/v1/budgets")
    assert answer.status_code == 503 and "the Kubernetes API is unavailable" in answer.json["error"]


def test_a_slow_api_server_holds_no_report_hostage(make_app: AppFactory, fake_kube: FakeKube) -> None:
    api = SpecClient(
        make_app(kube=KubeApi(fake_kube.api_client()), auth="tokenreview", auth_wait_seconds=0.2).test_client()
    )
    pod = fake_kube.add_pod("team-a", "trainer", share="0.5")
    token = fake_kube.pod_token(pod)
    fake_kube.delay_seconds = 1.0  # five times what a report waits
    late = api.as_(token).post("/api/v1/reports", json=report_of(pod, 1, 10, 0.5))
    assert late.status_code == 503  # the meter tries again
    assert "the Kubernetes API has not answered the TokenReview within 0.2 s" in late.json["error"]
    fake_kube.delay_seconds = 0.0
    deadline = time.monotonic() + 30  # stops a broken test from hanging; not a speed check
    while (answer := api.as_(token).post("/api/v1/reports", json=report_of(pod, 2, 10, 0.5))).status_code == 503:
        assert time.monotonic() < deadline, answer.json
        time.sleep(0.1)
    assert answer.status_code == 200, answer.json
    assert fake_kube.count("POST", "/apis/authentication.k8s.io/v1/tokenreviews") == 1  # the late answer was kept


def test_auth_none_lets_anyone_in_and_says_so_loudly(make_app: AppFactory, caplog: pytest.LogCaptureFixture) -> None:
    api = SpecClient(make_app(auth="none").test_client())
    assert api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1}).status_code == 201
    assert "ANYONE who can reach this timekeeper can change budgets" in caplog.text


def test_tokenreview_without_a_kubernetes_api_stops_at_start(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="in-cluster ServiceAccount"):
        make_app(auth="tokenreview")


def test_a_kubeconfig_points_the_timekeeper_at_an_api_server(
    make_app: AppFactory, fake_kube: FakeKube, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(fake_kube.kubeconfig())
    fake_kube.admins.add("alice")
    api = SpecClient(
        make_app(auth="tokenreview", kubeconfig=str(kubeconfig)).test_client(), fake_kube.user_token("alice")
    )
    assert api.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1}).status_code == 201


def test_static_token_files(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(
        "# comment\n\nt1 admin alice\nt2 reader   # the dashboard\nt3 meter\n"
        "t4 meter fleet-a namespaces=team-a,team-b\nt5 meter namespaces=team-c\n"
    )
    tokens = load_static_tokens(str(path))
    assert [tokens.caller(t) for t in ("t1", "t2", "t3", "t4", "t5", "t6", "t", "t1 ")] == [
        Caller("alice", Role.ADMIN),
        Caller("static-reader-line-4", Role.READER),
        Caller("static-meter-line-5", Role.METER),
        Caller("fleet-a", Role.METER, namespaces=frozenset({"team-a", "team-b"})),
        Caller("static-meter-line-7", Role.METER, namespaces=frozenset({"team-c"})),
        None, None, None,
    ]
    for content, message in (
        ("t1 admin\nt2 superuser\n", r"line 2: expected `TOKEN ROLE \[NAME\] \[namespaces=NS,...\]`"),
        ("t1 reader namespaces=team-a\n", "line 1: only a meter token is bound to namespaces"),
        ("t1 meter namespaces=\n", "line 1: namespaces= names no namespace"),
        ("t1 meter namespaces=Team_A\n", "line 1: namespace 'Team_A' is not a namespace name"),
    ):
        path.write_text(content)
        with pytest.raises(ConfigError, match=message):
            load_static_tokens(str(path))
    with pytest.raises(ConfigError, match="cannot read it"):
        load_static_tokens(str(tmp_path / "missing"))


def test_a_meter_token_bound_to_namespaces_reports_for_those_only(make_app: AppFactory, tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{ADMIN} admin alice\nbound meter fleet-a namespaces=team-a,team-b\n")
    api = SpecClient(make_app(static_tokens_file=str(path)).test_client(), "bound")
    pod = {"metadata": {"uid": "uid-1", "namespace": "team-a", "name": "trainer"}}
    assert api.post("/api/v1/reports", json=report_of(pod, 1, 60, share=0.5)).status_code == 200
    elsewhere = {"metadata": {"uid": "uid-2", "namespace": "team-c", "name": "victim"}}
    refused = api.post("/api/v1/reports", json=report_of(elsewhere, 1, 60, share=0.5, final=True))
    assert refused.status_code == 403
    assert refused.json["error"] == "fleet-a may report for namespace(s) team-a, team-b only, not team-c"
    assert api.as_(ADMIN).get("/api/v1/budgets/team-c").json["usedGpuMinutes"] == 0.0
    assert api.get("/api/v1/budgets").status_code == 403  # a meter reads nothing


@pytest.mark.parametrize("share", ["1e999999", "0", "1001", "NaN", "-1", "0.00001", "9" * 5000])
def test_a_pod_whose_share_annotation_is_out_of_bounds_cannot_report(
    cluster: tuple[SpecClient, FakeKube], share: str
) -> None:
    api, kube = cluster
    pod = kube.add_pod("team-a", "odd", share=share)
    answer = api.as_(kube.pod_token(pod)).post("/api/v1/reports", json=report_of(pod, 1, 60, share=0.5))
    assert (
        answer.status_code == 403
        and "no valid gpusharing.io/gpu-share annotation (a share from 0.0001 to 1000)" in answer.json["error"]
    )
