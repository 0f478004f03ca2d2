"""Safe admission's committed GPU pods: the controller publishes them in the database, the web replicas, which hold no
pod watch, read them there (docs/safe-admission.md, "Where the commitments come from").

The leader's CommitmentPublisher writes what changed since it last wrote, and a heartbeat, in one short transaction;
PublishedCommitments reads both in one short read per request. Times are the database's.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import secrets
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from timekeeper.budgets.commitments import CommittedPod, NamespaceCommitments, commitments_by_namespace
from timekeeper.database.connection import Database
from timekeeper.database.tables import commitment_publications, committed_pods

log = logging.getLogger(__name__)

# Published pods are stale once no publication from a healthy watch confirmed them for this long (the controller
# stopped, its Lease is between holders, or its watch failed): strict safe admission then refuses to count on them.
STALE_AFTER_SECONDS = 10.0
# Another publisher that published within this long is alive: this one writes nothing (a deposed leader's last
# publication is refused); one silent this long has stopped, and the next leader takes over its rows.
TAKEOVER_AFTER_SECONDS = 3.0
# A gone pod's row is kept this long (at least a reservation's lifetime, TIMEKEEPER_RESERVATION_SECONDS): its
# admission id keeps its reservation given up meanwhile, as when the pod was there.
KEEP_GONE_SECONDS = 600.0
PUBLICATION = "committed-pods"  # the heartbeat's row

NOT_PUBLISHED = "the timekeeper's controller has not published the cluster's pods yet"


def _identity() -> str:
    """This process's name for itself as a publisher: its host, its pid, and a token (a restart is a new publisher)."""
    return f"{socket.gethostname()[:200]}/{os.getpid()}/{secrets.token_hex(4)}"


@dataclass(frozen=True)
class _Written:
    """A committed_pods row, as far as diffs go: the pod's figures, and when it left the set (None: it has not)."""

    figures: tuple[Any, ...]
    gone_at: dt.datetime | None


def _figures(pod: CommittedPod) -> dict[str, Any]:
    return {"namespace": pod.namespace, "name": pod.name, "share": pod.share, "weight": pod.weight,
            "deadline_seconds": pod.deadline_seconds, "started_at": pod.started_at, "admission_id": pod.admission_id}


_FIGURES = ("namespace", "name", "share", "weight", "deadline_seconds", "started_at", "admission_id")


class CommitmentPublisher:
    """The controller's side: publishes the informer's committed pods (by uid) and its heartbeat, writing only what
    changed since its last publication. Only the leader publishes; see publish() for a deposed one.

    `identity` names the process in the heartbeat (by default its host, pid and a token); `keep_seconds` how long a
    gone pod's row stays: at least the web replicas' reservation lifetime (TIMEKEEPER_RESERVATION_SECONDS)."""

    def __init__(self, db: Database, clock: Callable[[], dt.datetime], identity: str | None = None,
                 keep_seconds: float = KEEP_GONE_SECONDS):
        self.db = db
        self.clock = clock
        self.identity = (identity or _identity())[:253]
        self.keep_seconds = keep_seconds
        # The table as this publisher last wrote it; None: read it first (after a start, a failure, or another's
        # writes).
        self._written: dict[str, _Written] | None = None
        self._refused_by: str | None = None

    def publish(self, pods: Mapping[str, CommittedPod], healthy: bool) -> None:
        """Publishes `pods`, the informer's whole set of committed pods by uid, and whether its watch is healthy
        (listed, and not failing now).

        From a healthy watch the table is made to hold exactly `pods` (gone pods marked gone, those long gone deleted);
        from an unhealthy one the pods stay as published and only the heartbeat says so, going stale after
        STALE_AFTER_SECONDS. While another publisher published within TAKEOVER_AFTER_SECONDS this writes nothing, so
        that a deposed leader publishing once more changes nothing."""
        now = self.clock()
        try:
            with self.db.write() as conn:
                query = select(commitment_publications).where(commitment_publications.c.name == PUBLICATION)
                beat = conn.execute(query if self.db.is_sqlite else query.with_for_update()).first()
                if beat is not None and beat.publisher != self.identity \
                        and (now - beat.published_at).total_seconds() < TAKEOVER_AFTER_SECONDS:
                    self._refuse(beat.publisher, (now - beat.published_at).total_seconds())
                    return
                ours = beat is not None and beat.publisher == self.identity and self._written is not None
                written = dict(self._written) if ours and self._written is not None else _read_written(conn)
                if healthy:
                    self._write_changes(conn, written, pods, now)
                confirmed = now if healthy else (beat.confirmed_at if beat is not None else None)
                values = {
                    "publisher": self.identity,
                    "published_at": now,
                    "healthy": healthy,
                    "confirmed_at": confirmed,
                }
                conn.execute(self.db.insert(commitment_publications).values(name=PUBLICATION, **values)
                             .on_conflict_do_update(index_elements=["name"], set_=values))
        except BaseException:
            self._written = None  # rolled back, or unknown: read the table next time
            raise
        self._written = written
        if self._refused_by is not None:
            log.info("publishing the cluster's committed pods, taken over from %s", self._refused_by)
            self._refused_by = None

    def _write_changes(self, conn: Connection, written: dict[str, _Written], pods: Mapping[str, CommittedPod],
                       now: dt.datetime) -> None:
        """Makes the table hold `pods` (and `written` say so)."""
        upserts = []
        for uid, pod in pods.items():
            figures = _figures(pod)
            key = tuple(figures[name] for name in _FIGURES)
            old = written.get(uid)
            if old is None or old.figures != key or old.gone_at is not None:
                upserts.append({"uid": uid, **figures, "seen_at": now, "gone_at": None})
                written[uid] = _Written(key, None)
        if upserts:
            insert = self.db.insert(committed_pods)
            changed = {name: insert.excluded[name] for name in (*_FIGURES, "seen_at", "gone_at")}
            conn.execute(insert.on_conflict_do_update(index_elements=["uid"], set_=changed), upserts)
        gone = sorted(uid for uid, old in written.items() if old.gone_at is None and uid not in pods)
        if gone:
            conn.execute(
                committed_pods.update()
                .where(committed_pods.c.uid.in_(gone) & committed_pods.c.gone_at.is_(None))
                .values(gone_at=now)
            )
            for uid in gone:
                written[uid] = _Written(written[uid].figures, now)
        forgotten = now - dt.timedelta(seconds=self.keep_seconds)
        past = sorted(uid for uid, old in written.items() if old.gone_at is not None and old.gone_at < forgotten)
        if past:
            conn.execute(
                committed_pods.delete().where(committed_pods.c.uid.in_(past) & (committed_pods.c.gone_at < forgotten))
            )
            for uid in past:
                del written[uid]

    def _refuse(self, other: str, seconds: float) -> None:
        self._written = None  # the other publisher writes meanwhile: read the table when this one takes over
        if self._refused_by != other:
            log.warning(
                "another timekeeper controller (%s) published the cluster's committed pods %.1f s ago: this one "
                "(%s) publishes nothing until it has been silent for %.0f s",
                other,
                seconds,
                self.identity,
                TAKEOVER_AFTER_SECONDS,
            )
            self._refused_by = other


def _read_written(conn: Connection) -> dict[str, _Written]:
    rows = conn.execute(
        select(committed_pods.c.uid, committed_pods.c.gone_at, *(committed_pods.c[name] for name in _FIGURES))
    )
    return {row.uid: _Written(tuple(getattr(row, name) for name in _FIGURES), row.gone_at) for row in rows}


@dataclass(frozen=True)
class Publication:
    """What the controller had published when read, as safe admission asks it (one read: a request's answers agree)."""

    now: dt.datetime  # the database's time of the read
    publisher: str | None  # None: nothing published yet
    published_at: dt.datetime | None
    healthy: bool
    confirmed_at: dt.datetime | None  # the last publication from a healthy watch
    pods: tuple[CommittedPod, ...]  # committed now
    # (admission id, seen_at, gone_at) within remember_seconds
    seen: tuple[tuple[str, dt.datetime, dt.datetime | None], ...]
    remember_seconds: float

    def problem(self) -> str | None:
        """Why what the pods commit is not known now, in words for an admission's refusal; None when it is."""
        if self.confirmed_at is None or self.published_at is None:
            return NOT_PUBLISHED
        confirmed = (self.now - self.confirmed_at).total_seconds()
        if confirmed <= STALE_AFTER_SECONDS:
            return None
        published = (self.now - self.published_at).total_seconds()
        if published <= STALE_AFTER_SECONDS:  # publishing still, from a watch that failed
            return f"the timekeeper's controller's watch of the cluster's pods has failed for {confirmed:.0f} s"
        return f"the timekeeper's controller last published the cluster's pods {published:.0f} s ago"

    def by_namespace(self) -> dict[str, NamespaceCommitments] | None:
        """What each namespace's pods commit; None while it is not known (problem())."""
        if self.problem() is not None:
            return None
        return commitments_by_namespace(self.pods, self.now)

    def counted_ids(self) -> frozenset[str]:
        """The admission ids of the pods published now, and of those gone within a reservation's lifetime (an ended
        pod's reservation stays given up): their reservations no longer count."""
        forgotten = self.now - dt.timedelta(seconds=self.remember_seconds)
        return frozenset(
            admission_id for admission_id, _, gone_at in self.seen if gone_at is None or gone_at >= forgotten
        )

    def settled_ids(self) -> frozenset[str]:
        """The admission ids of the pods published (as they are) at least STALE_AFTER_SECONDS ago, within a
        reservation's lifetime: every reader has had them that long, so their reservations may go (older ones have
        lapsed anyway)."""
        settled = self.now - dt.timedelta(seconds=STALE_AFTER_SECONDS)
        forgotten = self.now - dt.timedelta(seconds=self.remember_seconds)
        return frozenset(admission_id for admission_id, seen_at, _ in self.seen if forgotten <= seen_at <= settled)

    def admitted_as(self, admission_id: str) -> str | None:
        """The pod (namespace/name) published with this admission id, if any."""
        for pod in self.pods:
            if pod.admission_id == admission_id:
                return f"{pod.namespace}/{pod.name}"
        return None


class PublishedCommitments:
    """The web replicas' side: what the controller published, read from the database. Each method is one short read;
    read() answers them all from one (what a request asking several should use)."""

    def __init__(self, db: Database, clock: Callable[[], dt.datetime], remember_seconds: float = 30.0):
        self.db = db
        self.clock = clock
        self.remember_seconds = remember_seconds  # a reservation's lifetime: how long a gone pod's id must be known

    def read(self) -> Publication:
        now = self.clock()
        forgotten = now - dt.timedelta(seconds=self.remember_seconds)
        c = committed_pods.c
        with self.db.read() as conn:
            rows = conn.execute(select(committed_pods).where(c.gone_at.is_(None) | (c.gone_at >= forgotten))
                                .order_by(c.namespace, c.name, c.uid)).all()
            beat = conn.execute(
                select(commitment_publications).where(commitment_publications.c.name == PUBLICATION)
            ).first()
        return Publication(
            now,
            beat.publisher if beat else None,
            beat.published_at if beat else None,
            bool(beat and beat.healthy),
            beat.confirmed_at if beat else None,
            tuple(_pod(row) for row in rows if row.gone_at is None),
            tuple((row.admission_id, row.seen_at, row.gone_at) for row in rows if row.admission_id),
            self.remember_seconds,
        )

    def problem(self) -> str | None:
        return self.read().problem()

    def by_namespace(self) -> dict[str, NamespaceCommitments] | None:
        return self.read().by_namespace()

    def counted_ids(self) -> frozenset[str]:
        return self.read().counted_ids()

    def settled_ids(self) -> frozenset[str]:
        return self.read().settled_ids()

    def admitted_as(self, admission_id: str) -> str | None:
        return self.read().admitted_as(admission_id)


def _pod(row: Any) -> CommittedPod:
    return CommittedPod(row.namespace, row.share, row.weight, row.deadline_seconds, row.started_at, row.admission_id,
                        row.name, row.uid)


def by_uid(pods: Iterable[CommittedPod]) -> dict[str, CommittedPod]:
    """The informer's committed pods (its items' values) by uid, as publish() takes them."""
    return {pod.uid: pod for pod in pods if pod.uid}
