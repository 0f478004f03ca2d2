"""Which budget listing each webhook process holds in force, so that a crossing's evictions wait until every webhook
knows of it.

Each webhook process names itself when it polls and says which listing it holds (the `listedAt` of its last one, the
database's time); a process is live for a few of its poll intervals after its last poll. The controller evicts only
once every live one holds a listing read after it saw the new state, so that the replacements are admitted under it:
docs/design/controller.md, "Webhook acknowledgements".
"""

from __future__ import annotations

import math
import re

from sqlalchemy import func, select

from gpusharing.contract import DEFAULT_BUDGET_REFRESH_SECONDS, MAX_BUDGET_REFRESH_SECONDS, MIN_BUDGET_REFRESH_SECONDS
from timekeeper.database.connection import Database
from timekeeper.database.tables import webhook_listings

LIVE_POLLS = 3  # a webhook process is live this many of its poll intervals after its last poll
LIVE_SLACK_SECONDS = 5.0  # and this much more, for a slow answer
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}")


class ListingQueryError(ValueError):
    """400: the webhook's poll names itself, or its listing, wrongly."""


class WebhookListings:
    """The webhook processes' polls, as they said what they hold in force."""

    def __init__(self, db: Database):
        self.db = db

    def poll(self, webhook: str | None, in_force: str | None, refresh: str | None) -> float:
        """Records what the polling webhook holds in force (when it names itself); the database's time, which the
        listing about to be read is stamped with (`listedAt`)."""
        if webhook is None:
            return self.now()
        clock = self.db.clock()
        if not _NAME.fullmatch(webhook):
            raise ListingQueryError("webhook must be 1 to 253 letters, digits and . _ : - (the webhook process's name)")
        held = _number("inForce", in_force or "0", 0.0, 1e12)
        every = _number("refreshSeconds", refresh or str(DEFAULT_BUDGET_REFRESH_SECONDS), MIN_BUDGET_REFRESH_SECONDS,
                        MAX_BUDGET_REFRESH_SECONDS)
        values = {"in_force_at": held, "expires_at": clock + LIVE_POLLS * every + LIVE_SLACK_SECONDS}
        with self.db.write() as conn:
            conn.execute(self.db.insert(webhook_listings).values(webhook=webhook, **values)
                         .on_conflict_do_update(index_elements=["webhook"], set_=values))
            conn.execute(
                webhook_listings.delete().where(webhook_listings.c.expires_at < clock - MAX_BUDGET_REFRESH_SECONDS)
            )
            return float(conn.execute(select(clock)).scalar_one())

    def behind(self, since: float) -> int:
        """How many live webhook processes hold a listing read before `since` (the database's time)."""
        with self.db.read() as conn:
            query = select(func.count()).select_from(webhook_listings).where(
                (webhook_listings.c.expires_at > self.db.clock()) & (webhook_listings.c.in_force_at < since))
            return int(conn.execute(query).scalar_one())

    def live(self) -> int:
        """How many webhook processes are live (each shares the burst guard's room, docs/fair-share.md)."""
        with self.db.read() as conn:
            query = (
                select(func.count())
                .select_from(webhook_listings)
                .where(webhook_listings.c.expires_at > self.db.clock())
            )
            return int(conn.execute(query).scalar_one())

    def now(self) -> float:
        return self.db.now().timestamp()


def _number(name: str, raw: str, low: float, high: float) -> float:
    try:
        value = float(raw[:32])
    except ValueError:
        value = math.nan
    if not low <= value <= high:  # NaN too
        raise ListingQueryError(f"{name} must be a number from {low:g} to {high:g}")
    return value
