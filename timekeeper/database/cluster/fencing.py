"""Each eviction claimed in the database under the controller's term, so that a deposed leader evicts nothing and no
pod is evicted twice.

The Lease (timekeeper.cluster.leader) is judged by each process's own clock, which a paused or slowed process cannot
trust; so each eviction is first claimed here under its holder's term (the Lease's `leaseTransitions` when it took
it), and a claim under an older term than the one recorded is refused. Times are the database's. How claims are given
back, taken over and kept: docs/design/controller.md, "Fencing in the database".
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Float, literal, select

from gpusharing.kube.client import REQUEST_TIMEOUT_SECONDS
from timekeeper.database.connection import Database
from timekeeper.database.tables import controller_terms, eviction_claims


class Claims(set[str]):
    """The uids claimed; `taken_over`, those of them another (a former leader) had claimed and left unfinished."""

    def __init__(self, claimed: set[str] | None = None, taken_over: set[str] | None = None):
        super().__init__(claimed or ())
        self.taken_over = taken_over or set()


# An earlier term's claim this old is free: its holder has given up (its retries end sooner, MAX_RETRY_SECONDS).
STALE_CLAIM_SECONDS = 60.0
# A former holder sent its requests before the current term began and waited at most REQUEST_TIMEOUT_SECONDS for each
# answer: its claims are free this long into the term, with 5 s to spare.
TERM_SETTLED_SECONDS = REQUEST_TIMEOUT_SECONDS + 5.0
KEPT_CLAIM_SECONDS = 86_400.0  # evicted pods' claims are forgotten after a day: their pods are long gone


class EvictionFence:
    """The terms and the eviction claims of one Lease's controllers."""

    def __init__(self, db: Database, name: str):
        self.db = db
        self.name = name  # the Lease's namespace/name

    def enter(self, term: int, holder: str) -> bool:
        """Records `term` as the controller's, unless a later one is recorded; whether `term` is now the current one.
        Forgets the claims of pods evicted long ago."""
        clock = self.db.clock()
        with self.db.write() as conn:
            query = select(controller_terms.c.term).where(controller_terms.c.name == self.name)
            row = conn.execute(query if self.db.is_sqlite else query.with_for_update()).first()
            if row is not None and row.term > term:
                return False
            if row is None:
                conn.execute(
                    self.db.insert(controller_terms)
                    .values(name=self.name, term=term, holder=holder, since=clock)
                    .on_conflict_do_nothing()
                )
            elif row.term < term:
                conn.execute(controller_terms.update().where(controller_terms.c.name == self.name)
                             .values(term=term, holder=holder, since=clock))
            conn.execute(eviction_claims.delete().where(eviction_claims.c.claimed_at < clock - KEPT_CLAIM_SECONDS))
            recorded = conn.execute(query).scalar_one()
        return bool(recorded == term)

    def claim_many(self, term: int, pods: Sequence[tuple[str, str, str]]) -> Claims | None:
        """Claims the evictions of (uid, namespace, name) pods for the controller of `term`, in one transaction; the
        uids claimed (the others are another's) and which of them were taken over, or None when a later term is
        recorded."""
        clock = self.db.clock()
        claimed = Claims()
        with self.db.write() as conn:
            # FOR SHARE: a new holder's enter() waits for this claim to commit, and every later claim sees its term.
            query = select(controller_terms.c.term, controller_terms.c.since).where(
                controller_terms.c.name == self.name
            )
            current = conn.execute(query if self.db.is_sqlite else query.with_for_update(read=True)).first()
            if current is None or current.term != term:
                return None
            # Another's claim stands, unless an earlier term's holder left it unfinished and can no longer be asking.
            unfinished = (eviction_claims.c.term < term) & (
                (eviction_claims.c.claimed_at < clock - STALE_CLAIM_SECONDS)
                | (literal(current.since, Float) < clock - TERM_SETTLED_SECONDS))
            for pod_uid, namespace, pod in pods:
                inserted = conn.execute(
                    self.db.insert(eviction_claims)
                    .values(pod_uid=pod_uid, namespace=namespace, pod=pod, term=term, claimed_at=clock)
                    .on_conflict_do_nothing()
                    .returning(eviction_claims.c.pod_uid)
                ).first()
                taken_over = None if inserted else conn.execute(
                    eviction_claims.update()
                    .where((eviction_claims.c.pod_uid == pod_uid) & unfinished)
                    .values(term=term, claimed_at=clock)
                    .returning(eviction_claims.c.pod_uid)
                ).first()
                if inserted is not None or taken_over is not None:
                    claimed.add(pod_uid)
                if taken_over is not None:
                    claimed.taken_over.add(pod_uid)
        return claimed

    def renew(self, term: int, pod_uids: Sequence[str]) -> set[str] | None:
        """Makes fresh the claims the controller of `term` holds of `pod_uids` (kept while their requests' answers
        are unknown), in one transaction, as claim_many would claim them: the uids whose claims it holds, or None
        when a later term is recorded."""
        clock = self.db.clock()
        with self.db.write() as conn:
            query = select(controller_terms.c.term).where(controller_terms.c.name == self.name)
            current = conn.execute(query if self.db.is_sqlite else query.with_for_update(read=True)).scalar()
            if current != term:
                return None
            renewed = conn.execute(
                eviction_claims.update()
                .where(eviction_claims.c.pod_uid.in_(pod_uids) & (eviction_claims.c.term == term))
                .values(claimed_at=clock)
                .returning(eviction_claims.c.pod_uid)
            ).scalars().all()
        return set(renewed)

    def release(self, term: int, *pod_uids: str) -> None:
        """Gives back claims whose evictions did not happen, so that a later pass (or leader) may claim the pods
        again."""
        if not pod_uids:
            return
        with self.db.write() as conn:
            conn.execute(
                eviction_claims.delete().where(
                    eviction_claims.c.pod_uid.in_(pod_uids) & (eviction_claims.c.term == term)
                )
            )
