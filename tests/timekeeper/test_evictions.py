"""The controller's one eviction path, on SQLite and PostgreSQL against the HTTP fake of the API: it waits for every
live webhook process to hold a listing read after the moment given, claims each pod under the leader's term, asks
the Eviction API (PodDisruptionBudgets honoured), and gives back what did not happen."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from demo.kubeapi import FakeKube
from tests.timekeeper.conftest import Clock
from timekeeper.cluster.evictions import EvictionPath, LeaseLost, PodRef
from timekeeper.cluster.fencing import EvictionFence
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.leader import LEASE_NAME, LeaderElection
from timekeeper.cluster.webhooks import WebhookListings
from timekeeper.database.connection import Database
from timekeeper.database.tables import webhook_listings

FENCE = f"gpusharing-system/{LEASE_NAME}"


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    yield database
    database.dispose()


@pytest.fixture
def path(db: Database, fake_kube: FakeKube, clock: Clock) -> EvictionPath:
    """The leader's path: it holds the Lease (term 0) and has recorded its term."""
    kube = KubeApi(fake_kube.api_client())
    election = LeaderElection(kube, "gpusharing-system", "first", 30, monotonic=clock.monotonic)
    assert election.try_acquire_or_renew()
    fence = EvictionFence(db, FENCE)
    assert fence.enter(election.term, election.identity)
    return EvictionPath(kube, election, fence, WebhookListings(db))


def running(fake: FakeKube, name: str) -> PodRef:
    pod = fake.add_pod("ml", name)
    return PodRef("ml", name, pod["metadata"]["uid"])


def test_evictions_wait_for_every_live_webhook_to_hold_a_listing_read_after_the_moment_given(
    path: EvictionPath, fake_kube: FakeKube,
) -> None:
    pod = running(fake_kube, "trainer")
    webhooks = path.webhooks
    old = webhooks.poll("replica-1", "0", "60")  # holds a listing from before
    since = webhooks.now()  # the moment the state to hold came to be
    done = path.evict("a test", [pod], since)
    assert done.waiting == 1 and done.evicted == [] and fake_kube.evicted == []
    listed = webhooks.poll("replica-1", str(old), "60")  # reads the listing with the state; still holds the old one
    assert path.evict("a test", [pod], since).waiting == 1
    webhooks.poll("replica-1", str(listed), "60")  # now holds it
    done = path.evict("a test", [pod], since)
    assert done.waiting == 0 and done.evicted == [pod] and fake_kube.evicted == [("ml", "trainer")]


def test_a_webhook_that_stopped_polling_holds_nothing_back(path: EvictionPath, fake_kube: FakeKube, db: Database) -> None:
    pod = running(fake_kube, "trainer")
    path.webhooks.poll("gone-replica", "0", "0.1")  # live for three polls of 0.1 s and 5 s of slack, by the database's clock
    with db.write() as conn:  # its last poll long ago (the database's clock cannot be moved: aged through the table)
        conn.execute(webhook_listings.update().values(expires_at=webhook_listings.c.expires_at - 60))
    assert path.evict("a test", [pod], path.webhooks.now()).evicted == [pod]


def test_a_pod_is_claimed_once_and_never_evicted_twice(path: EvictionPath, fake_kube: FakeKube) -> None:
    pod = running(fake_kube, "trainer")
    assert path.evict("a test", [pod], 0.0).evicted == [pod]
    fake_kube.add_pod("ml", "trainer")["metadata"]["uid"] = pod.uid  # still there, as a stale cache shows it
    again = path.evict("a test", [pod], 0.0)
    assert again.evicted == [] and again.refused == [] and fake_kube.evicted == [("ml", "trainer")]
    assert fake_kube.count("POST", "/api/v1/namespaces/ml/pods/trainer/eviction") == 1


def test_a_disruption_budgets_refusal_gives_the_claim_back_for_a_later_try(path: EvictionPath, fake_kube: FakeKube) -> None:
    pod, other = running(fake_kube, "guarded"), running(fake_kube, "free")
    fake_kube.refuse_evictions.add(("ml", "guarded"))
    done = path.evict("a test", [pod, other], 0.0)
    assert done.refused == [pod] and done.evicted == [other] and ("ml", "guarded") in fake_kube.pods
    assert path.evict("a test", [pod], 0.0).refused == [pod]  # claimed again: the refusal gave it back
    fake_kube.refuse_evictions.clear()
    assert path.evict("a test", [pod], 0.0).evicted == [pod]
    assert fake_kube.count("DELETE", "/api/v1") == 0  # never deleted, only evicted


def test_a_later_term_refuses_a_deposed_leaders_claims(path: EvictionPath, fake_kube: FakeKube, db: Database) -> None:
    pod = running(fake_kube, "trainer")
    # Another process took the Lease (term 1) and recorded its term, while this one still believes it leads.
    assert EvictionFence(db, FENCE).enter(path.election.term + 1, "second")
    assert path.election.remaining_seconds() > 0
    with pytest.raises(LeaseLost):
        path.evict("a test", [pod], 0.0)
    assert fake_kube.evicted == [] and ("ml", "trainer") in fake_kube.pods


def test_a_pod_gone_already_is_done_with_not_tried_again(path: EvictionPath, fake_kube: FakeKube) -> None:
    pod = running(fake_kube, "trainer")
    del fake_kube.pods["ml", "trainer"]  # deleted meanwhile (its cache entry not yet)
    done = path.evict("a test", [pod], 0.0)
    assert done.gone == [pod] and done.evicted == [] and done.refused == []
    assert path.evict("a test", [pod], 0.0).gone == []  # its claim stands: not asked again
    assert fake_kube.evicted == []


def test_a_lost_lease_stops_the_evictions_before_any_is_claimed_or_asked(
    path: EvictionPath, fake_kube: FakeKube, clock: Clock,
) -> None:
    pod = running(fake_kube, "trainer")
    clock.advance(seconds=31)  # the Lease ran out unrenewed (the process was paused), and the API is away
    fake_kube.up = False
    with pytest.raises(LeaseLost):
        path.evict("a test", [pod], 0.0)
    fake_kube.up = True
    assert path.election.try_acquire_or_renew()  # leads again (its own Lease, unchanged meanwhile), same term
    assert path.evict("a test", [pod], 0.0).evicted == [pod]
