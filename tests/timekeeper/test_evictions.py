"""The controller's one eviction path, on SQLite and PostgreSQL against the HTTP fake of the API: it waits for every
live webhook process to hold a listing read after the moment given, claims each pod under the leader's term, asks
the Eviction API a bounded number at a time (PodDisruptionBudgets' 429s asked again for their time, the others going
on meanwhile), and gives back what did not happen."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from sqlalchemy import select, update

from demo.kubeapi import FakeDisruptionBudget, FakeKube
from tests.timekeeper.conftest import Clock
from timekeeper.cluster.evictions import CLAIM_BATCH, EvictionPath, Evictions, LeaseLost, PodRef
from timekeeper.cluster.kube import KubeApi
from timekeeper.cluster.leader import LEASE_NAME, LeaderElection
from timekeeper.database.cluster.fencing import STALE_CLAIM_SECONDS, EvictionFence
from timekeeper.database.cluster.listings import WebhookListings
from timekeeper.database.connection import Database
from timekeeper.database.tables import eviction_claims, webhook_listings

FENCE = f"gpusharing-system/{LEASE_NAME}"


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    yield database
    database.dispose()


CONCURRENCY = 4


def leaders_path(db: Database, fake: FakeKube, clock: Clock, identity: str, retry_seconds: float = 0.0) -> EvictionPath:
    """The path of a process that holds the Lease and has recorded its term; a 429 asked again for `retry_seconds`."""
    kube = KubeApi(fake.api_client())
    election = LeaderElection(kube, "gpusharing-system", identity, 30, monotonic=clock.monotonic)
    assert election.try_acquire_or_renew()
    fence = EvictionFence(db, FENCE)
    assert fence.enter(election.term, election.identity)
    return EvictionPath(
        kube, election, fence, WebhookListings(db), concurrency=CONCURRENCY, retry_seconds=retry_seconds
    )


@pytest.fixture
def path(db: Database, fake_kube: FakeKube, clock: Clock) -> Iterator[EvictionPath]:
    """The leader's path (term 0); a 429 gives the claim back at once."""
    leader = leaders_path(db, fake_kube, clock, "first")
    yield leader
    leader.close()


@pytest.fixture
def retrying(db: Database, fake_kube: FakeKube, clock: Clock) -> Iterator[EvictionPath]:
    """The leader's path (term 0); a 429 is asked again for as long as a production pass would."""
    leader = leaders_path(db, fake_kube, clock, "first", retry_seconds=30.0)
    yield leader
    leader.close()


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


def test_a_webhook_that_stopped_polling_holds_nothing_back(
    path: EvictionPath, fake_kube: FakeKube, db: Database
) -> None:
    pod = running(fake_kube, "trainer")
    # live for three polls of 0.1 s and 5 s of slack, by the database's clock
    path.webhooks.poll("gone-replica", "0", "0.1")
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


def test_a_disruption_budgets_refusal_gives_the_claim_back_for_a_later_try(
    path: EvictionPath, fake_kube: FakeKube
) -> None:
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


def each_evicted_once(fake: FakeKube, pods: list[PodRef]) -> bool:
    """Whether the API server granted the eviction of each of `pods` once, and of no other."""
    granted = Counter(fake.evicted)
    return set(granted) == {(pod.namespace, pod.name) for pod in pods} and set(granted.values()) == {1}


def test_evictions_are_asked_concurrency_at_a_time_and_never_more(path: EvictionPath, fake_kube: FakeKube) -> None:
    pods = [running(fake_kube, f"trainer-{index:03}") for index in range(3 * CLAIM_BATCH // 2)]  # two claim batches
    fake_kube.eviction_seconds = 0.05  # the API server's time for each: the others are asked meanwhile
    done = path.evict("a test", pods, 0.0)
    assert sorted(map(str, done.evicted)) == sorted(map(str, pods)) and done.refused == [] and done.gone == []
    assert fake_kube.evictions_peak == CONCURRENCY
    assert each_evicted_once(fake_kube, pods)
    assert fake_kube.count("POST", "/api/v1/namespaces/ml/pods/") == len(pods)  # each asked once


def test_a_disruption_budgets_429_is_asked_again_until_allowed_while_the_others_go_on(
    retrying: EvictionPath, fake_kube: FakeKube,
) -> None:
    guarded = [running(fake_kube, f"guarded-{index}") for index in range(4)]
    free = [running(fake_kube, f"free-{index:02}") for index in range(20)]
    budget = FakeDisruptionBudget({(pod.namespace, pod.name) for pod in guarded}, allowed=1, recovery_seconds=0.3)
    fake_kube.disruption_budgets.append(budget)
    fake_kube.eviction_seconds = 0.01
    done = retrying.evict("a test", guarded + free, 0.0)
    assert sorted(map(str, done.evicted)) == sorted(map(str, guarded + free)) and done.refused == []
    assert budget.refusals > 0 and budget.peak == 1  # refused, asked again, never more disrupted than it allows
    assert each_evicted_once(fake_kube, guarded + free)
    # The budget's waits held no other eviction back: the free pods were all evicted before the last guarded one.
    order = [name for _, name in fake_kube.evicted]
    assert max(order.index(pod.name) for pod in free) < max(order.index(pod.name) for pod in guarded)


def test_a_429s_retry_after_is_honoured(retrying: EvictionPath, fake_kube: FakeKube) -> None:
    guarded = [running(fake_kube, f"guarded-{index}") for index in range(3)]
    # Each eviction disrupts for 0.9 s; the API server says to come back in 1 s: asked sooner (the backoff's first
    # half second), each would be refused again.
    budget = FakeDisruptionBudget({(pod.namespace, pod.name) for pod in guarded}, allowed=1, recovery_seconds=0.9,
                                  retry_after_seconds=1)
    fake_kube.disruption_budgets.append(budget)
    done = retrying.evict("a test", guarded, 0.0)
    assert sorted(map(str, done.evicted)) == sorted(map(str, guarded))
    assert budget.refusals == 3  # two refused at first; of their second tries, one
    assert each_evicted_once(fake_kube, guarded)


def test_an_eviction_still_refused_when_its_retries_run_out_gives_its_claim_back(
    retrying: EvictionPath, fake_kube: FakeKube,
) -> None:
    pod, other = running(fake_kube, "guarded"), running(fake_kube, "free")
    retrying.retry_seconds = 1.0
    fake_kube.refuse_evictions.add(("ml", "guarded"))  # a budget that allows nothing (minAvailable: 100%)
    done = retrying.evict("a test", [pod, other], 0.0)
    assert done.refused == [pod] and done.evicted == [other]
    assert fake_kube.count("POST", "/api/v1/namespaces/ml/pods/guarded/eviction") > 1  # asked again, with backoff
    fake_kube.refuse_evictions.clear()
    assert retrying.evict("a test", [pod], 0.0).evicted == [pod]  # the claim was given back


def test_a_leader_deposed_mid_way_asks_nothing_more_and_its_successor_evicts_the_rest_once(
    path: EvictionPath, fake_kube: FakeKube, db: Database, clock: Clock,
) -> None:
    pods = [running(fake_kube, f"trainer-{index:02}") for index in range(40)]
    fake_kube.eviction_seconds = 0.02
    successor = LeaderElection(
        KubeApi(fake_kube.api_client()), "gpusharing-system", "second", 30, monotonic=clock.monotonic
    )
    assert not successor.try_acquire_or_renew()  # sees the first's record

    def depose_after_five(pod: PodRef) -> None:
        # the first paused past its Lease; the second takes over
        if len(fake_kube.evicted) >= 5 and not successor.leading:
            clock.advance(seconds=31)
            assert successor.try_acquire_or_renew()
            assert EvictionFence(db, FENCE).enter(successor.term, successor.identity)

    with pytest.raises(LeaseLost):
        path.evict("a test", pods, 0.0, on_evicted=depose_after_five)
    first = len(fake_kube.evicted)
    assert 5 <= first <= 5 + CONCURRENCY  # what was in flight when it lost the Lease, and nothing after
    second = EvictionPath(path.kube, successor, EvictionFence(db, FENCE), path.webhooks, CONCURRENCY, 0.0)
    try:
        rest = [pod for pod in pods if (pod.namespace, pod.name) in fake_kube.pods]
        assert len(second.evict("a test", rest, 0.0).evicted) == len(pods) - first  # the claims were given back
    finally:
        second.close()
    assert each_evicted_once(fake_kube, pods)


def test_an_owners_pods_are_asked_in_turn_with_the_others_and_one_more_at_a_time_once_refused(
    retrying: EvictionPath, fake_kube: FakeKube, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pods of one owner mostly share a PodDisruptionBudget, which the API server updates on each eviction it
    grants (concurrent ones conflict there): the owners' pods are asked in turn, and once one is refused, its owner's
    others wait for the answer's time and go one at a time, one more in flight with each eviction granted."""
    def owned(owner: str, count: int) -> list[PodRef]:
        return [PodRef(pod.namespace, pod.name, pod.uid, owner) for pod in
                (running(fake_kube, f"{owner}-{index}") for index in range(count))]

    guarded, free = owned("a-guarded", 6), owned("b-free", 6)
    budget = FakeDisruptionBudget({(pod.namespace, pod.name) for pod in guarded}, allowed=1, recovery_seconds=0.2,
                                  retry_after_seconds=1)
    fake_kube.disruption_budgets.append(budget)
    fake_kube.eviction_seconds = 0.05
    # The order the pass sends them in: the fake records each request as it answers it, and a loaded host may let
    # the first answer come back, and the next request leave, before the fourth request's thread has sent it.
    sent: list[str] = []
    submit = retrying._requests.submit
    monkeypatch.setattr(
        retrying._requests, "submit", lambda ask, pod, *args: sent.append(pod.name) or submit(ask, pod, *args)
    )
    done = retrying.evict("a test", guarded + free, 0.0)
    assert sorted(map(str, done.evicted)) == sorted(map(str, guarded + free)) and done.refused == []
    assert sorted(sent[:CONCURRENCY]) == ["a-guarded-0", "a-guarded-1", "b-free-0", "b-free-1"]  # in turn
    assert budget.refusals > 0 and budget.first_refused_at is not None and budget.peak == 1
    # Once the first 429 is answered (those sent before it came back aside), one request at a time, and one more with
    # each eviction granted until the next 429: never more than two here, where the budget lets one through at a time.
    assert max(asking for at, asking in budget.asked if at > budget.first_refused_at + 0.5) <= 2
    assert each_evicted_once(fake_kube, guarded + free)


def test_failed_requests_halve_the_evictions_in_flight_and_answers_bring_them_back(
    path: EvictionPath, fake_kube: FakeKube
) -> None:
    pods = [running(fake_kube, f"trainer-{index:02}") for index in range(24)]
    fake_kube.eviction_seconds = 0.1
    fake_kube.up = False  # an API server that fails every request (or answers none within the Lease)
    done = path.evict("a test", pods[:8], 0.0)
    assert done.evicted == [] and fake_kube.evicted == [] and path.window == 1
    fake_kube.up, fake_kube.evictions_peak = True, 0
    done = path.evict("a test", pods, 0.0)  # the claims the failures gave back are taken again
    assert len(done.evicted) == len(pods) and path.window == CONCURRENCY == fake_kube.evictions_peak
    assert each_evicted_once(fake_kube, pods)


def test_an_eviction_whose_answer_was_lost_is_read_before_it_is_asked_again(
    path: EvictionPath, fake_kube: FakeKube
) -> None:
    pod = running(fake_kube, "trainer")
    path.kube = KubeApi(fake_kube.api_client(), timeout=0.3)
    fake_kube.eviction_seconds = 0.8  # the API server grants it after the client has given up waiting
    assert path.evict("a test", [pod], 0.0).evicted == []
    wait = 0
    while not fake_kube.evicted and wait < 100:
        time.sleep(0.05)
        wait += 1
    assert fake_kube.evicted == [("ml", "trainer")]
    again = path.evict("a test", [pod], 0.0)  # a cache that still lists it: read first, not asked a second time
    assert again.gone == [pod] and again.evicted == []
    assert fake_kube.count("POST", "/api/v1/namespaces/ml/pods/trainer/eviction") == 1


def test_a_slow_answer_is_waited_for_past_what_is_left_of_the_lease(db: Database, fake_kube: FakeKube) -> None:
    """A loaded API server answers after the Lease's remainder: the request left under the Lease, so its answer is
    waited for (the API's timeout), not given up as a failure at the Lease's end."""
    kube = KubeApi(fake_kube.api_client())
    election = LeaderElection(kube, "gpusharing-system", "first", 2)  # the cluster tier's short Lease, on real time
    assert election.try_acquire_or_renew()
    fence = EvictionFence(db, FENCE)
    assert fence.enter(election.term, election.identity)
    path = EvictionPath(kube, election, fence, WebhookListings(db), concurrency=CONCURRENCY, retry_seconds=0.0)
    pods = [running(fake_kube, f"trainer-{index}") for index in range(CONCURRENCY)]
    fake_kube.eviction_seconds = 2.5  # each answered later than the whole Lease
    try:
        done = path.evict("a test", pods, 0.0)
    finally:
        path.close()
    assert sorted(map(str, done.evicted)) == sorted(map(str, pods)) and done.unknown == []
    assert path.window == CONCURRENCY  # no request failed
    assert each_evicted_once(fake_kube, pods)


def test_the_holders_renewals_from_two_threads_never_race_each_other_to_a_lost_lease(fake_kube: FakeKube) -> None:
    """The controller's `lease` task renews the Lease while an evicting task's keep() finds a renewal due: one renewal
    at a time, the second not written once the first has been, so that neither is refused (409) as a stale write and
    the holder never reads its own renewal as the Lease lost."""
    now = [0.0]
    election = LeaderElection(
        KubeApi(fake_kube.api_client()), "gpusharing-system", "first", 3, monotonic=lambda: now[0]
    )
    assert election.try_acquire_or_renew()
    now[0] = 1.5  # half the Lease gone: the evicting task's keep() renews
    fake_kube.delay_seconds = 0.2  # a loaded API server: the two renewals overlap
    lease_task = threading.Thread(target=election.try_acquire_or_renew)
    lease_task.start()
    time.sleep(0.05)
    kept = election.keep()
    lease_task.join()
    assert kept and election.leading and election.remaining_seconds() > 0
    # the lease task's renewal alone: keep() found it renewed meanwhile and wrote nothing
    assert fake_kube.count("PUT", "/apis/coordination.k8s.io/v1/namespaces/gpusharing-system/leases/") == 1


def test_an_unanswered_evictions_claim_is_kept_and_its_pod_read_before_anyone_asks_again(
    path: EvictionPath, fake_kube: FakeKube, db: Database, clock: Clock,
) -> None:
    """A request that timed out may have been granted: its claim is not given back, so that no successor asks for the
    pod meanwhile; once the claim is stale, the successor that takes it over reads the pod first (granted: gone)."""
    pod = running(fake_kube, "trainer")
    path.kube = KubeApi(fake_kube.api_client(), timeout=0.3)
    fake_kube.eviction_seconds = 0.8  # the API server grants it after the client has given up waiting
    done = path.evict("a test", [pod], 0.0)
    assert done.evicted == [] and done.unknown == [pod]
    fake_kube.eviction_seconds = 0.0
    successor = LeaderElection(
        KubeApi(fake_kube.api_client()), "gpusharing-system", "second", 30, monotonic=clock.monotonic
    )
    assert not successor.try_acquire_or_renew()
    clock.advance(seconds=31)  # the first paused past its Lease; the second takes over at once
    assert successor.try_acquire_or_renew()
    fence = EvictionFence(db, FENCE)
    assert fence.enter(successor.term, successor.identity)
    second = EvictionPath(path.kube, successor, fence, path.webhooks, CONCURRENCY, 0.0)
    try:
        assert second.evict("a test", [pod], 0.0) == Evictions()  # the first's claim stands: nothing asked
        wait = 0
        while not fake_kube.evicted and wait < 100:
            time.sleep(0.05)
            wait += 1
        assert fake_kube.evicted == [("ml", "trainer")]  # granted, unanswered
        fake_kube.add_pod("ml", "trainer")["metadata"].update(uid=pod.uid, deletionTimestamp="2028-02-28T23:00:00Z")
        with db.write() as conn:  # the claim stale (the database's clock cannot be moved: aged through the table)
            conn.execute(
                update(eviction_claims).values(claimed_at=eviction_claims.c.claimed_at - STALE_CLAIM_SECONDS - 1)
            )
        again = second.evict("a test", [pod], 0.0)  # taken over: read first, terminating, not asked a second time
    finally:
        second.close()
    assert again.gone == [pod] and again.evicted == []
    assert fake_kube.count("POST", "/api/v1/namespaces/ml/pods/trainer/eviction") == 1


def test_an_unanswered_eviction_is_asked_again_by_the_same_leaders_next_pass_after_a_read(
    path: EvictionPath, fake_kube: FakeKube, db: Database,
) -> None:
    """The claim kept for an unanswered request is this leader's still: its next pass makes it fresh (another leader
    takes it over only STALE_CLAIM_SECONDS after that) and, the pod read and still running, asks again."""
    pod = running(fake_kube, "trainer")
    fake_kube.up = False  # no answer
    assert path.evict("a test", [pod], 0.0).unknown == [pod]
    with db.write() as conn:  # nearly stale
        conn.execute(update(eviction_claims).values(claimed_at=eviction_claims.c.claimed_at - STALE_CLAIM_SECONDS + 5))
        aged = conn.execute(select(eviction_claims.c.claimed_at)).scalar_one()
    fake_kube.up = True
    done = path.evict("a test", [pod], 0.0)
    assert done.evicted == [pod] and done.unknown == []
    assert fake_kube.count("GET", "/api/v1/namespaces/ml/pods/trainer") == 1  # read before it was asked again
    with db.read() as conn:
        # made fresh
        assert conn.execute(select(eviction_claims.c.claimed_at)).scalar_one() >= aged + STALE_CLAIM_SECONDS - 5


def test_a_claim_taken_over_is_kept_not_given_back_when_the_lease_is_lost_before_its_pod_was_read(
    path: EvictionPath, fake_kube: FakeKube, db: Database, clock: Clock,
) -> None:
    """A former leader's claims, taken over, may be of pods it evicted unanswered: those its successor did not read
    before losing the Lease in turn are kept, not given back, so that the leader after it takes them over too and
    reads each pod first, rather than claiming them afresh and asking at once."""
    pods = [running(fake_kube, f"trainer-{index:02}") for index in range(20)]
    fence = EvictionFence(db, FENCE)
    assert fence.claim_many(path.election.term, [(p.uid, p.namespace, p.name) for p in pods]) is not None  # and it died
    fake_kube.eviction_seconds = 0.02
    successor = LeaderElection(
        KubeApi(fake_kube.api_client()), "gpusharing-system", "second", 30, monotonic=clock.monotonic
    )
    assert not successor.try_acquire_or_renew()
    clock.advance(seconds=31)
    assert successor.try_acquire_or_renew() and fence.enter(successor.term, successor.identity)
    with db.write() as conn:  # the dead leader's claims stale
        conn.execute(update(eviction_claims).values(claimed_at=eviction_claims.c.claimed_at - STALE_CLAIM_SECONDS - 1))
    third = LeaderElection(KubeApi(fake_kube.api_client()), "gpusharing-system", "third", 30, monotonic=clock.monotonic)
    assert not third.try_acquire_or_renew()

    def depose_after_five(pod: PodRef) -> None:
        if len(fake_kube.evicted) >= 5 and not third.leading:
            clock.advance(seconds=31)
            assert third.try_acquire_or_renew() and fence.enter(third.term, third.identity)

    second = EvictionPath(path.kube, successor, fence, path.webhooks, 1, 0.0)
    try:
        with pytest.raises(LeaseLost):
            second.evict("a test", pods, 0.0, on_evicted=depose_after_five)
    finally:
        second.close()
    asked = fake_kube.count("POST", "/api/v1/namespaces/ml/pods/")
    assert len(fake_kube.evicted) == asked < len(pods)
    with db.read() as conn:  # every claim stands: the evicted pods', and those not read, under the second's term
        assert conn.execute(select(eviction_claims.c.term)).scalars().all() == [successor.term] * len(pods)
