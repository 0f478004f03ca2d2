"""Idle streaks in the database (the SQL side of gpusharing.idle.verdict): the pods' streaks read, each streak's
warning and action claimed once across processes, the owners held out of budget, and the idle GPU time per
namespace. The streaks themselves are kept by the report path (timekeeper.database.accounting.pods)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import and_, func, or_, select, update

from gpusharing.kube.owners import Owner
from gpusharing.listing import IdleHold
from timekeeper.budgets.periods import iso_utc
from timekeeper.database.accounting.pods import PodRecord
from timekeeper.database.connection import Database
from timekeeper.database.tables import idle_holds, pod_ledgers, pod_usage

Step = Literal["idle_warned_at", "idle_acted_at"]
BATCH = 500


@dataclass(frozen=True)
class Hold:
    """An owner whose idle pod was evicted: its next pods are admitted out of budget until one uses its GPU."""

    namespace: str
    owner: Owner
    pod: str  # the pod evicted
    held_at: dt.datetime

    def listed(self) -> IdleHold:
        """The hold as the budget listing carries it (gpusharing.listing), for the webhook and `gpusharing explain`."""
        return IdleHold(self.owner.kind, self.owner.name, self.owner.uid, self.pod, iso_utc(self.held_at))


@dataclass(frozen=True)
class IdleUse:
    """A namespace's idle GPU time per UTC day: raw (share × time × (1 − utilisation)) and weighted (its cost)."""

    micro_gpu_seconds: dict[dt.date, int]
    weighted_micro_gpu_seconds: dict[dt.date, int]

    def between(self, first: dt.date, end: dt.date | None) -> tuple[int, int]:
        """(raw, weighted) idle micro-GPU-seconds of the days from `first` to `end` (not counted; None: no end)."""
        days = [day for day in self.micro_gpu_seconds if day >= first and (end is None or day < end)]
        return sum(self.micro_gpu_seconds[d] for d in days), sum(self.weighted_micro_gpu_seconds[d] for d in days)


class IdleLedger:
    def __init__(self, db: Database):
        self.db = db

    def pods(self, pod_uids: Collection[str]) -> dict[str, PodRecord]:
        """The ledgers of these pods (the watch's running pods), with their streaks and their meters' last word."""
        found: dict[str, PodRecord] = {}
        uids = sorted(pod_uids)
        with self.db.read() as conn:
            for start in range(0, len(uids), BATCH):
                query = select(pod_ledgers).where(pod_ledgers.c.pod_uid.in_(uids[start:start + BATCH]))
                found.update((row.pod_uid, PodRecord(**row._mapping)) for row in conn.execute(query))
        return found

    def claim(self, pod_uid: str, since: dt.datetime, step: Step, now: dt.datetime) -> bool:
        """Records that this streak's warning (or action) is being taken; False when another process took it, or the
        streak ended meanwhile (a busy report): then nothing is to be done."""
        column = pod_ledgers.c[step]
        with self.db.write() as conn:
            done = conn.execute(
                update(pod_ledgers)
                .where(pod_ledgers.c.pod_uid == pod_uid, pod_ledgers.c.idle_since == since, column.is_(None))
                .values({step: now})
            )
        return done.rowcount == 1

    def release(self, pod_uid: str, since: dt.datetime, step: Step) -> None:
        """Gives back a claim that could not be carried out (the API server unreachable, an eviction refused)."""
        with self.db.write() as conn:
            conn.execute(update(pod_ledgers).where(pod_ledgers.c.pod_uid == pod_uid, pod_ledgers.c.idle_since == since)
                         .values({step: None}))

    # -- owners held out of budget -------------------------------------------------------------------------------

    def hold(self, namespace: str, owner: Owner, pod: str, now: dt.datetime) -> Hold:
        values = {
            "namespace": namespace,
            "owner_kind": owner.kind,
            "owner_name": owner.name,
            "pod": pod,
            "held_at": now,
        }
        with self.db.write() as conn:
            conn.execute(self.db.insert(idle_holds).values(owner_uid=owner.uid, **values)
                         .on_conflict_do_update(index_elements=[idle_holds.c.owner_uid], set_=values))
        return Hold(namespace, owner, pod, now)

    def holds(self) -> list[Hold]:
        with self.db.read() as conn:
            rows = conn.execute(select(idle_holds).order_by(idle_holds.c.namespace, idle_holds.c.owner_uid)).all()
        return [
            Hold(row.namespace, Owner("", row.owner_kind, row.owner_name, row.owner_uid), row.pod, row.held_at)
            for row in rows
        ]

    def release_holds(self, owner_uids: Iterable[str]) -> None:
        uids = sorted(set(owner_uids))
        if uids:
            with self.db.write() as conn:
                conn.execute(idle_holds.delete().where(idle_holds.c.owner_uid.in_(uids)))

    # -- what the metrics and the budgets' status show --------------------------------------------------------------

    def idle_use(self, first_day: dt.date) -> dict[str, IdleUse]:
        """Each namespace's idle GPU time per day since `first_day` (a handful of rows per namespace and day)."""
        day = pod_usage.c.day
        query = (select(pod_ledgers.c.namespace, day, func.sum(pod_usage.c.idle_micro_gpu_seconds),
                        func.sum(pod_usage.c.idle_weighted_micro_gpu_seconds))
                 .select_from(pod_usage.join(pod_ledgers, pod_ledgers.c.pod_uid == pod_usage.c.pod_uid))
                 .where(day >= first_day).group_by(pod_ledgers.c.namespace, day))
        raw: dict[str, dict[dt.date, int]] = defaultdict(dict)
        weighted: dict[str, dict[dt.date, int]] = defaultdict(dict)
        with self.db.read() as conn:
            for namespace, on, idle, cost in conn.execute(query):
                raw[namespace][on], weighted[namespace][on] = int(idle or 0), int(cost or 0)
        return {namespace: IdleUse(raw[namespace], weighted[namespace]) for namespace in raw}

    def idle_now(self, now: dt.datetime, fresh_seconds: float) -> dict[str, tuple[int, int]]:
        """Per namespace: (pods idle now, of them warned or acted on): running pods whose latest reading, while fresh
        (until its own freshness, else a meter's `fresh_seconds`), continued an idle streak."""
        fresh = or_(pod_ledgers.c.utilisation_fresh_until >= now, and_(
            pod_ledgers.c.utilisation_fresh_until.is_(None),
            pod_ledgers.c.utilisation_at >= now - dt.timedelta(seconds=fresh_seconds)))
        query = select(pod_ledgers.c.namespace, pod_ledgers.c.idle_warned_at, pod_ledgers.c.idle_acted_at).where(
            pod_ledgers.c.ended_at.is_(None), pod_ledgers.c.idle_since.is_not(None), fresh)
        counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        with self.db.read() as conn:
            for namespace, warned_at, acted_at in conn.execute(query):
                counts[namespace][0] += 1
                counts[namespace][1] += warned_at is not None or acted_at is not None
        return {namespace: (idle, warned) for namespace, (idle, warned) in counts.items()}


def holds_by_namespace(holds: Iterable[Hold]) -> Mapping[str, list[Hold]]:
    grouped: dict[str, list[Hold]] = defaultdict(list)
    for hold in holds:
        grouped[hold.namespace].append(hold)
    return grouped
