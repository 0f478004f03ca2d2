"""What running pods commit of their budgets (Slurm's GrpTRESRunMins), and what the listing says is left uncommitted."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, select

from gpusharing.contract import (
    ANNOTATION_ADMISSION_ID,
    ANNOTATION_GPU_MODEL,
    ANNOTATION_GPU_SHARE,
    AdmissionMode,
    Period,
)
from gpusharing.gpu.catalogue import GpuCatalogue, GpuModel
from tests.timekeeper.conftest import Clock
from timekeeper.budgets.commitments import (
    CommittedPod,
    NamespaceCommitments,
    commitments_by_namespace,
    committed_pod,
    listed_commitments,
)
from timekeeper.budgets.hierarchy import roll_up
from timekeeper.budgets.periods import period_window
from timekeeper.budgets.status import Budget
from timekeeper.database.cluster.commitments import (
    NOT_PUBLISHED,
    TAKEOVER_AFTER_SECONDS,
    CommitmentPublisher,
    PublishedCommitments,
    by_uid,
)
from timekeeper.database.connection import Database
from timekeeper.database.tables import commitment_publications, committed_pods

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
    return {
        "metadata": {"namespace": "ml", "name": "p", "uid": "uid-p", "annotations": annotations},
        "spec": spec,
        "status": status,
    }


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
    assert commitments_by_namespace(pods, NOW) == {
        "ml": NamespaceCommitments(2 * MINUTE),
        "cv": NamespaceCommitments(MINUTE),
    }


def listed(
    used: dict[str, int],
    committed: dict[str, NamespaceCommitments] | None,
    reserved: dict[str, int] | None = None,
    **budgets: Budget,
) -> list[dict[str, Any]]:
    windows = {kind: period_window(kind, NOW) for kind in Period}
    rolled = roll_up(budgets, {ns: {Period.MONTHLY: micro} for ns, micro in used.items()}, {}, windows)
    statuses = [rolled[name] for name in sorted(rolled)]
    counted = listed_commitments(statuses, committed, budgets, reserved or {})
    return [status.listed(counted[status.namespace].committed_gpu_minutes,
                          counted[status.namespace].uncommitted).to_json() for status in statuses]


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


# The controller publishes the committed pods in the database; the web replicas read them there
# (timekeeper.database.cluster.commitments).

@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    yield database
    database.dispose()


def committed(name: str, admission_id: str | None = None, started_at: dt.datetime | None = None, deadline: int = 60,
              namespace: str = "ml") -> CommittedPod:
    return CommittedPod(namespace, 1.0, 1000, deadline, started_at, admission_id, name, f"uid-{name}")


def rows(db: Database) -> dict[str, tuple[str, dt.datetime, dt.datetime | None]]:
    """The published pods: uid -> (name, seen_at, gone_at)."""
    with db.read() as conn:
        return {row.uid: (row.name, row.seen_at, row.gone_at) for row in conn.execute(select(committed_pods))}


def publisher_of(db: Database) -> str:
    with db.read() as conn:
        return str(conn.execute(select(commitment_publications.c.publisher)).scalar_one())


class Writes:
    """The statements that wrote committed_pods, as the database received them (a statement of many rows is one)."""

    def __init__(self, db: Database):
        self.seen: list[str] = []
        event.listen(db.engine, "before_cursor_execute", self._statement)

    def _statement(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        written = re.match(r"\s*(INSERT INTO|UPDATE|DELETE FROM)\s+(\w+)", statement, re.IGNORECASE)
        if written and written.group(2) == "committed_pods":
            self.seen.append(written.group(1).split()[0].upper())

    def taken(self) -> list[str]:
        seen, self.seen = self.seen, []
        return seen


def test_what_the_pods_commit_is_unknown_until_published_and_once_the_publications_go_stale(
    db: Database, clock: Clock
) -> None:
    publisher, reader = CommitmentPublisher(db, clock), PublishedCommitments(db, clock, remember_seconds=30)
    assert reader.problem() == NOT_PUBLISHED and reader.by_namespace() is None
    publisher.publish({}, healthy=False)  # the controller's informer has not listed the pods yet
    assert reader.problem() == NOT_PUBLISHED
    publisher.publish(by_uid([committed("p", "a" * 16)]), healthy=True)
    assert reader.problem() is None and reader.by_namespace() == {"ml": NamespaceCommitments(MINUTE)}
    clock.advance(seconds=5)
    publisher.publish({}, healthy=False)  # relisting after a failure: what was published is still good
    assert reader.problem() is None and reader.by_namespace() == {"ml": NamespaceCommitments(MINUTE)}
    clock.advance(seconds=6)
    publisher.publish({}, healthy=False)
    assert reader.problem() == "the timekeeper's controller's watch of the cluster's pods has failed for 11 s"
    assert reader.by_namespace() is None
    publisher.publish(by_uid([committed("p", "a" * 16)]), healthy=True)
    assert reader.problem() is None
    clock.advance(seconds=11)  # the controller stopped publishing (stopped, or its Lease not yet taken over)
    assert reader.problem() == "the timekeeper's controller last published the cluster's pods 11 s ago"
    assert reader.by_namespace() is None
    assert reader.admitted_as("a" * 16) == "ml/p" and reader.admitted_as("b" * 16) is None


def test_the_ids_of_published_pods_are_known_for_a_reservations_lifetime(db: Database, clock: Clock) -> None:
    publisher, reader = CommitmentPublisher(db, clock), PublishedCommitments(db, clock, remember_seconds=30)
    publisher.publish(by_uid([committed("p", "a" * 16), committed("q")]), healthy=True)
    clock.advance(seconds=1)
    publisher.publish(by_uid([committed("q")]), healthy=True)  # p ended
    clock.advance(seconds=8)
    published = reader.read()
    assert published.counted_ids() == {"a" * 16} and published.settled_ids() == frozenset()  # a reader may lag this one
    assert published.admitted_as("a" * 16) is None  # p is no longer there
    clock.advance(seconds=20)
    assert reader.counted_ids() == {"a" * 16}  # even though the pod has ended: its reservation stays given up
    assert reader.settled_ids() == {"a" * 16}  # and may go: every reader has had the pod for 10 s
    clock.advance(seconds=2.5)
    # its reservation has lapsed anyway
    assert reader.counted_ids() == frozenset() and reader.settled_ids() == frozenset()


def test_a_pod_still_published_is_counted_and_settles_once_unchanged_for_a_while(db: Database, clock: Clock) -> None:
    publisher, reader = CommitmentPublisher(db, clock), PublishedCommitments(db, clock, remember_seconds=30)
    publisher.publish(by_uid([committed("p", "a" * 16)]), healthy=True)
    clock.advance(seconds=9)
    started = committed("p", "a" * 16, started_at=clock())  # the pod started: published again, as it is now
    publisher.publish(by_uid([started]), healthy=True)
    clock.advance(seconds=9)
    assert reader.counted_ids() == {"a" * 16} and reader.settled_ids() == frozenset()
    clock.advance(seconds=1)
    assert reader.settled_ids() == {"a" * 16}
    clock.advance(seconds=60)
    publisher.publish(by_uid([started]), healthy=True)
    assert reader.counted_ids() == {"a" * 16}  # published still: its own commitment counts
    assert reader.settled_ids() == frozenset()  # any reservation of its id lapsed long ago
    assert reader.read().pods == (started,)  # as the controller handed it, started_at and all
    assert reader.by_namespace() == {"ml": NamespaceCommitments(0)}  # its deadline of 60 s has passed


def test_the_publisher_writes_only_what_changed(db: Database, clock: Clock) -> None:
    publisher, writes = CommitmentPublisher(db, clock), Writes(db)
    p, q, r = committed("p", "a" * 16), committed("q", "b" * 16), committed("r")
    publisher.publish(by_uid([p, q]), healthy=True)
    assert writes.taken() == ["INSERT"]  # both pods, in one statement
    first = rows(db)
    assert set(first) == {"uid-p", "uid-q"}
    clock.advance(seconds=1)
    publisher.publish(by_uid([p, q]), healthy=True)
    assert writes.taken() == [] and rows(db) == first  # nothing changed: the heartbeat alone
    clock.advance(seconds=1)
    moved = committed("q", "b" * 16, started_at=clock())
    publisher.publish(by_uid([p, moved, r]), healthy=True)
    assert writes.taken() == ["INSERT"]  # q changed, r is new: one upsert
    now = rows(db)
    assert (
        now["uid-p"] == first["uid-p"] and now["uid-q"] == ("q", clock(), None) and now["uid-r"] == ("r", clock(), None)
    )
    clock.advance(seconds=1)
    publisher.publish(by_uid([p, moved]), healthy=True)
    assert writes.taken() == ["UPDATE"] and rows(db)["uid-r"][2] == clock()  # r marked gone, not forgotten yet
    clock.advance(seconds=1)
    publisher.publish(by_uid([p, moved, r]), healthy=True)  # back (only a lagging watch would say so): published again
    assert writes.taken() == ["INSERT"] and rows(db)["uid-r"] == ("r", clock(), None)
    publisher.publish({}, healthy=False)  # an unhealthy watch leaves what was published as it is
    assert writes.taken() == [] and set(rows(db)) == {"uid-p", "uid-q", "uid-r"}
    publisher.publish({}, healthy=True)
    assert writes.taken() == ["UPDATE"] and all(gone == clock() for _, _, gone in rows(db).values())
    clock.advance(seconds=publisher.keep_seconds + 1)
    publisher.publish({}, healthy=True)
    assert writes.taken() == ["DELETE"] and rows(db) == {}  # gone long enough: forgotten
    publisher.publish({}, healthy=True)
    assert writes.taken() == []


def test_a_restarted_publisher_reconciles_with_the_table(db: Database, clock: Clock) -> None:
    p, q, r = committed("p", "a" * 16), committed("q"), committed("r")
    CommitmentPublisher(db, clock, identity="before").publish(by_uid([p, q]), healthy=True)
    written = rows(db)
    clock.advance(seconds=TAKEOVER_AFTER_SECONDS)  # the process restarted (or another leader took over)
    after = CommitmentPublisher(db, clock, identity="after")
    after.publish(by_uid([q, r]), healthy=True)
    now = rows(db)
    assert now["uid-p"] == ("p", written["uid-p"][1], clock())  # written before, gone since: marked so
    assert now["uid-q"] == written["uid-q"]  # unchanged: not written again
    assert now["uid-r"] == ("r", clock(), None)
    assert publisher_of(db) == "after"
    assert PublishedCommitments(db, clock).read().pods == (q, r)


def test_a_deposed_leader_publishing_once_more_changes_nothing(db: Database, clock: Clock) -> None:
    p, q, r = committed("p", "a" * 16), committed("q"), committed("r")
    first, second, reader = (
        CommitmentPublisher(db, clock, "first"),
        CommitmentPublisher(db, clock, "second"),
        PublishedCommitments(db, clock),
    )
    first.publish(by_uid([p, q]), healthy=True)
    clock.advance(seconds=1)
    second.publish(by_uid([r]), healthy=True)  # a new leader while the first still publishes: it waits
    assert publisher_of(db) == "first" and reader.read().pods == (p, q)
    clock.advance(seconds=TAKEOVER_AFTER_SECONDS)  # the first lost its Lease and stopped
    second.publish(by_uid([q, r]), healthy=True)
    assert publisher_of(db) == "second" and reader.read().pods == (q, r)
    clock.advance(seconds=1)
    first.publish(by_uid([p, q]), healthy=True)  # paused past its Lease, it still believes it leads: refused
    assert publisher_of(db) == "second" and reader.read().pods == (q, r)
    second.publish(by_uid([q, r]), healthy=True)
    assert reader.read().pods == (q, r)
    clock.advance(seconds=TAKEOVER_AFTER_SECONDS)  # the second stopped; the first leads again, from the table
    first.publish(by_uid([p]), healthy=True)
    assert publisher_of(db) == "first" and reader.read().pods == (p,)
    assert {uid for uid, (_, _, gone) in rows(db).items() if gone is not None} == {"uid-q", "uid-r"}


def test_a_new_leader_not_yet_listed_keeps_what_its_predecessor_confirmed_until_it_goes_stale(
    db: Database, clock: Clock
) -> None:
    p = committed("p", "a" * 16)
    reader = PublishedCommitments(db, clock)
    CommitmentPublisher(db, clock, "first").publish(by_uid([p]), healthy=True)
    clock.advance(seconds=TAKEOVER_AFTER_SECONDS)
    successor = CommitmentPublisher(db, clock, "second")
    successor.publish({}, healthy=False)  # its informer has not listed the pods yet
    assert reader.read().pods == (p,) and reader.problem() is None
    clock.advance(seconds=8)
    successor.publish({}, healthy=False)
    assert reader.problem() == "the timekeeper's controller's watch of the cluster's pods has failed for 11 s"
    successor.publish(by_uid([]), healthy=True)
    assert reader.problem() is None and reader.by_namespace() == {} and reader.counted_ids() == {"a" * 16}
