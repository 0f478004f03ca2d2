"""Statements of closed billing periods (docs/audit.md): which period is stated next, when its statement is due, what
it says, and the price a charged row is signed with. Plain functions; the rows are read and the statements written by
timekeeper.database.chargeback.statements, on the controller's `statements` task.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gpusharing.statements.leaves import Price
from gpusharing.statements.merkle import EMPTY_ROOT
from gpusharing.statements.note import Signer
from gpusharing.statements.statement import StatedPeriod, Statement
from timekeeper.chargeback.calendar import BillingCalendar
from timekeeper.chargeback.focus import cost_at, price_units, unit_price
from timekeeper.chargeback.prices import GpuPrice

# A period is stated this long after it closed: a charge decided just before the close (booked in it) has committed by
# then, in any replica, so that no row is added to a period after its statement.
SETTLE = dt.timedelta(minutes=1)


@dataclass(frozen=True)
class SigningKeys:
    """The key statements are signed with (TIMEKEEPER_STATEMENT_KEY_FILE), and the one it replaces while the chain
    still names that one (TIMEKEEPER_STATEMENT_PREVIOUS_KEY_FILE)."""

    current: Signer
    previous: Signer | None = None


@dataclass(frozen=True)
class ChainHead:
    """The last statement written: what the next one follows."""

    sequence: int
    note_hash: bytes
    signer: str  # the verifier key in force after it
    period_end: dt.datetime | None  # the end of the last period stated; None: none yet


def next_period(calendar: BillingCalendar, stated_until: dt.datetime | None,
                first_hour: dt.datetime | None) -> StatedPeriod | None:
    """The period stated next: from the end of the last one stated, else the period of the ledger's first hour; None
    while the ledger is empty. A period begun under another calendar is stated up to the end of the current one's."""
    start = stated_until if stated_until is not None else (
        calendar.period_of(first_hour).start if first_hour is not None else None)
    if start is None:
        return None
    end = calendar.period_of(start).end
    assert end is not None  # every billing period ends
    return StatedPeriod(calendar.period.value, start, end)


def is_due(calendar: BillingCalendar, period: StatedPeriod, now: dt.datetime,
           capacity_counted_until: dt.datetime | None) -> bool:
    """Whether `period` can be stated at `now`: closed and settled, and every GPU node's capacity counted past its end
    (None: no node is counted)."""
    settled = now >= period.end + calendar.grace + SETTLE
    return settled and (capacity_counted_until is None or capacity_counted_until >= period.end)


def period_statement(origin: str, head: ChainHead | None, period: StatedPeriod, size: int, root: bytes) -> Statement:
    return Statement(origin, _sequence(head), None if head is None else head.note_hash, size, root, period=period)


def handover_statement(origin: str, head: ChainHead | None, key: str) -> Statement:
    """The statement that hands the chain over to the verifier key `key`, signed by the key in force and by it."""
    return Statement(origin, _sequence(head), None if head is None else head.note_hash, 0, EMPTY_ROOT, key=key)


@dataclass(frozen=True)
class SignedPrice:
    """A model's price in force in an hour, as statements sign it: made once per model and hour, each charged row
    costed from it (a million rows a month)."""

    currency: str | None
    list_per_gpu_hour: str
    contracted_per_gpu_hour: str
    list_units: int  # millionths
    contracted_units: int

    def of(self, micro_gpu_seconds: int) -> Price:
        """A charged row's price, and its cost, as the export writes them."""
        return Price(self.currency, self.list_per_gpu_hour, self.contracted_per_gpu_hour,
                     cost_at(micro_gpu_seconds, self.list_units), cost_at(micro_gpu_seconds, self.contracted_units))


def signed_price(currency: str | None, price: GpuPrice | None) -> SignedPrice | None:
    """None where no price was in force."""
    if price is None:
        return None
    listed, contracted = price.list_per_gpu_hour, price.contracted_per_gpu_hour
    return SignedPrice(currency, unit_price(listed), unit_price(contracted), price_units(listed),
                       price_units(contracted))


def _sequence(head: ChainHead | None) -> int:
    return 1 if head is None else head.sequence + 1
