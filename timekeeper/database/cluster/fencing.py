"""Fencing the controller's evictions in the database, so that a deposed controller can evict nothing and no pod is
evicted twice.

The Lease (timekeeper.cluster.leader) says who leads by each process's own clock; a process paused, or slowed past
its Lease, can still believe it leads. So every eviction is first claimed here, in one short transaction, under the
controller's term: the Lease's `leaseTransitions` when its holder took it, which rises with every new holder. A new
holder records its term before its first eviction; from then on a claim under an older term is refused, whatever
the older holder believes. A pod is claimed once: a second claim of it is refused while the first stands, so two
controllers never both ask for its eviction. A claim is given back when its eviction was refused (a
PodDisruptionBudget) or failed, or when its holder stops (its Lease lost), so that a later pass or leader tries
again; one its holder never finished (it died) is taken over once no request of its holder can still be under way:
once the claim is older than any eviction of its holder can be retried and answered (STALE_CLAIM_SECONDS), or once
the term that fenced its holder off is older than any answer is waited for (TERM_SETTLED_SECONDS). The second comes
first after a leader dies: its holder sent its requests only while it surely held the Lease, so before its successor
took the Lease and entered its term, and waited at most REQUEST_TIMEOUT_SECONDS for each answer.
Claims are made a batch at a time, one short transaction for many pods; a claim taken over is said so (its holder may
have sent its request, granted unanswered: its pod is read before it is asked again). A claim whose request got no
answer is kept by its holder, not given back, and made fresh again (`renew`) when the same holder, under the same
term, takes the pod up again. Times are the database's, the one clock every replica shares.
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


STALE_CLAIM_SECONDS = 60.0  # far longer than an eviction request may last (its timeout), so its holder has given up
# A former holder's requests were all sent before the current term began (under its Lease) and answered, or given up,
# within REQUEST_TIMEOUT_SECONDS: its claims are free this long into the term, with the same 5 s to spare as above.
TERM_SETTLED_SECONDS = REQUEST_TIMEOUT_SECONDS + 5.0
KEPT_CLAIM_SECONDS = 86_400.0  # evicted pods' claims are forgotten after a day: their pods are long gone


class EvictionFence:
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
            # Read FOR SHARE: a new holder's enter() waits for this claim to commit, and every claim after it sees its
            # term.
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
