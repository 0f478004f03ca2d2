"""The controller's evictions fenced in the database: a deposed controller claims nothing, no pod is claimed twice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import update

from gpusharing.kube.client import REQUEST_TIMEOUT_SECONDS
from timekeeper.database.cluster.fencing import STALE_CLAIM_SECONDS, TERM_SETTLED_SECONDS, EvictionFence
from timekeeper.database.connection import Database
from timekeeper.database.tables import controller_terms, eviction_claims


@pytest.fixture
def fence(database_url: str) -> Iterator[EvictionFence]:
    db = Database(database_url)
    yield EvictionFence(db, "gpusharing-system/gpusharing-timekeeper")
    db.dispose()


A, B = ("uid-a", "team", "a"), ("uid-b", "team", "b")


def test_a_later_term_fences_off_the_earlier_leader(fence: EvictionFence) -> None:
    assert fence.enter(3, "first")
    assert fence.claim_many(3, [A]) == {"uid-a"}
    assert fence.enter(4, "second")  # the successor records itself before its first eviction
    assert fence.claim_many(3, [B]) is None  # the first, still believing it leads, claims nothing
    assert not fence.enter(3, "first")  # nor can it record itself again
    assert fence.claim_many(4, [B]) == {"uid-b"}


def test_a_pod_is_claimed_once_until_its_claim_is_given_back(fence: EvictionFence) -> None:
    assert fence.enter(1, "first")
    assert fence.claim_many(1, [A]) == {"uid-a"}
    assert fence.claim_many(1, [A, B]) == {"uid-b"}  # a batch: what another claim holds is left out
    fence.enter(2, "second")
    assert fence.claim_many(2, [A]) == set()  # the first may be asking for it right now
    fence.release(1, "uid-a", "uid-b")  # a PodDisruptionBudget refused them: the pods may be claimed again
    assert fence.claim_many(2, [A, B]) == {"uid-a", "uid-b"}
    fence.release(1, "uid-a")  # a release under another term leaves the claim alone
    assert fence.claim_many(2, [A]) == set()


def test_a_claim_left_by_a_dead_leader_is_taken_over_once_no_request_can_still_be_under_way(
    fence: EvictionFence,
) -> None:
    fence.enter(1, "first")
    assert fence.claim_many(1, [A]) == {"uid-a"}  # and the first dies before it asks
    fence.enter(2, "second")
    assert fence.claim_many(2, [A]) == set()
    with fence.db.write() as conn:  # the claim ages, by the database's clock
        conn.execute(update(eviction_claims).values(claimed_at=eviction_claims.c.claimed_at - STALE_CLAIM_SECONDS - 1))
    assert fence.claim_many(2, [A]) == {"uid-a"}


def test_a_dead_leaders_claim_is_taken_over_once_its_successors_term_is_older_than_any_answer_is_waited_for(
    fence: EvictionFence,
) -> None:
    """The dead leader sent its requests only under its Lease, before its successor's term began: once the term is
    older than an answer is waited for, none can still be under way, however fresh its claim."""
    assert TERM_SETTLED_SECONDS > REQUEST_TIMEOUT_SECONDS
    fence.enter(1, "first")
    assert fence.claim_many(1, [A, B]) == {"uid-a", "uid-b"}
    fence.enter(2, "second")
    fence.release(1, "uid-b")
    assert fence.claim_many(2, [A]) == set()  # the first may have sent its request a moment ago
    with fence.db.write() as conn:  # the second term ages, by the database's clock; the claim stays fresh
        conn.execute(update(controller_terms).values(since=controller_terms.c.since - TERM_SETTLED_SECONDS + 2))
    assert fence.claim_many(2, [A]) == set()
    with fence.db.write() as conn:
        conn.execute(update(controller_terms).values(since=controller_terms.c.since - 3))
    claimed = fence.claim_many(2, [A, B])
    assert claimed == {"uid-a", "uid-b"} and claimed.taken_over == {"uid-a"}  # its pod is read before it is asked
    fence.enter(3, "third")  # and a claim of the current term is never another's to take over, however old the term
    with fence.db.write() as conn:
        conn.execute(update(controller_terms).values(since=controller_terms.c.since - TERM_SETTLED_SECONDS - 1))
    assert fence.claim_many(3, [A]) == {"uid-a"}  # the second's, taken over in turn by the third
    assert fence.claim_many(3, [A]) == set()  # but the third's own claim stands against itself
