"""What running pods commit of their budgets (Slurm's GrpTRESRunMins), and what the listing says is left uncommitted."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpusharing.contract import ANNOTATION_ADMISSION_ID, ANNOTATION_GPU_MODEL, ANNOTATION_GPU_SHARE, AdmissionMode, Period
from gpusharing.gpu.catalogue import GpuCatalogue, GpuModel
from timekeeper.budgets.commitments import (
    CommittedPod,
    NamespaceCommitments,
    commitments_by_namespace,
    committed_pod,
    listing_json,
)
from timekeeper.budgets.hierarchy import roll_up
from timekeeper.budgets.periods import period_window
from timekeeper.budgets.status import Budget
from timekeeper.cluster.pods import PodCommitments

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
MINUTE = 60_000_000
CATALOGUE = GpuCatalogue((GpuModel("NVIDIA H100 80GB HBM3", 81559, billing_weight=2500),), GpuModel("default", 81920))


def pod(share: str | None = "0.5", deadline: Any = 1200, phase: str = "Pending", started: str | None = None,
        model: str | None = None, admission_id: str | None = "a" * 16) -> dict[str, Any]:
    annotations = {k: v for k, v in ((ANNOTATION_GPU_SHARE, share), (ANNOTATION_GPU_MODEL, model),
                                     (ANNOTATION_ADMISSION_ID, admission_id)) if v is not None}
    spec: dict[str, Any] = {"containers": []}
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    status: dict[str, Any] = {"phase": phase}
    if started:
        status["startTime"] = started
    return {"metadata": {"namespace": "ml", "name": "p", "uid": "uid-p", "annotations": annotations}, "spec": spec, "status": status}


def test_a_pod_not_started_commits_its_whole_deadline() -> None:
    committed = committed_pod(pod(), CATALOGUE)
    assert committed == CommittedPod("ml", 0.5, 1000, 1200, None, "a" * 16, "p", "uid-p")
    assert committed.committed(NOW) == 10 * MINUTE  # 0.5 GPU x 1200 s


def test_a_running_pod_commits_what_its_deadline_leaves_it_at_its_models_weight() -> None:
    committed = committed_pod(pod(started="2026-11-23T11:50:00Z", model="NVIDIA H100 80GB HBM3"), CATALOGUE)
    assert committed is not None
    assert committed.committed(NOW) == 2.5 * 0.5 * 600 * 1_000_000  # 10 minutes run, 10 left, weight 2.5
    assert committed.committed(NOW + dt.timedelta(hours=1)) == 0  # past its deadline: the kubelet has ended it


def test_pods_that_commit_nothing_are_not_kept() -> None:
    assert committed_pod(pod(deadline=None), CATALOGUE) is None  # no deadline: nothing it can be held to
    assert committed_pod(pod(phase="Succeeded"), CATALOGUE) is None
    assert committed_pod(pod(phase="Failed"), CATALOGUE) is None
    assert committed_pod(pod(share=None), CATALOGUE) is None  # not admitted by the webhook
    for hostile in ("lots", "1e999", "0", "-1"):
        assert committed_pod(pod(share=hostile), CATALOGUE) is None
    for hostile in (0, -1, True, "600"):
        assert committed_pod(pod(deadline=hostile), CATALOGUE) is None


def test_commitments_are_summed_per_namespace() -> None:
    pods = [CommittedPod("ml", 1.0, 1000, 60, None, "b" * 16), CommittedPod("ml", 0.5, 1000, 120, None, None),
            CommittedPod("cv", 2.0, 1000, 30, None, "c" * 16)]
    assert commitments_by_namespace(pods, NOW) == {"ml": NamespaceCommitments(2 * MINUTE), "cv": NamespaceCommitments(MINUTE)}


def listed(used: dict[str, int], committed: dict[str, NamespaceCommitments] | None, reserved: dict[str, int] | None = None,
           **budgets: Budget) -> list[dict[str, Any]]:
    windows = {kind: period_window(kind, NOW) for kind in Period}
    rolled = roll_up(budgets, {ns: {Period.MONTHLY: micro} for ns, micro in used.items()}, {}, windows)
    return listing_json([rolled[name] for name in sorted(rolled)], committed, budgets, reserved or {})


def test_the_listing_says_what_is_left_uncommitted_of_the_tightest_budget_above_a_namespace() -> None:
    items = listed(
        {"ml": 40 * MINUTE, "cv": 50 * MINUTE},
        {"ml": NamespaceCommitments(20 * MINUTE), "cv": NamespaceCommitments(5 * MINUTE)},
        {"cv": 3 * MINUTE},  # a pod of cv being admitted
        ml=Budget("ml", 100.0, Period.MONTHLY, parent="team.a", admission=AdmissionMode.SAFE),
        cv=Budget("cv", 100.0, Period.MONTHLY, parent="team.a"),
        **{"team.a": Budget("team.a", 120.0, Period.MONTHLY)},
    )
    ml = next(item for item in items if item["namespace"] == "ml")
    # Its own budget leaves 100 - 40 - 20 = 40; the team's 120 - 90 - 25 - 3 = 2.
    assert ml["committedGpuMinutes"] == 20.0
    assert ml["uncommitted"] == {"microGpuSeconds": 2 * MINUTE, "gpuMinutes": 2.0, "budget": "team.a",
                                 "remainingGpuMinutes": 30.0, "committedGpuMinutes": 25.0, "reservedGpuMinutes": 3.0}


def test_the_listing_says_when_commitments_are_not_known_and_when_nothing_limits_them() -> None:
    unknown = listed({}, None, ml=Budget("ml", 100.0, Period.MONTHLY, admission=AdmissionMode.SAFE))
    assert (unknown[0]["committedGpuMinutes"], unknown[0]["uncommitted"]) == (None, None)
    unlimited = listed({}, {}, ml=Budget("ml", None, Period.MONTHLY, admission=AdmissionMode.SAFE))
    assert (unlimited[0]["committedGpuMinutes"], unlimited[0]["uncommitted"]) == (0.0, None)


def test_what_is_uncommitted_never_goes_below_zero() -> None:
    items = listed({"ml": 90 * MINUTE}, {"ml": NamespaceCommitments(30 * MINUTE)},
                   ml=Budget("ml", 100.0, Period.MONTHLY, admission=AdmissionMode.SAFE))
    assert items[0]["uncommitted"]["microGpuSeconds"] == 0


class Watch:
    """What PodCommitments reads of its watch (gpusharing.kube.watching.WatchedObjects)."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], CommittedPod] | None = None
        self.broken_since: float | None = None


def test_what_the_pods_commit_is_unknown_until_listed_and_once_the_watch_has_failed_for_long() -> None:
    watch, now = Watch(), [1000.0]
    pods = PodCommitments(watch, lambda: NOW, monotonic=lambda: now[0])  # type: ignore[arg-type]
    assert pods.problem() == "the timekeeper has not yet listed the cluster's pods" and pods.by_namespace() is None
    watch.items = {("ml", "p"): CommittedPod("ml", 1.0, 1000, 60, None, "a" * 16)}
    assert pods.problem() is None and pods.by_namespace() == {"ml": NamespaceCommitments(MINUTE)}
    watch.broken_since = 995.0  # relisting after a failure: what it holds is still good
    assert pods.problem() is None
    now[0] = 1006.0
    assert pods.problem() == "the timekeeper's watch of the cluster's pods has failed for 11 s" and pods.by_namespace() is None
    assert pods.admitted_as("a" * 16) == "ml/p" and pods.admitted_as("b" * 16) is None


def test_the_ids_of_pods_the_watch_brought_are_known_for_a_reservations_lifetime() -> None:
    now = [0.0]
    pods = PodCommitments(Watch(), lambda: NOW, remember_seconds=30, monotonic=lambda: now[0])  # type: ignore[arg-type]
    brought = CommittedPod("ml", 1.0, 1000, 60, None, "a" * 16)
    assert pods.saw(brought) is brought and pods.saw(None) is None
    pods.saw(CommittedPod("ml", 1.0, 1000, 60, None, None))
    now[0] = 9.0
    assert pods.counted_ids() == {"a" * 16} and pods.settled_ids() == frozenset()  # another watch may lag this one
    now[0] = 29.0
    assert pods.counted_ids() == {"a" * 16}  # even if the pod has ended meanwhile: its reservation stays given up
    assert pods.settled_ids() == {"a" * 16}  # and may go: a watch lagging 10 s is stale, and counts nothing
    now[0] = 31.0
    assert pods.counted_ids() == frozenset()  # its reservation has lapsed anyway
