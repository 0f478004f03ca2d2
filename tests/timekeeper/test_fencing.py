"""The controller's evictions fenced in the database: a deposed controller claims nothing, no pod is claimed twice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import update

from timekeeper.cluster.fencing import STALE_CLAIM_SECONDS, EvictionFence
from timekeeper.database.connection import Database
from timekeeper.database.tables import eviction_claims


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


def test_a_claim_left_by_a_dead_leader_is_taken_over_once_no_request_can_still_be_under_way(fence: EvictionFence) -> None:
    fence.enter(1, "first")
    assert fence.claim_many(1, [A]) == {"uid-a"}  # and the first dies before it asks
    fence.enter(2, "second")
    assert fence.claim_many(2, [A]) == set()
    with fence.db.write() as conn:  # the claim ages, by the database's clock
        conn.execute(update(eviction_claims).values(claimed_at=eviction_claims.c.claimed_at - STALE_CLAIM_SECONDS - 1))
    assert fence.claim_many(2, [A]) == {"uid-a"}
