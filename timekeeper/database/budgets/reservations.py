"""Safe admission's reservations: a pod being admitted holds its commitment against every budget on its namespace's
path to the root, atomically across the webhook's processes and the timekeeper's.

A reservation is keyed by its AdmissionReview's uid (gpusharing.io/admission-id on the pod). It counts until the
controller publishes a pod carrying that id (the pod's own commitment counts then), or until it lapses `seconds`
after it was made: the API server stores a pod within its webhooks' timeouts of admitting it, or never, so a review
that never became a pod holds nothing for long. The path's budget rows are locked while a reservation is weighed, so
sibling namespaces' pods are weighed one after the other, overrunning a parent by at most what is used between two
meter reports.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from sqlalchemy import Connection, select, text

from timekeeper.budgets.commitments import NamespaceCommitments, Uncommitted, held_below, tightest
from timekeeper.budgets.hierarchy import ancestry
from timekeeper.budgets.requests import Reservation
from timekeeper.database.budgets.reads import ALL_BUDGETS, budget_of_row
from timekeeper.database.budgets.store import BudgetStore
from timekeeper.database.tables import budgets, reservations


class AdmissionIdTaken(RuntimeError):
    """The pod carries the admission id of another pod (one the watch holds)."""


class Uncountable(RuntimeError):
    """What the pods commit is not known now (the pod watch has not listed them, or has failed): the message says
    why."""


@dataclass(frozen=True)
class Grant:
    granted: bool
    uncommitted: Uncommitted | None  # before this pod, of the tightest budget on the path; None: none has a limit


class ReservationStore:
    def __init__(self, store: BudgetStore, seconds: float):
        self.store = store
        self.seconds = seconds

    def reserve(self, asked: Reservation, committed: Mapping[str, NamespaceCommitments], counted: AbstractSet[str],
                admitted_as: Callable[[str], str | None], settled: AbstractSet[str] = frozenset()) -> Grant:
        """Holds the pod's commitment if every budget on its path has it left uncommitted (`committed`: what the
        watched pods commit by namespace; `counted`: the admission ids of the pods the watch has brought, whose
        reservations no longer count; `admitted_as`: the pod the watch holds with an admission id, if any;
        `settled`: ids every timekeeper whose watch is not stale has brought too, whose reservations go).

        The reservation replaces the pod's earlier one (`asked.replaces`, a reinvoked webhook's), never another
        pod's: AdmissionIdTaken when the watch holds a pod with that id.
        """
        if asked.replaces is not None and (pod := admitted_as(asked.replaces)) is not None:
            raise AdmissionIdTaken(
                f"the pod carries gpusharing.io/admission-id {asked.replaces!r}, the admission of pod {pod}: "
                "remove the annotation (the GPU-sharing webhook sets it)"
            )
        db, now = self.store.db, self.store.clock()
        mine = frozenset({asked.id, *([asked.replaces] if asked.replaces else [])})
        with db.write() as conn:
            hierarchy = {row.namespace: budget_of_row(row) for row in conn.execute(ALL_BUDGETS)}
            if not db.is_sqlite:  # SQLite's writes are serialized already
                # A reservation outlives no crash of the timekeeper's anyway: its commit need not wait for the disk.
                conn.execute(text("SET LOCAL synchronous_commit TO OFF"))
                path = sorted({asked.namespace, *ancestry(hierarchy, asked.namespace)})
                conn.execute(
                    select(budgets.c.namespace)
                    .where(budgets.c.namespace.in_(path))
                    .order_by(budgets.c.namespace)
                    .with_for_update()
                )
            conn.execute(
                reservations.delete().where((reservations.c.expires_at <= now) | reservations.c.id.in_(sorted(settled)))
            )
            held = _held(conn, counted | mine, now)
            status = self.store.statuses_in(conn, [asked.namespace], now)[asked.namespace]
            own = {ns: c.micro_gpu_seconds for ns, c in committed.items()}
            least = tightest(status, held_below(hierarchy, own), held_below(hierarchy, held))
            granted = least is None or asked.micro_gpu_seconds <= least.micro_gpu_seconds
            if granted and least is not None and not asked.dry_run:
                conn.execute(reservations.delete().where(reservations.c.id.in_(sorted(mine))))
                conn.execute(reservations.insert().values(
                    id=asked.id, namespace=asked.namespace, micro_gpu_seconds=asked.micro_gpu_seconds,
                    expires_at=now + dt.timedelta(seconds=self.seconds)))
        return Grant(granted, least)

    def held(self, counted: AbstractSet[str]) -> dict[str, int]:
        """What the live reservations hold, by namespace, but those whose pods the watch has brought (`counted`)."""
        with self.store.db.read() as conn:
            return _held(conn, counted, self.store.clock())


def _held(conn: Connection, excluded: AbstractSet[str], now: dt.datetime) -> dict[str, int]:
    held: dict[str, int] = defaultdict(int)
    live = select(reservations.c.id, reservations.c.namespace, reservations.c.micro_gpu_seconds).where(
        reservations.c.expires_at > now
    )
    for row in conn.execute(live):
        if row.id not in excluded:
            held[row.namespace] += row.micro_gpu_seconds
    return held
